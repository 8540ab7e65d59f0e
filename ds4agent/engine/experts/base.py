"""The routed-expert interface and the choice of backend.

    ExpertWeights                       what model.py multiplies: gather_matmul(x, expert_ids)
    dense_experts(w)                    float weights -> DenseExperts
    quant_experts(raw, qtype, shape)    raw GGUF blocks -> the GPU kernels (gpu.py) where MLX has
                                        a Metal or CUDA GPU and they pass their self-check, else
                                        QuantExperts; backend="fast": FastExperts (the fast CPU set)

The backends live in portable.py (MLX; its QuantExperts runs the CPU kernels of cpu.py on a CPU),
gpu.py and fast.py (8-bit activations, integer dot products: qmatrix.py); they satisfy the
protocol structurally and never import this module.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx
import numpy as np

from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts import gpu
from ds4agent.engine.experts.fast import FastExperts
from ds4agent.engine.experts.portable import DenseExperts, QuantExperts, resident_blocks


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


def quant_experts(raw: Any, qtype: int, shape: Any, *, backend: str = "auto",
                  shared: dict[tuple[int, int], mx.array] | None = None) -> ExpertWeights:
    """The backend for raw expert blocks: the GPU kernels where MLX has a Metal or CUDA GPU
    (IQ2_XXS, Q2_K, Q4_K), else the portable MLX backend. backend: "auto" | "portable" | "gpu" |
    "fast" (the fast CPU kernel set's backend, experts/fast.py: blocks read in place from the map).

    shared: the loader's device copies of blocks already made, by (address, size) of the mapped
    bytes. A backend that keeps its blocks resident reuses the copy of the same bytes instead
    of making another: a real file has one region per tensor, but the Flash-shape test file
    points every layer's expert tensors at one region per tensor kind, and a copy per tensor
    would hold 72 GiB for its 1.7 GiB of distinct blocks (the memory plan counts distinct bytes).
    """
    if backend not in ("auto", "portable", "gpu", "fast"):
        raise EngineError(f"unknown expert backend {backend!r}")
    if backend == "fast":
        return FastExperts(raw, qtype, shape)
    where = gpu.available_backend()
    want_gpu = backend == "gpu" or (backend == "auto" and qtype in gpu.GPU_TYPES and where is not None)
    cls: type[QuantExperts] = QuantExperts
    if want_gpu:
        problem = None if backend == "gpu" else gpu.self_check(qtype, where or "")
        if problem is None:
            cls = gpu.GpuExperts
        else:
            # Robust choice: a kernel that fails its one-time check must not take the engine
            # down; the portable backend computes the same values (slower).
            warnings.warn(f"{problem}; using the portable MLX expert backend", RuntimeWarning, stacklevel=2)
    if shared is not None and isinstance(raw, np.ndarray) and cls.keeps_resident():
        key = (int(raw.__array_interface__["data"][0]), int(raw.nbytes))
        if key not in shared:
            shared[key] = resident_blocks(raw)
        raw = shared[key]
    return cls(raw, qtype, shape)

