"""Numerical primitives of DS4 Flash (model.md §3), as MLX functions on float32 arrays.

Every function here is row-local (the result for one row never depends on other rows or on how
many rows a call holds) and uses fixed-length reductions only; that is what makes chunked
prefill bit-identical to token-by-token decoding on CPU (model.md §9).

Rounding simulations (fp8 E4M3, fp4 E2M1, f16 rows) are done with exact bit arithmetic: the
block scale is a power of two built from the float's exponent bits (no log2 rounding), and
values are rounded with round-half-even on the quantisation grid, which is exactly "nearest
code, ties to the even code" because the code's last bit is the grid index's last bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from .hostread import to_bool

F32 = mx.float32


# ---- the GPU kernel set's fused chains -------------------------------------------------------
#
# On a GPU a decoded token's speed is decided by how many small kernels it launches; an
# elementwise chain compiled with mx.compile runs as one. Only the GPU kernel set uses these
# (FUSED below, picked by the GPU executor): the exact ops keep their eager form, bit for bit as
# they always were.
# A function that fails to compile (an MLX build without the compiler for this backend) stays
# eager for the whole process.


class _Fused:
    """f compiled on first use (mx.compile, shape-specialised unless `shapeless`), else f."""

    def __init__(self, f, *, shapeless: bool = False):
        self._f = f
        self._shapeless = shapeless
        self._fn: Callable[..., Any] | None = None

    def __call__(self, *args):
        if self._fn is None:
            try:
                cf = mx.compile(self._f, shapeless=self._shapeless)
                out = cf(*args)
                self._fn = cf
                return out
            except Exception:  # noqa: BLE001 - no compiler here: the eager chain, same math
                self._fn = self._f
        return self._fn(*args)


def fused(f=None, *, shapeless: bool = False):
    """Decorator: the GPU kernel set's compiled version of an elementwise chain."""
    if f is None:
        return lambda g: _Fused(g, shapeless=shapeless)
    return _Fused(f, shapeless=shapeless)


# ---- accumulation rule -------------------------------------------------------------------------


def _acc_dtype():
    # ds4 accumulates Σx² in float64 and converts the mean to float32 (model.md §3). MLX has
    # float64 on the CPU only; on a GPU stream the f32 mean is the closest we can do (GPU results
    # are compared by tolerance anyway).
    return mx.float64 if mx.default_device() == mx.cpu else mx.float32


def rms_scale(x: mx.array, eps: float) -> mx.array:
    """1/sqrt(mean(x²) + eps) over the last axis, keepdims; Σx² accumulated in float64 (CPU)."""
    xd = x.astype(_acc_dtype())
    ms = mx.mean(xd * xd, axis=-1, keepdims=True).astype(F32)
    return mx.rsqrt(ms + mx.array(eps, dtype=F32))


def rms_norm(x: mx.array, w: mx.array | None, eps: float) -> mx.array:
    """RMSNorm(x; w) = x · (1/sqrt(mean(x²) + eps)) · w; RMSNorm₀ when w is None."""
    y = x * rms_scale(x, eps)
    return y if w is None else y * w


# ---- activations -------------------------------------------------------------------------------


def _softplus(z: mx.array) -> mx.array:
    mid = mx.log1p(mx.exp(mx.clip(z, -20.0, 20.0)))
    return mx.where(z > 20.0, z, mx.where(z < -20.0, mx.exp(z), mid))


_softplus_fused = fused(_softplus, shapeless=True)


def softplus(z: mx.array) -> mx.array:
    """z if z > 20; e^z if z < -20; log1p(e^z) otherwise (model.md §3)."""
    return _softplus(z)


def silu(z: mx.array) -> mx.array:
    return z * mx.sigmoid(z)


def _swiglu(g: mx.array, u: mx.array, clamp: mx.array | float) -> mx.array:
    g = mx.minimum(g, clamp)
    u = mx.clip(u, -clamp, clamp)
    return silu(g) * u


_swiglu_fused = fused(_swiglu, shapeless=True)


def swiglu(g: mx.array, u: mx.array, clamp: float) -> mx.array:
    """silu(min(g, c)) · clamp(u, -c, c) (the per-layer swiglu clamp VALUE c)."""
    return _swiglu(g, u, clamp)


def _swiglu_gpu(g: mx.array, u: mx.array, clamp: float) -> mx.array:
    # the clamp as an array: one compiled function for every layer's value
    return _swiglu_fused(g, u, mx.array(clamp, dtype=F32))


# ---- exact float bit helpers -------------------------------------------------------------------


def _exponent(a: mx.array) -> mx.array:
    """floor(log2(a)) for positive normal float32 a, exactly (from the exponent bits);
    -127 for zero/subnormals (callers clamp it)."""
    bits = a.astype(F32).view(mx.uint32)
    return ((bits >> 23) & 0xFF).astype(mx.int32) - 127


def _pow2(e: mx.array) -> mx.array:
    """2^e as float32 for integer e in [-126, 127], exactly."""
    return ((e + 127).astype(mx.uint32) << 23).view(F32)


def pow2_ceil(y: mx.array) -> mx.array:
    """2^ceil(log2(y)) for positive normal float32 y, exactly."""
    bits = y.astype(F32).view(mx.uint32)
    e = ((bits >> 23) & 0xFF).astype(mx.int32) - 127
    e = e + ((bits & 0x7FFFFF) != 0).astype(mx.int32)
    return _pow2(e)


def f16_round(x: mx.array) -> mx.array:
    """f32 -> IEEE half (round to nearest even) -> f32."""
    return x.astype(mx.float16).astype(F32)


def e4m3(v: mx.array) -> mx.array:
    """Nearest E4M3FN value (ties to the even code) of v in [-448, 448]."""
    a = mx.abs(v)
    # Grid step in the binade of a: 2^(e-3) for normal codes (e >= -6), 2^-9 for subnormals.
    step = _pow2(mx.maximum(_exponent(a), -6) - 3)
    q = mx.round(a / step) * step
    return mx.where(v < 0, -q, q)


def e2m1(v: mx.array) -> mx.array:
    """Nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6} (ties to the even code), sign kept; |v| <= 6."""
    a = mx.abs(v)
    step = _pow2(mx.maximum(_exponent(a), 0) - 1)
    q = mx.round(a / step) * step
    return mx.where(v < 0, -q, q)


def fp8sim(x: mx.array, n_blocks_dims: int) -> mx.array:
    """E4M3 simulation on the first `n_blocks_dims` values of the last axis, blocks of 64
    (model.md §3): amax floor 1e-4, scale 2^ceil(log2(amax/448)); the tail is untouched."""
    return _fp8sim(x, n_blocks_dims)


def _fp8sim_gpu(x: mx.array, n_blocks_dims: int) -> mx.array:
    return _fp8sim_fused(n_blocks_dims)(x)


@lru_cache(maxsize=16)
def _fp8sim_fused(n_blocks_dims: int):
    return fused(lambda x: _fp8sim(x, n_blocks_dims))


def _fp8sim(x: mx.array, n_blocks_dims: int) -> mx.array:
    dn = n_blocks_dims
    head = x[..., :dn]
    shape = head.shape
    b = head.reshape(*shape[:-1], dn // 64, 64)
    amax = mx.maximum(mx.max(mx.abs(b), axis=-1, keepdims=True), 1e-4)
    s = pow2_ceil(amax / 448.0)
    q = e4m3(mx.clip(b / s, -448.0, 448.0)) * s
    q = q.reshape(shape)
    if dn == x.shape[-1]:
        return q
    return mx.concatenate([q, x[..., dn:]], axis=-1)


_FP4_FLOOR = 6.0 * 2.0**-126


def fp4sim(x: mx.array) -> mx.array:
    """E2M1 simulation on blocks of 32 along the last axis (model.md §3)."""
    return _fp4sim(x)


def _fp4sim(x: mx.array) -> mx.array:
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = mx.maximum(mx.max(mx.abs(b), axis=-1, keepdims=True), mx.array(_FP4_FLOOR, dtype=F32))
    s = pow2_ceil(amax / 6.0)
    q = e2m1(mx.clip(b / s, -6.0, 6.0)) * s
    return q.reshape(shape)


_fp4sim_fused = fused(_fp4sim)


# ---- Hadamard ------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _hadamard_mx(d: int) -> mx.array:
    return mx.array(hadamard_matrix(d))


def hadamard_matrix(d: int) -> np.ndarray:
    """The d x d Sylvester Hadamard matrix of ±1 (float32, symmetric): entry (i, j) is
    (-1)^popcount(i & j)."""
    i = np.arange(d, dtype=np.int64)
    and_ = i[:, None] & i[None, :]
    pop = np.zeros_like(and_)
    v = and_.copy()
    while np.any(v):
        pop += v & 1
        v >>= 1
    return np.where(pop % 2 == 0, 1.0, -1.0).astype(np.float32)


def hadamard(x: mx.array) -> mx.array:
    """y_i = (1/√D)·Σ_j (-1)^popcount(i & j)·x_j over the last axis (Sylvester order)."""
    d = x.shape[-1]
    h = _hadamard_mx(d)  # symmetric ±1 (Sylvester)
    return (x @ h) * mx.array(1.0 / math.sqrt(d), dtype=F32)


def qat(x: mx.array, rounding: bool = True) -> mx.array:
    """Indexer QAT: Hadamard, then fp4sim (skipped when the rounding simulations are off)."""
    y = hadamard(x)
    return fp4sim(y) if rounding else y


def _qat_gpu(x: mx.array, rounding: bool = True) -> mx.array:
    y = hadamard(x)
    return _fp4sim_fused(y) if rounding else y


# ---- hyper-connections -------------------------------------------------------------------------


def sinkhorn_eager(c: mx.array, iters: int, eps: float) -> mx.array:
    c = mx.softmax(c, axis=-1) + eps
    c = c / (mx.sum(c, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (mx.sum(c, axis=-1, keepdims=True) + eps)
        c = c / (mx.sum(c, axis=-2, keepdims=True) + eps)
    return c


_SINKHORN_COMPILED: dict[tuple[int, float], Callable[[mx.array], mx.array]] = {}


def sinkhorn(c: mx.array, iters: int, eps: float) -> mx.array:
    """Sinkhorn normalisation of [..., n, n] mixing logits (model.md §4.1 step 5).

    Its ~120 tiny ops dominated the graph-building time of a decode step, so it runs as one
    shape-independent compiled function (elementwise fusion gives bit-identical values; checked
    once per process against the eager version). Where compilation is unavailable (e.g. no JIT
    toolchain for the CPU backend) the eager version is used for the whole process, so a
    session never mixes the two.
    """
    key = (iters, float(eps))
    fn = _SINKHORN_COMPILED.get(key)
    if fn is None:
        fn = _SINKHORN_COMPILED[key] = _compile_checked(lambda x: sinkhorn_eager(x, iters, eps))
    return fn(c)


def _compile_checked(f: Callable[[mx.array], mx.array]) -> Callable[[mx.array], mx.array]:
    """mx.compile(f, shapeless=True) if it works and matches f bit for bit on a probe, else f."""
    try:
        cf = mx.compile(f, shapeless=True)
        probe = mx.array(np.linspace(-3.0, 3.0, 48, dtype=np.float32).reshape(3, 4, 4))
        a, b = cf(probe), f(probe)
        if to_bool(mx.array_equal(a, b)):
            return cf
    except Exception:  # any failure means: stay eager
        pass
    return f


# ---- RoPE ----------------------------------------------------------------------------------------


def rope_freqs(rope_dim: int, base: float, *, yarn: tuple[float, int, int] | None = None) -> np.ndarray:
    """Per-pair angular frequencies (float64): b^(-2k/Dr), with the YaRN blend when
    `yarn = (factor, lo, hi)`: θ_k = θe·ramp + (θe/factor)·(1 - ramp), no magnitude scaling."""
    k = np.arange(rope_dim // 2, dtype=np.float64)
    inv = base ** (-2.0 * k / rope_dim)
    if yarn is None:
        return inv
    factor, lo, hi = yarn
    ramp = 1.0 - np.clip((k - lo) / max(0.001, hi - lo), 0.0, 1.0)
    return inv * ramp + (inv / factor) * (1.0 - ramp)


def rope_tables(freqs: np.ndarray, positions: np.ndarray) -> tuple[mx.array, mx.array]:
    """cos/sin [len(positions), Dr/2] float32 of θ = p·freq, computed in float64 on the host
    (positions are known integers, not activations)."""
    theta = np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]
    return mx.array(np.cos(theta).astype(np.float32)), mx.array(np.sin(theta).astype(np.float32))


def rope_rows(t, x_ndim: int):
    """A cos/sin table [n, Dr/2] (MLX or numpy) shaped to broadcast against the pairs of an x of
    x_ndim axes whose first axis is the n positions (e.g. [n, heads, D]): one row per position,
    repeated over the middle axes. A table with as many axes as that already is returned as is."""
    if t.ndim == 2 and x_ndim > 2:
        return t.reshape(t.shape[0], *([1] * (x_ndim - 2)), t.shape[-1])
    return t


def rope_tail(x: mx.array, cos: mx.array, sin: mx.array, inverse: bool = False) -> mx.array:
    """Rotate the last Dr values of x as adjacent pairs (GGML normal mode); cos/sin [n, Dr/2], one
    row per leading index of x (rope_rows), or broadcastable against x[..., Dr/2]. Inverse
    rotation uses -θ."""
    return _rope_tail(x, cos, sin, inverse)


def _rope_tail_gpu(x: mx.array, cos: mx.array, sin: mx.array, inverse: bool = False) -> mx.array:
    return _rope_fused(inverse)(x, cos, sin)


@lru_cache(maxsize=2)
def _rope_fused(inverse: bool):
    return fused(lambda x, cos, sin: _rope_tail(x, cos, sin, inverse))


def _rope_tail(x: mx.array, cos: mx.array, sin: mx.array, inverse: bool) -> mx.array:
    half = cos.shape[-1]
    dr = 2 * half
    d = x.shape[-1]
    tail = x[..., d - dr:].reshape(*x.shape[:-1], half, 2)
    x0, x1 = tail[..., 0], tail[..., 1]
    cos, sin = rope_rows(cos, x.ndim), rope_rows(sin, x.ndim)
    if inverse:
        sin = -sin
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    rot = mx.stack([y0, y1], axis=-1).reshape(*x.shape[:-1], dr)
    if dr == d:
        return rot
    return mx.concatenate([x[..., : d - dr], rot], axis=-1)


# ---- the primitive sets the executors build graphs from --------------------------------------------


@dataclass(frozen=True)
class OpSet:
    """The primitives whose form differs between kernel sets. EXACT: the eager ops above (the
    reference). host_ops.HOST: the fast CPU set's, the same steps in numpy on the host. FUSED:
    the GPU kernel set's (MLX's fused RMSNorm with f32 accumulation, compiled elementwise chains),
    agreeing with EXACT within the GPU contract. An executor holds one; the layer code calls
    `ops.rms_norm(...)` through it, so no graph-building step asks which set runs."""

    rms_norm: Callable[[mx.array, mx.array | None, float], mx.array]
    softplus: Callable[[mx.array], mx.array]
    swiglu: Callable[[mx.array, mx.array, float], mx.array]
    fp8sim: Callable[[mx.array, int], mx.array]
    rope_tail: Callable[..., mx.array]
    qat: Callable[..., mx.array]


EXACT = OpSet(rms_norm=rms_norm, softplus=softplus, swiglu=swiglu, fp8sim=fp8sim, rope_tail=rope_tail, qat=qat)
FUSED = OpSet(rms_norm=mx.fast.rms_norm, softplus=_softplus_fused, swiglu=_swiglu_gpu, fp8sim=_fp8sim_gpu,
              rope_tail=_rope_tail_gpu, qat=_qat_gpu)
