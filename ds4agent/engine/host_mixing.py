"""The fast CPU executor's small per-token steps on the host: hyper-connection mixing and the router.

At the Flash shape these steps are a few thousand floats per token, so as MLX graphs they cost
their dispatch, not their arithmetic: the Sinkhorn normalisation of a 4x4 mixing matrix took
240 µs per call as a compiled MLX function (465 eager), the router's top-k ~45 small ops, two
mixings and a router per layer. The fast set computes them here in numpy float32 (the RMS
statistic in float64, as ds4 does), with the same formulas and the same order of the few sums
that have one (the Sinkhorn sums over four values, the slot sum in selection order), from the
F16 matrix products of the fast kernels (fast_linear.FastLinear). They are row-local (a token's
result depends on that token alone), so the fast set's guarantees hold: decode = one-token
prefill, chunk invariance, determinism. Against the reference's MLX primitives they differ by
the last bits of exp/sigmoid/softmax (docs/numerics-fast-cpu.md); the routing itself (which
experts) is the reference's rule: the U largest scores, ties to the lower index.

    x, post, comb = hc_pre(fn, scale, base, R, cfg)     # model.md §4.1
    R2 = hc_post(R, y, post, comb)                      # model.md §4.2
    sel, weights = route(gate_inp, bias, tid2eid, h, tokens, cfg, hash_layer)  # model.md §4.6

`fn` and `gate_inp` are the layers' products as host functions (float32 [n, in] -> [n, out]).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .config import ModelConfig
from .qmatrix import by_rows, float_kernels

F32 = np.float32
HostProduct = Callable[[np.ndarray], np.ndarray]


def rms_normalised(x: np.ndarray, eps: float) -> np.ndarray:
    """x · 1/sqrt(mean(x²) + eps) over the last axis, the mean of squares summed in float64
    (fkernels.rms_rows: one pass, no temporary arrays; a float32's square is exact in float64,
    so its order of the sum moves the float32 mean only where two orders' float64 sums straddle
    a float32 rounding boundary: no row of 6,400 random ones against numpy's)."""
    x2 = np.ascontiguousarray(x, dtype=F32).reshape(-1, x.shape[-1])
    out = np.empty_like(x2)
    fk = float_kernels()
    by_rows(x2.shape[0], x2.size, lambda: fk.rms_rows(x2, float(eps), out),
            lambda cuts: fk.rms_rows_split(x2, float(eps), out, cuts))
    return out.reshape(x.shape)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z) for z >= 0, e^z / (1 + e^z) below (ds4's form: no exp of a large positive
    argument, and the same rounding as ds4's for negative z), in float32."""
    e = np.exp(-np.abs(z))
    one = F32(1.0)
    return np.where(z >= 0, one / (one + e), e / (one + e))


def sinkhorn(c: np.ndarray, iters: int, eps: float) -> np.ndarray:
    """ops.sinkhorn_eager's steps on [n, hc, hc] float32: a row softmax + eps, then columns and
    rows normalised in turn (each sum over hc values, in index order)."""
    e = np.exp(c - c.max(axis=-1, keepdims=True))
    c = np.ascontiguousarray(e / e.sum(axis=-1, keepdims=True) + F32(eps), dtype=F32)
    float_kernels().sinkhorn_steps(c, iters, eps)
    return c


def hc_pre(fn: HostProduct, scale: np.ndarray, base: np.ndarray, R: np.ndarray,
           cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """R [n, hc, E] -> (sublayer input x [n, E], post [n, hc], comb C [n, hc, hc]) (model.md §4.1)."""
    n, hc, E = R.shape
    flat = rms_normalised(R.reshape(n, hc * E), cfg.rms_eps)
    mix = fn(flat)
    pre = sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + F32(cfg.hc_eps)
    post = F32(2.0) * sigmoid(mix[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (mix[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(n, hc, hc)
    x = pre[:, 0, None] * R[:, 0]
    for i in range(1, hc):  # the sum over the hc streams in stream order
        x = x + pre[:, i, None] * R[:, i]
    return x, post, sinkhorn(comb, cfg.hc_sinkhorn_iters, cfg.hc_eps)


def hc_post(R: np.ndarray, y: np.ndarray, post: np.ndarray, C: np.ndarray) -> np.ndarray:
    """R [n, hc, E], y [n, E], post [n, hc], C [n, hc, hc] -> R' [n, hc, E] (model.md §4.2):
    R'[j] = post[j]·y + Σ_i C[i][j]·R[i], in ds4's order: from post[j]·y, the streams' terms
    added one at a time in stream order (fkernels.hc_post_rows)."""
    R, y, post, C = (np.ascontiguousarray(a, dtype=F32) for a in (R, y, post, C))
    out = np.empty_like(R)
    fk = float_kernels()
    by_rows(R.shape[0], R.size, lambda: fk.hc_post_rows(R, y, post, C, out),
            lambda cuts: fk.hc_post_rows_split(R, y, post, C, out, cuts))
    return out


def softplus(z: np.ndarray) -> np.ndarray:
    """z if z > 20; e^z if z < -20; log1p(e^z) otherwise (ops.softplus's branches)."""
    mid = np.log1p(np.exp(np.clip(z, F32(-20.0), F32(20.0))))
    with np.errstate(over="ignore"):  # exp(z) of the branch not taken (z > 20) may overflow
        return np.where(z > 20.0, z, np.where(z < -20.0, np.exp(z), mid)).astype(F32)


def top_u(score: np.ndarray, U: int) -> np.ndarray:
    """[n, U] indices of the U largest entries per row, by descending score, ties to the lower
    index (a stable sort of the negated scores keeps equal scores in index order)."""
    return np.argsort(-score, axis=-1, kind="stable")[:, :U].astype(np.int32)


def route(gate_inp: HostProduct, bias: np.ndarray | None, tid2eid: np.ndarray | None, h: np.ndarray,
          tokens: np.ndarray | None, cfg: ModelConfig, hash_layer: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router (model.md §4.6): (selected experts [n, U] int32, their weights [n, U] float32)."""
    prob = np.sqrt(softplus(gate_inp(h)))
    if hash_layer:
        assert tid2eid is not None and tokens is not None  # every hash layer has its table and ids
        sel = tid2eid[tokens].astype(np.int32)
    else:
        sel = top_u(prob + bias if bias is not None else prob, cfg.n_experts_used)
    pw = np.take_along_axis(prob, sel, axis=-1)
    total = pw[:, 0]
    for k in range(1, pw.shape[1]):  # the slot sum in selection order
        total = total + pw[:, k]
    weights = pw / np.maximum(total, F32(6.103515625e-5))[:, None] * F32(cfg.expert_weights_scale)
    return sel, weights.astype(F32)
