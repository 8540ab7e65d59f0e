"""GPU kernels for routed experts in IQ2_XXS, Q2_K and Q4_K, on Metal (`mx.fast.metal_kernel`)
and CUDA (`mx.fast.cuda_kernel`): `GpuExperts`, chosen by experts/base.py where MLX has such a
GPU and the kernels pass their one-time self-check.

The kernel sources are files beside this module (experts/kernels/, package data), read at run
time: `blocks.h` decodes a chunk of 32 weights from raw GGUF blocks (shared by both languages),
`prelude.metal` / `prelude.cu` spell its few language-specific words, and each kernel is a
function body as MLX takes it (MLX writes the signature from the inputs, outputs and template
arguments):
  * `matvec` (decode, at most MATVEC_MAX_ROWS rows per call): one simdgroup / warp of 32 lanes
    per (output row, pair); lane l decodes chunks l, l+32, ... of the row in registers and dots
    them with the pair's input, and the 32 partial sums are reduced across the lanes. It reads
    each selected weight byte once and never writes a dequantised weight;
  * `dequant` (prefill): one thread per chunk writes float32 weights of a bounded tile of the
    selected experts, which `mx.gather_mm` then multiplies (a dequantised expert serves many rows).

`KernelCall` is the whole description of one launch (names, sources, template arguments, grid,
threadgroup, outputs): the backend hands it to MLX, and the emulation tests (tests/gpu/) wrap the
same sources the way MLX does and run them as C++ on the CPU, so what a GPU compiles is what the
tests check. The subset of Metal and CUDA the sources may use: docs/gpu-kernel-subset.md.

Exactness: `dequant` equals quant.py's dequantisation bit for bit (kernels/blocks.h says why);
`matvec` differs from dequantise-then-multiply only in the order of its float32 sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

import mlx.core as mx
import numpy as np

from ds4agent.engine import device, quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.portable import QuantExperts, check_call
from ds4agent.engine.hostread import to_host

GPU_TYPES = (quant.IQ2_XXS, quant.Q2_K, quant.Q4_K)
BACKENDS = ("metal", "cuda")
_SUFFIX = {"metal": "metal", "cuda": "cu"}
SIMD_WIDTH = 32  # lanes of an Apple simdgroup and of an NVIDIA warp
MATVEC_ROWS_PER_GROUP = 4  # simdgroups (output rows) per threadgroup of the decode kernel
DEQUANT_GROUP = 256  # threads per threadgroup of the prefill kernel

# Rows per call up to which the mat-vec kernel runs (it re-decodes an expert's blocks for every
# (row, slot) pair; above this, dequantising each selected expert once and multiplying wins).
# Decided from the call's shape alone, so the ids are never read back.
MATVEC_MAX_ROWS = 4


def kernel_source(name: str) -> str:
    """The text of one file of experts/kernels/ (package data: a wheel ships them)."""
    return resources.files("ds4agent.engine.experts").joinpath("kernels", name).read_text("utf-8")


LABELS = {"metal": "Metal", "cuda": "CUDA"}  # a backend's name as the status line and info say it


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch as MLX's custom-kernel API takes it (both languages take the same)."""

    backend: str  # "metal" | "cuda"
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    header: str
    source: str
    template: tuple[tuple[str, int], ...]
    grid: tuple[int, int, int]  # threads in all, per dimension (MLX's convention on both)
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]  # numpy dtype names


def _header(backend: str) -> str:
    return kernel_source(f"prelude.{_SUFFIX[backend]}") + "\n" + kernel_source("blocks.h")


def _template(qtype: int, d_in: int, d_out: int) -> tuple[tuple[str, int], ...]:
    return (("QTYPE", int(qtype)), ("D_IN", int(d_in)), ("D_OUT", int(d_out)),
            ("BLOCK_BYTES", quant.block_info(qtype)[1]))


def _check_shape(qtype: int, d_in: int, d_out: int) -> None:
    if qtype not in GPU_TYPES:
        raise EngineError(f"no GPU expert kernel for {quant.type_name(qtype)}")
    if d_in % quant.block_info(qtype)[0] or d_in <= 0 or d_out <= 0:
        raise EngineError(f"GPU expert kernels need d_in a multiple of 256 and d_out > 0, got {d_in}, {d_out}")


def matvec_call(backend: str, qtype: int, d_in: int, d_out: int, pairs: int) -> KernelCall:
    """The decode kernel over `pairs` (input row, expert) pairs: inputs w (raw blocks
    [E, d_out, row_bytes] uint8), x [pairs, d_in] float32, eids [pairs] uint32, grid (IQ2_XXS
    magnitudes [256*8] float32); output [pairs, d_out] float32."""
    _check_shape(qtype, d_in, d_out)
    return KernelCall(
        backend, f"ds4_matvec_{quant.type_name(qtype).lower()}", ("w", "x", "eids", "grid"), ("out",),
        _header(backend), kernel_source(f"matvec.{_SUFFIX[backend]}"), _template(qtype, d_in, d_out),
        (SIMD_WIDTH * d_out, pairs, 1), (SIMD_WIDTH * MATVEC_ROWS_PER_GROUP, 1, 1),
        ((pairs, d_out),), ("float32",),
    )


def dequant_call(backend: str, qtype: int, d_in: int, d_out: int, experts: int) -> KernelCall:
    """The prefill kernel over `experts` selected experts: inputs w, eids [experts] uint32,
    grid; output [experts, d_out, d_in] float32."""
    _check_shape(qtype, d_in, d_out)
    chunks = d_out * (d_in // 32)
    return KernelCall(
        backend, f"ds4_dequant_{quant.type_name(qtype).lower()}", ("w", "eids", "grid"), ("out",),
        _header(backend), kernel_source(f"dequant.{_SUFFIX[backend]}"), _template(qtype, d_in, d_out),
        (-(-chunks // DEQUANT_GROUP) * DEQUANT_GROUP, experts, 1), (DEQUANT_GROUP, 1, 1),
        ((experts, d_out, d_in),), ("float32",),
    )


def read_bytes(qtype: int, d_in: int, d_out: int, pairs: int) -> int:
    """Bytes the decode kernel reads from device memory for `pairs` pairs: each pair's expert
    rows once (every byte by one lane) and its input row (read by every row's simdgroup, from
    the cache after the first). The codebook (8 KiB, cached) is not counted. The model behind
    bench/device_bytes.py."""
    return pairs * (d_out * quant.row_bytes(qtype, d_in) + 4 * d_in) + 4 * pairs * d_out


@cache
def _compiled(backend: str, name: str, input_names: tuple[str, ...], output_names: tuple[str, ...],
              header: str, source: str):
    make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
    return make(name=name, input_names=list(input_names), output_names=list(output_names),
                source=source, header=header)


def run(call: KernelCall, inputs: list[mx.array]) -> list[mx.array]:
    """Launch `call` through MLX on the GPU (the kernel is compiled once per source)."""
    kernel = _compiled(call.backend, call.name, call.input_names, call.output_names, call.header, call.source)
    return kernel(inputs=inputs, template=list(call.template), grid=call.grid, threadgroup=call.threadgroup,
                  output_shapes=[list(s) for s in call.output_shapes],
                  output_dtypes=[getattr(mx, d) for d in call.output_dtypes])


@lru_cache(maxsize=1)
def _grid() -> mx.array:
    return mx.array(quant.iq2xxs_tables()[0].reshape(-1))


def available_backend() -> str | None:
    """"metal" or "cuda" where MLX computes on such a GPU here, else None."""
    name = device.gpu_backend()
    return name.lower() if name else None


@cache
def self_check(qtype: int, backend: str) -> str | None:
    """Run both kernels once on fixed random blocks against quant.py (the dequantiser bit for
    bit, the mat-vec within f32 tolerance). None if they agree, else a one-line reason. Cached:
    experts/base.py falls back to the portable backend rather than run a kernel that a driver or
    compiler version miscompiles."""
    label = f"{quant.type_name(qtype)} {'Metal' if backend == 'metal' else 'CUDA'}"
    try:
        rng = np.random.default_rng(12345)
        e, d_out, d_in = 2, 4, 512
        block, size, _ = quant.block_info(qtype)
        raw = rng.integers(0, 256, size=(e * d_out * d_in // block, size), dtype=np.uint8)
        for off in {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}[qtype]:
            raw[:, off : off + 2] = np.full((len(raw), 1), np.float16(0.01)).view(np.uint8)
        raw = raw.reshape(e, d_out, d_in // block * size)
        ex = GpuExperts(raw, qtype, (e, d_out, d_in), backend=backend)
        want = to_host(quant.dequantize(mx.array(raw), qtype, (e, d_out, d_in)))
        got = to_host(ex.dequantize([0, 1]))
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return f"the {label} dequantiser disagrees with the portable one"
        x = rng.standard_normal((1, d_in)).astype(np.float32)
        y = to_host(ex.matvec(mx.array(np.repeat(x, 2, 0)), mx.array([0, 1])))
        ref = np.einsum("eoi,i->eo", want.astype(np.float64), x[0].astype(np.float64))
        if not np.abs(y - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()):
            return f"the {label} mat-vec disagrees with the dense product"
    except Exception as err:  # compile or dispatch failure: report, never crash the engine
        return f"the {label} kernels failed: {err}"
    return None


class GpuExperts(QuantExperts):
    """Routed experts as raw blocks resident in GPU memory, multiplied by the kernels above."""

    def __init__(self, raw, qtype: int, shape, *, backend: str | None = None, **kw):
        backend = backend or available_backend()
        if backend not in BACKENDS:
            raise EngineError("the GPU expert kernels need a Metal or CUDA GPU (MLX finds neither)")
        if qtype not in GPU_TYPES:
            raise EngineError(f"no GPU expert kernel for {quant.type_name(qtype)}")
        super().__init__(raw, qtype, shape, **kw)
        self.backend = backend

    @classmethod
    def keeps_resident(cls) -> bool:
        # The kernels index the whole tensor by expert id: it must live in one MLX buffer.
        return True

    def dequantize(self, experts) -> mx.array:
        """float32 [len(experts), d_out, d_in]; `experts` a list/numpy array or device ids."""
        if isinstance(experts, mx.array):
            eids = experts.reshape(-1).astype(mx.uint32)
        else:
            eids = mx.array(np.asarray(experts, dtype=np.uint32).reshape(-1))
        call = dequant_call(self.backend, self.qtype, self.d_in, self.d_out, int(eids.size))
        return run(call, [self.raw, eids, _grid()])[0]

    def matvec(self, x: mx.array, eids: mx.array) -> mx.array:
        """x [P, d_in] float32, eids [P] -> [P, d_out]: row p = W[eids[p]] @ x[p]."""
        call = matvec_call(self.backend, self.qtype, self.d_in, self.d_out, int(x.shape[0]))
        return run(call, [self.raw, x.astype(mx.float32), eids.astype(mx.uint32), _grid()])[0]

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        """Decode and small batches: the mat-vec kernel on the router's device ids (nothing is
        read back). Larger calls: the portable backend's tiling over `dequantize` (this
        class's kernel) and gather_mm."""
        n, k = check_call(self, x, expert_ids)
        if n > MATVEC_MAX_ROWS:
            return super().gather_matmul(x, expert_ids)
        xs = x[:, None, :] if x.ndim == 2 else x
        xs = mx.broadcast_to(xs, (n, k, self.d_in)).reshape(n * k, self.d_in)
        return self.matvec(xs, expert_ids.reshape(-1)).reshape(n, k, self.d_out)

    def describe(self) -> tuple[str, str]:
        return quant.type_name(self.qtype), f"{LABELS.get(self.backend, self.backend)} kernels"

    def _device_pairs(self, x: mx.array, expert_ids: mx.array, n: int, k: int) -> mx.array:
        """A prefill call of at most `group` pairs: each pair's expert dequantised by the kernel
        from its device id, then one 1-row product per pair (nothing is read back)."""
        w = self.dequantize(expert_ids.reshape(-1))
        pair = mx.arange(n * k, dtype=mx.uint32).reshape(n, k)
        xs = x.astype(mx.float32)
        a = xs[:, None, None, :] if x.ndim == 2 else xs[:, :, None, :]
        return mx.gather_mm(a, mx.swapaxes(w, -1, -2), rhs_indices=pair).reshape(n, k, self.d_out)
