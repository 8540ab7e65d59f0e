"""The routed-expert interface and the choice of backend.

    ExpertWeights                       what model.py multiplies: gather_matmul(x, expert_ids)
    dense_experts(w)                    float weights -> DenseExperts
    quant_experts(raw, qtype, shape)    raw GGUF blocks -> backend="fast": FastExperts (the fast
                                        CPU set, every blocked type); else MXFP4: MLX's own mxfp4
                                        kernels (mxfp4.py); the other types: the GPU kernels
                                        (gpu.py) where MLX has a Metal or CUDA GPU and they pass
                                        their self-check, else QuantExperts
    describe_experts(backends)          which backend runs, and why: "mxfp4 via MLX gather_qmm"
    planned_experts(type_names)         the same line before loading (info)

The backends live in portable.py (MLX; its QuantExperts runs the CPU kernels of cpu.py on a CPU),
gpu.py, fast.py (8-bit activations, integer dot products: qmatrix.py) and mxfp4.py; they satisfy
the protocol structurally and never import this module. Each says what it is with `describe()` ->
(weight type, how it multiplies).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.device import kernel_set
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts import gpu
from ds4agent.engine.experts.fast import FAST_HOW, FastExperts
from ds4agent.engine.experts.mxfp4 import Mxfp4Experts
from ds4agent.engine.experts.portable import DenseExperts, QuantExperts, quant_how, resident_blocks
from ds4agent.engine.gguf import GGML_TYPE_IDS


@runtime_checkable
class ExpertWeights(Protocol):
    n_experts: int
    d_in: int
    d_out: int

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        """x [N, d_in] (or [N, k, d_in]: one input per slot) float32, expert_ids [N, k] int
        -> [N, k, d_out] float32 (row n, slot j = W[expert_ids[n, j]] @ x[n] (or x[n, j]))."""
        ...

    def describe(self) -> tuple[str, str]:
        """(the weights' type, how they are multiplied and why that way), e.g.
        ("Q2_K", "fast CPU kernels") or ("Q4_K", "portable MLX (Metal kernels failed self-check: ...)")."""
        ...


def dense_experts(w: Any) -> ExpertWeights:
    """w [n_experts, d_out, d_in] (f32/f16, an MLX or numpy array) -> the dense backend."""
    return DenseExperts(w if isinstance(w, mx.array) else mx.array(np.asarray(w)))


def quant_experts(raw: Any, qtype: int, shape: Any, *, backend: str = "auto",
                  shared: dict[tuple[int, int], Any] | None = None) -> ExpertWeights:
    """The backend for raw expert blocks. backend "fast" (the fast CPU kernel set's backend,
    experts/fast.py): every type's blocks read in place from the map, MXFP4 included. Otherwise
    MXFP4 on MLX's own mxfp4 kernels (re-laid losslessly, every device: "portable" and "gpu" do
    not apply), and the other types on the GPU kernels where MLX has a Metal or CUDA GPU
    (IQ2_XXS, Q2_K, Q4_K), else the portable MLX backend. backend: "auto" | "portable" | "gpu" |
    "fast".

    shared: the loader's device copies of blocks already made, by (address, size) of the mapped
    bytes. A backend that keeps its blocks resident reuses the copy of the same bytes instead
    of making another: a real file has one region per tensor, but the Flash-shape test file
    points every layer's expert tensors at one region per tensor kind, and a copy per tensor
    would hold 72 GiB for its 1.7 GiB of distinct blocks (the memory plan counts distinct bytes).
    """
    if backend not in ("auto", "portable", "gpu", "fast"):
        raise EngineError(f"unknown expert backend {backend!r}")
    key = None
    if shared is not None and isinstance(raw, np.ndarray):
        key = (int(raw.__array_interface__["data"][0]), int(raw.nbytes))
    if backend == "fast":  # every blocked type, MXFP4 included, read in place from the map
        return FastExperts(raw, qtype, shape)
    if qtype == quant.MXFP4:
        # The re-laid arrays are the resident copy: tensors sharing one region share one backend.
        if shared is None or key is None:
            return Mxfp4Experts(raw, shape)
        if key not in shared:
            shared[key] = Mxfp4Experts(raw, shape)
        return shared[key]
    where = gpu.available_backend()
    want_gpu = backend == "gpu" or (backend == "auto" and qtype in gpu.GPU_TYPES and where is not None)
    cls: type[QuantExperts] = QuantExperts
    problem = None
    if want_gpu:
        problem = None if backend == "gpu" else gpu.self_check(qtype, where or "")
        if problem is None:
            cls = gpu.GpuExperts
        else:
            # Robust choice: a kernel that fails its one-time check must not take the engine
            # down; the portable backend computes the same values (slower).
            warnings.warn(f"{problem}; using the portable MLX expert backend", RuntimeWarning, stacklevel=2)
    if shared is not None and key is not None and cls.keeps_resident():
        if key not in shared:
            shared[key] = resident_blocks(raw)
        raw = shared[key]
    ex = cls(raw, qtype, shape)
    if problem is not None:
        ex.fallback = f"{gpu.LABELS.get(where or '', where)} kernels failed self-check: {problem}"
    return ex


def describe_experts(backends: Iterable[Any]) -> str:
    """One line naming the backends of the given expert tensors, types grouped by how they run:
    "IQ2_XXS/Q2_K fast CPU kernels", "mxfp4 via MLX gather_qmm" ("none" for no tensors)."""
    return _join(ex.describe() for ex in backends)


def planned_experts(type_names: Iterable[str], device_kind: str) -> str:
    """describe_experts' line for routed-expert tensors of these GGML types, before any is loaded
    (`ds4agent info`): the backend quant_experts would choose on a device of `device_kind`
    ("cpu" / "gpu") and its kernel set. Metal kernels are named as planned: their self-check
    runs at load."""
    kernels = kernel_set(device_kind)
    pairs = []
    for t in type_names:
        qtype = GGML_TYPE_IDS.get(t)
        if t in ("F16", "F32"):
            pairs.append(("dense float32", "via MLX gather_mm"))
        elif qtype == quant.MXFP4 and kernels == "cpu":
            pairs.append((t, FAST_HOW))
        elif qtype == quant.MXFP4:
            pairs.append(("mxfp4", "via MLX gather_qmm"))
        elif qtype in gpu.GPU_TYPES and device_kind == "gpu" and (where := gpu.available_backend()) is not None:
            pairs.append((t, f"{gpu.LABELS.get(where, where)} kernels (self-checked at load, portable MLX if "
                             "they fail)"))
        elif kernels == "cpu" and qtype in quant.EXPERT_TYPES:
            pairs.append((t, FAST_HOW))
        else:
            pairs.append((t, quant_how(kernels != "gpu")))
    return _join(pairs)


def _join(pairs: Iterable[tuple[str, str]]) -> str:
    by_how: dict[str, list[str]] = {}
    for what, how in pairs:
        kinds = by_how.setdefault(how, [])
        if what not in kinds:
            kinds.append(what)
    return "; ".join(f"{'/'.join(kinds)} {how}" for how, kinds in by_how.items()) or "none"

