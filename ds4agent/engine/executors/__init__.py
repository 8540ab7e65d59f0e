"""Executors: how a kernel set builds a layer's graph (model.py runs the shared layer plan of
layers.py through one of them).

    reference.py   ReferenceExecutor: the exact float32 path (the oracle)
    fast_cpu.py    FastCpuExecutor: the fast CPU kernel set (8-bit activations, integer dots)
    gpu.py         GpuExecutor: MLX's native, fused kernels (the GPU kernel set)

`executor_for(kernels)` maps a kernel set name (device.KERNEL_SETS; the weights carry theirs) to
its executor. Executors hold no per-model state: what they cache lives on the weights.
"""

from __future__ import annotations

from ..errors import EngineError
from .fast_cpu import FastCpuExecutor
from .gpu import GpuExecutor
from .reference import ReferenceExecutor

EXECUTORS: dict[str, ReferenceExecutor] = {
    "reference": ReferenceExecutor(),
    "cpu": FastCpuExecutor(),
    "gpu": GpuExecutor(),
}


def executor_for(kernels: str) -> ReferenceExecutor:
    try:
        return EXECUTORS[kernels]
    except KeyError:
        raise EngineError(f"unknown kernel set {kernels!r}") from None
