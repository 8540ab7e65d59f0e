"""The fast CPU executor's primitives on the host: ops.EXACT's row-local steps in numpy.

Why: on the CPU device every read of an MLX result waits for MLX's stream thread, about 80-100 µs
on the 2-core test machine even for one scalar (a condition-variable hand-off each way), while
numpy does an RMSNorm of 4,096 floats in about 20 µs. The fast set's matrix products already run
on the host (qmatrix.py), so a decoded token went back and forth between MLX and the host some
twenty times a layer, 100-130 ms of a 700-900 ms token at the Flash shape, mostly waiting. With
the norms, RoPE, the fp8 simulation and the SwiGLU here too, the inputs of the next product are
host arrays already and the hand-offs disappear.

The `*_np` forms take and give numpy arrays: the fast executor's layer plan (fast_layers.py)
calls them directly. The others take MLX or numpy arrays and return an MLX array built from the
numpy result (an evaluated array: reading it back costs a copy, not a wait), so a plan written
for MLX (the output head, layers.py in tests) calls them through the executor's OpSet like the
exact ones. The formulas and the order of every
sum are ops.py's: the norms' mean of squares in float64 (host_mixing.rms_normalised), RoPE's
products and sums per pair, the fp8 simulation's bit arithmetic and round-half-even (exact, so the
same bits as ops.fp8sim). They are row-local, so the fast set's guarantees hold (decode = one-token
prefill, chunk invariance, determinism); against the reference's MLX primitives they differ at
most by the last bit of a square root or an exp (docs/numerics-fast-cpu.md). The indexer's QAT
(a Hadamard product, then fp4) takes its product from the fast kernels (`qat`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import mlx.core as mx
import numpy as np

from . import host_mixing, ops
from .hostread import to_host
from .qmatrix import QuantMatrix, float_kernels

F32 = np.float32


def host(a: Any) -> np.ndarray:
    """`a` as a float32 numpy array (a read-only view of an evaluated MLX array: no copy)."""
    if isinstance(a, np.ndarray):
        return a if a.dtype == F32 else a.astype(F32)
    return to_host(a, F32, view=True)


def rms_norm_np(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ops.rms_norm on host arrays: x · (1/sqrt(mean(x²) + eps)) · w (w None: no weight)."""
    y = host_mixing.rms_normalised(x, eps)
    return y if w is None else y * w


def rms_norm(x: Any, w: Any, eps: float) -> mx.array:
    return mx.array(rms_norm_np(host(x), None if w is None else host(w), eps))


def softplus(z: Any) -> mx.array:
    return mx.array(host_mixing.softplus(host(z)))


def swiglu(g: Any, u: Any, clamp: float) -> mx.array:
    return mx.array(swiglu_np(host(g), host(u), clamp))


def swiglu_np(g: np.ndarray, u: np.ndarray, clamp: float) -> np.ndarray:
    """ops.swiglu: silu(min(g, c)) · clip(u, -c, c), silu(z) = z · sigmoid(z)."""
    c = F32(clamp)
    z = np.minimum(g, c)
    return (z * host_mixing.sigmoid(z)) * np.clip(u, -c, c)


def _pow2(e: np.ndarray) -> np.ndarray:
    return ((e + 127).astype(np.uint32) << np.uint32(23)).view(F32)


def _exponent(a: np.ndarray) -> np.ndarray:
    return ((a.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127


def fp8sim(x: Any, n_blocks_dims: int) -> mx.array:
    return mx.array(fp8sim_np(host(x), n_blocks_dims))


def fp8sim_np(xh: np.ndarray, n_blocks_dims: int) -> np.ndarray:
    """ops.fp8sim on a host array: E4M3 on the first n_blocks_dims values, blocks of 64, with the
    same exact bit arithmetic (power-of-two scale from the exponent bits, round half to even)."""
    dn = n_blocks_dims
    b = xh[..., :dn].reshape(*xh.shape[:-1], dn // 64, 64)
    amax = np.maximum(np.abs(b).max(axis=-1, keepdims=True), F32(1e-4))
    y = amax / F32(448.0)
    bits = y.view(np.uint32)
    s = _pow2(_exponent(y) + ((bits & np.uint32(0x7FFFFF)) != 0).astype(np.int32))
    v = np.clip(b / s, F32(-448.0), F32(448.0))
    a = np.abs(v)
    step = _pow2(np.maximum(_exponent(a), -6) - 3)
    q = np.rint(a / step) * step
    q = np.where(v < 0, -q, q) * s
    out = q.reshape(*xh.shape[:-1], dn)
    if dn != xh.shape[-1]:
        out = np.concatenate([out, xh[..., dn:]], axis=-1)
    return out


def rope_tail(x: Any, cos: Any, sin: Any, inverse: bool = False) -> mx.array:
    return mx.array(rope_tail_np(host(x), host(cos), host(sin), inverse))


def rope_tail_np(xh: np.ndarray, ch: np.ndarray, sh: np.ndarray, inverse: bool = False) -> np.ndarray:
    """ops.rope_tail on host arrays: the last Dr values of x rotated as adjacent pairs; cos/sin
    [n, Dr/2], one row per leading index of x (or already broadcastable against x's pairs)."""
    if _per_position(xh, ch):
        out = np.array(xh, dtype=F32, order="C")
        rope_tail_inplace(out, ch, sh, inverse)
        return out
    half = ch.shape[-1]
    dr, d = 2 * half, xh.shape[-1]
    ch, sh = ops.rope_rows(ch, xh.ndim), ops.rope_rows(sh, xh.ndim)
    if inverse:
        sh = -sh
    tail = xh[..., d - dr:].reshape(*xh.shape[:-1], half, 2)
    x0, x1 = tail[..., 0], tail[..., 1]
    rot = np.stack([x0 * ch - x1 * sh, x0 * sh + x1 * ch], axis=-1).reshape(*xh.shape[:-1], dr)
    return rot if dr == d else np.concatenate([xh[..., :d - dr], rot], axis=-1)


def _per_position(xh: np.ndarray, ch: np.ndarray) -> bool:
    return ch.ndim == 2 and xh.ndim in (2, 3) and ch.shape[0] == xh.shape[0]


def rope_tail_inplace(xh: np.ndarray, ch: np.ndarray, sh: np.ndarray, inverse: bool = False) -> None:
    """rope_tail_np into x itself (a C-contiguous float32 array the caller owns, [n, D] or
    [n, heads, D], tables [n, Dr/2]): one numba pass (fkernels.rope_tail_rows), the same float32
    steps, without the copies and temporaries of the array form (a prefill's queries are
    [n, 64, 512])."""
    assert _per_position(xh, ch) and xh.dtype == F32 and xh.flags.c_contiguous
    float_kernels().rope_tail_rows(xh.reshape(xh.shape[0], -1, xh.shape[-1]), np.ascontiguousarray(ch, F32),
                                   np.ascontiguousarray(sh, F32), inverse)


def f16_round_np(x: np.ndarray) -> np.ndarray:
    """ops.f16_round on a host array: to IEEE half (nearest, ties to even) and back."""
    return x.astype(np.float16).astype(F32)


@functools.lru_cache(maxsize=4)
def _hadamard(d: int) -> QuantMatrix:
    return QuantMatrix.from_dense(ops.hadamard_matrix(d))


def fp4sim_np(xh: np.ndarray) -> np.ndarray:
    """ops.fp4sim on a host array: E2M1 on blocks of 32 of the last axis, with the same exact bit
    arithmetic (scale 2^ceil(log2(amax / 6)), amax floored at 6 * 2^-126, round half to even)."""
    b = xh.reshape(*xh.shape[:-1], xh.shape[-1] // 32, 32)
    amax = np.maximum(np.abs(b).max(axis=-1, keepdims=True), F32(6.0 * 2.0**-126))
    y = amax / F32(6.0)
    s = _pow2(_exponent(y) + ((y.view(np.uint32) & np.uint32(0x7FFFFF)) != 0).astype(np.int32))
    v = np.clip(b / s, F32(-6.0), F32(6.0))
    a = np.abs(v)
    step = _pow2(np.maximum(_exponent(a), 0) - 1)
    q = np.rint(a / step) * step
    return (np.where(v < 0, -q, q) * s).reshape(xh.shape)


def qat(x: Any, rounding: bool = True) -> mx.array:
    """ops.qat on the host: its Hadamard product on the fast kernels (the ±1 matrix as an F32
    matrix: fkernels.dense_rows's lane order, row-local), the same 1/sqrt(d), then fp4sim_np (the
    same bits as ops.fp4sim). In MLX, once a session passes 2,048 tokens, the product alone took
    0.45 ms for each decoded token's 64 indexer heads and 1.8 s for a 512-token chunk's, in each
    of 21 layers, and the fp4 simulation 0.4 ms and 96 ms."""
    return mx.array(qat_np(host(x), rounding))


def qat_np(xh: np.ndarray, rounding: bool = True) -> np.ndarray:
    """qat on a host array."""
    d = xh.shape[-1]
    y = _hadamard(d).matmul(xh.reshape(-1, d)).reshape(xh.shape) * F32(1.0 / math.sqrt(d))
    return fp4sim_np(y) if rounding else y


HOST = ops.OpSet(rms_norm=rms_norm, softplus=softplus, swiglu=swiglu, fp8sim=fp8sim, rope_tail=rope_tail,
                 qat=qat)
