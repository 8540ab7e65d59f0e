"""The routed-expert interface and the choice of backend.

    ExpertWeights                       what model.py multiplies: gather_matmul(x, expert_ids)
    dense_experts(w)                    float weights -> DenseExperts
    quant_experts(raw, qtype, shape)    raw GGUF blocks -> Metal kernels where a Metal device
                                        exists and passes its self-check, else QuantExperts

The backends live in portable.py (MLX; its QuantExperts runs the CPU kernels of cpu.py on a CPU)
and metal.py; they satisfy the protocol structurally and never import this module.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx
import numpy as np

from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts import metal
from ds4agent.engine.experts.portable import DenseExperts, QuantExperts


@runtime_checkable
class ExpertWeights(Protocol):
    n_experts: int
    d_in: int
    d_out: int

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        """x [N, d_in] (or [N, k, d_in]: one input per slot) float32, expert_ids [N, k] int
        -> [N, k, d_out] float32 (row n, slot j = W[expert_ids[n, j]] @ x[n] (or x[n, j]))."""
        ...


def dense_experts(w: Any) -> ExpertWeights:
    """w [n_experts, d_out, d_in] (f32/f16, an MLX or numpy array) -> the dense backend."""
    return DenseExperts(w if isinstance(w, mx.array) else mx.array(np.asarray(w)))


def quant_experts(raw: Any, qtype: int, shape: Any, *, backend: str = "auto") -> ExpertWeights:
    """The backend for raw expert blocks: Metal kernels where a Metal device exists (IQ2_XXS,
    Q2_K, Q4_K), else the portable MLX backend. backend: "auto" | "portable" | "metal"."""
    if backend not in ("auto", "portable", "metal"):
        raise EngineError(f"unknown expert backend {backend!r}")
    want_metal = backend == "metal" or (
        backend == "auto" and qtype in metal.METAL_TYPES and metal_available()
    )
    if want_metal:
        if backend == "metal":
            return metal.MetalExperts(raw, qtype, shape)
        problem = metal.self_check(qtype)
        if problem is None:
            return metal.MetalExperts(raw, qtype, shape)
        # Robust choice: a kernel that fails its one-time check must not take the engine down;
        # the portable backend computes the same values (slower).
        warnings.warn(f"{problem}; using the portable MLX expert backend", RuntimeWarning, stacklevel=2)
    return QuantExperts(raw, qtype, shape)


def metal_available() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:  # an MLX build without the metal module
        return False
