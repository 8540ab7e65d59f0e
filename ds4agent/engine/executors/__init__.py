"""Executors: how a kernel set runs a layer (model.run_layers asks one for each sublayer: the
reference and GPU executors run the shared plan of layers.py as MLX graphs, the fast CPU executor
its own plan on host arrays, fast_layers.py).

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
