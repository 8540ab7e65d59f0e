"""Which device the engine computes on: the GPU when MLX has one (Metal on Apple Silicon, CUDA
through MLX's CUDA build on Linux), else the CPU; `--device cpu|gpu` overrides.

The choice is made once, at the top of loader.load_engine, because the weights' layout follows the
default device (cpu_layout below). Asking for a GPU that is not there is never a crash: the
engine runs on the CPU and says so in one line (the CUDA extra on a machine without a usable
NVIDIA GPU lands here too).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from .errors import EngineError

CHOICES = ("cpu", "gpu")
KERNEL_SETS = ("reference", "cpu", "gpu")
# Diagnostic switch: which kernel set graphs are built from, whatever the device (CI runs the GPU
# kernel set on the CPU device to check its agreement with the reference without a GPU).
KERNELS_ENV = "DS4AGENT_KERNELS"
# MLX runs float32 matrix products in TF32 (a 10-bit mantissa, ~1e-3 relative per product) on
# CUDA GPUs and Apple's M5 unless this is 0. The GPU kernel set's contract is float32 agreement
# with the reference (docs/architecture.md, numerics per device): under TF32 the first H200 run
# was at 0.65 of the logit bound on `tiny` and flipped router near-ties on `small`. MLX reads the
# switch once per process (a static in mlx/utils.h), at its first float32 product on the GPU: it
# is set here, when the loader is imported, so that no product can come first, and use_device
# takes it out of the environment again once MLX has read it, so that the programs the agent
# starts (a user's own MLX code among them) get MLX's default. A value the user set is theirs:
# kept, in this process and its children.
TF32_ENV = "MLX_ENABLE_TF32"
_TF32_SET_HERE = TF32_ENV not in os.environ
os.environ.setdefault(TF32_ENV, "0")
# The distributions of MLX's CUDA build (what `pip install 'ds4agent[cuda]'` brings in).
_CUDA_DISTRIBUTIONS = ("mlx-cuda-12", "mlx-cuda-13", "mlx-cuda")


@dataclass(frozen=True)
class Device:
    kind: str  # "gpu" | "cpu"
    label: str  # what the status line and `info` show: "Metal GPU", "CUDA GPU", "CPU"
    notice: str = ""  # one line when the engine cannot run where it was asked to (or expected)


def _available(backend: str) -> bool:
    module = getattr(mx, backend, None)  # an MLX build may lack the module altogether
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # a broken driver is "no GPU", not a crash
        return False


def gpu_backend() -> str | None:
    """"Metal" or "CUDA" when MLX can use a GPU here, else None."""
    if _available("metal"):
        return "Metal"
    if _available("cuda"):
        return "CUDA"
    return None


def cuda_build_installed() -> bool:
    for name in _CUDA_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def choose_device(requested: str | None = None) -> Device:
    """The device for `requested` ("cpu", "gpu", or None for the best one present)."""
    if requested is not None and requested not in CHOICES:
        raise EngineError(f"--device must be cpu or gpu, not {requested!r}")
    if requested == "cpu":
        return Device("cpu", "CPU")
    backend = gpu_backend()
    if backend is not None:
        return Device("gpu", f"{backend} GPU")
    if requested == "gpu":
        return Device("cpu", "CPU", "--device gpu: MLX finds no usable GPU here (no Metal, no CUDA); "
                      "running on the CPU")
    if cuda_build_installed():
        return Device("cpu", "CPU", "MLX's CUDA build is installed but finds no usable NVIDIA GPU; "
                      "running on the CPU")
    return Device("cpu", "CPU")


def kernel_set(kind: str | None = None) -> str:
    """"reference", "cpu" or "gpu": the kernel set the engine builds its graphs from (on the
    MLX default device; `kind` "cpu" / "gpu": on a Device of that kind, before it is used).

    reference: the bit-exact CPU path (in-order f32 sums, float64 norm accumulation, host-side
    expert kernels that read the selected ids): the oracle, chunk-invariance and exact-resume
    tests run on it (executors/reference.py). cpu: the fast CPU set, the default on the CPU
    device: every matrix product on compiled kernels that round activations to 8 bits per block
    and sum integers, on all cores, a prefill chunk's tokens per weight read (executors/fast_cpu.py,
    qmatrix.py; its contract: docs/numerics-fast-cpu.md). gpu: MLX's native kernels (mx.fast norms, F16 matrices
    as F16, fused elementwise chains, routed experts resident on the device and selected by
    device ids, no device->host read inside a decoded token); the default on a GPU, agreeing with
    the reference within the stated tolerances (tests/engine/test_gpu_kernels.py).
    `DS4AGENT_KERNELS=reference|cpu|gpu` overrides the choice (a diagnostic switch).

    Read once when weights are built: they take their stored form from it and carry it
    (ModelWeights.kernels), and graphs are built by that set's executor. Set it before loading.
    """
    forced = os.environ.get(KERNELS_ENV, "").strip().lower()
    if forced:
        if forced not in KERNEL_SETS:
            raise EngineError(f"{KERNELS_ENV} must be one of {', '.join(KERNEL_SETS)}, not {forced!r}")
        return forced
    if kind is not None:
        return "cpu" if kind == "cpu" else "gpu"
    return "cpu" if mx.default_device() == mx.cpu else "gpu"


@contextlib.contextmanager
def forced_kernel_set(name: str) -> Iterator[None]:
    """Run a block with KERNELS_ENV set to `name` (one of KERNEL_SETS) and put the caller's value
    back after it: how benchmarks and tests build one engine on each kernel set in one process."""
    old = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = old


def gpu_kernels() -> bool:
    """Whether graphs are built from the GPU kernel set (see kernel_set)."""
    return kernel_set() == "gpu"


def use_device(requested: str | None = None) -> Device:
    """Choose the device and make it MLX's default for the arrays that follow."""
    kernel_set()  # a bad DS4AGENT_KERNELS is refused here, before anything is loaded
    device = choose_device(requested)
    mx.set_default_device(mx.gpu if device.kind == "gpu" else mx.cpu)
    _settle_tf32(device.kind)
    return device


def _settle_tf32(kind: str) -> None:
    """Have MLX read TF32_ENV now (a float32 product of a size MLX hands to its GEMM on the GPU;
    its matrix-vector kernels do not ask), then take the engine's value out of the environment
    (see TF32_ENV)."""
    if kind == "gpu":
        a = mx.ones((64, 64), dtype=mx.float32)
        mx.eval(a @ a)
    if _TF32_SET_HERE:
        os.environ.pop(TF32_ENV, None)


def current_device() -> Device:
    """The device MLX computes on now (for an engine built without load_engine)."""
    if mx.default_device() == mx.cpu:
        return Device("cpu", "CPU")
    return Device("gpu", f"{gpu_backend() or 'unknown'} GPU")


# ---- the CPU facts the weights and the expert kernels follow ----------------------------------

_MAX_PARTS = 8
# ThreadLocalStream objects: every thread that drives the engine gets its own CPU streams (safe
# when two threads run sessions at once). MLX keeps a stream's worker thread for the life of the
# process, as it does every thread's default stream, so drive the engine from long-lived threads
# (the agent has one worker), not a fresh thread per call.
_STREAMS: list = []


def cpu_layout() -> bool:
    """Whether dense weights take the CPU layout (transposed, contiguous; see weights.Linear):
    the CPU kernel set's (the GPU kernel set keeps the GPU layout on any device)."""
    return not gpu_kernels()


@functools.cache
def cpu_parts() -> int:
    """How many parts a large CPU product is split into (1 = no splitting): CPU streams for a
    quantised weights.Linear, worker threads for the expert kernels and the fast CPU kernels.
    The CPU count, read once (products ask per call)."""
    return max(1, min(_MAX_PARTS, os.cpu_count() or 1))


def cpu_streams(k: int) -> list:
    """k CPU streams, each its own MLX worker thread (thread-local: valid on any calling thread)."""
    while len(_STREAMS) < k:
        _STREAMS.append(mx.new_thread_local_stream(mx.cpu))
    return _STREAMS[:k]
