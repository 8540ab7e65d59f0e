"""The fast CPU executor's layer plan on host arrays: layers.py's sublayers, numpy from end to end.

Why its own plan: every matrix product of the fast set runs on the host (qmatrix.py), and so do its
norms, RoPE, rounding simulations, hyper-connection mixing and router (host_ops.py,
host_mixing.py). Run through the shared plan (layers.py), each of those steps took an MLX array,
read it back and wrapped its numpy result in a new MLX array, and the plan's own MLX steps between
them (the raw window's concatenation, the compressor's pooling, the sum of the routed and shared
experts) were graph nodes whose every read waited for MLX's stream thread. At the Flash shape (q4
file) that overhead was 96 ms of a 390 ms decoded token, a third of it in the reads; with this
plan it is 73 ms (docs/numerics-fast-cpu.md). Here the residual
stream, the sublayer inputs and outputs and the attention's working rows stay numpy; MLX arrays
are only the session state (LayerState: read as zero-copy views, the new arrays wrapped once) and
the residual stream handed back to model.run_layers' caller.

The math and the order of every sum are layers.py's (model.md §4), with the fast set's steps:
the compressor's pooling in numpy (the same max, exp and sums over each group's fixed candidate
set, so a group's row is the same whatever the chunk; against MLX's exp it may differ in the last
bit, within the fast set's bounds: docs/numerics-fast-cpu.md), the attention core of
fast_attention.py, the routed experts of qmatrix.routed_ffn.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from ds4agent.statelayout import FILL_KV, FILL_SCORE

from . import host_mixing, host_ops
from .config import ModelConfig
from .experts.fast import FastExperts
from .fast_attention import attend
from .fast_linear import FastLinear
from .hostread import to_host
from .layers import Profile, Trace, rope_for, timed
from .qmatrix import QuantMatrix, routed_ffn
from .state import LayerState
from .weights import AttentionWeights, CompressorWeights, DenseLayer, FFNWeights, HCWeights

F32 = np.float32
host = host_ops.host


def host_product(layer: DenseLayer) -> host_mixing.HostProduct:
    """A dense layer's product on host arrays: the fast kernels' own where the layer is a
    FastLinear (the weights of a file), else the layer's MLX product (in-memory test models)."""
    if isinstance(layer, FastLinear) and isinstance(layer.matrix, QuantMatrix):
        return layer.matrix.matmul
    return lambda x: to_host(layer(mx.array(x)), F32)


def host_copies(cache: dict, **arrays: mx.array | None) -> dict:
    """The host copies of a weights object's small arrays, each made once and kept in its cache."""
    copies = cache.setdefault("host", {})
    for name, a in arrays.items():
        if name not in copies:
            copies[name] = None if a is None else to_host(a)
    return copies


# ---- hyper-connections ------------------------------------------------------------------------------


def hc_pre(w: HCWeights, R: Any, c: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """R [n, hc, E] (host, or the MLX embedding) -> (x [n, E], post [n, hc], C [n, hc, hc])."""
    h = host_copies(w.compiled, scale=w.scale, base=w.base)
    return host_mixing.hc_pre(host_product(w.fn), h["scale"], h["base"], host(R), c)


def hc_post(R: Any, y: np.ndarray, post: np.ndarray, C: np.ndarray) -> np.ndarray:
    return host_mixing.hc_post(host(R), y, post, C)


# ---- attention --------------------------------------------------------------------------------------


def attn_front(aw: AttentionWeights, c: ModelConfig, rounding: bool, x: np.ndarray, cos: np.ndarray,
               sin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The reference's attention front (ReferenceExecutor.attn_front, the same steps through
    host_ops): (a, q_a rows, roped q, roped kv row), host array to host array."""
    n, eps = x.shape[0], c.rms_eps
    w = host_copies(aw.compiled, norm=aw.norm, q_a_norm=aw.q_a_norm, kv_norm=aw.kv_norm)
    a = host_ops.rms_norm_np(x, w["norm"], eps)
    qr = host_ops.rms_norm_np(host_product(aw.q_a)(a), w["q_a_norm"], eps)
    q = host_ops.rms_norm_np(host_product(aw.q_b)(qr).reshape(n, c.n_heads, c.head_dim), None, eps)
    kv = host_ops.rms_norm_np(host_product(aw.kv)(a), w["kv_norm"], eps)
    host_ops.rope_tail_inplace(q, cos, sin)  # q and kv are this step's own arrays
    host_ops.rope_tail_inplace(kv, cos, sin)
    if rounding:
        kv = host_ops.f16_round_np(host_ops.fp8sim_np(kv, c.nope_dim))
    return a, qr, q, kv


def _pool(kv: np.ndarray, sc: np.ndarray) -> np.ndarray:
    """layers._pool on host arrays: softmax-weighted pooling over axis 1 of [g, m, d] -> [g, d]."""
    M = sc.max(axis=1, keepdims=True)
    e = np.exp(sc - M)
    pooled = (e * kv).sum(axis=1) / e.sum(axis=1)
    return np.where(M[:, 0] <= F32(-5e29), F32(0.0), pooled)  # float32 already


def _filled(width: int, rows: int, value: float) -> np.ndarray:
    return np.full((rows, width), value, F32)


def compressor_step(cw: CompressorWeights, a: np.ndarray, p0: int, r: int, d: int, state_kv: np.ndarray,
                    state_sc: np.ndarray, *, norm_eps: float, rope_fn,
                    finish) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """layers.compressor_step on host arrays: (new rows [n_done, d], new frontier kv, score)."""
    n = a.shape[0]
    p1 = p0 + n
    w = host_copies(cw.compiled, ape=cw.ape, norm=cw.norm)
    kvp = host_product(cw.kv)(a)
    scp = host_product(cw.gate)(a) + w["ape"][np.arange(p0, p1) % r]
    width = kvp.shape[1]
    pooled = None
    if r == 4:
        s0, m0 = p0 % 4, p0 // 4
        E_kv = np.concatenate([state_kv[: 4 + s0], kvp])  # positions 4(m0-1) .. p1-1
        E_sc = np.concatenate([state_sc[: 4 + s0], scp])
        n_done = p1 // 4 - m0
        if n_done:
            g_kv = E_kv[: 4 * (n_done + 1)].reshape(n_done + 1, 4, width)
            g_sc = E_sc[: 4 * (n_done + 1)].reshape(n_done + 1, 4, width)
            # Candidates per output dim: previous group's first half, current group's second half.
            pooled = _pool(np.concatenate([g_kv[:-1, :, :d], g_kv[1:, :, d:]], axis=1),
                           np.concatenate([g_sc[:-1, :, :d], g_sc[1:, :, d:]], axis=1))
            prev_kv, prev_sc = g_kv[-1], g_sc[-1]
        else:
            prev_kv, prev_sc = state_kv[:4], state_sc[:4]
        fill = 4 - p1 % 4
        new_kv = np.concatenate([prev_kv, E_kv[4 * (n_done + 1):], _filled(width, fill, FILL_KV)])
        new_sc = np.concatenate([prev_sc, E_sc[4 * (n_done + 1):], _filled(width, fill, FILL_SCORE)])
        first_row = m0
    else:
        s0 = p0 % r
        E_kv = np.concatenate([state_kv[:s0], kvp])  # positions p0-s0 .. p1-1
        E_sc = np.concatenate([state_sc[:s0], scp])
        n_done = p1 // r - p0 // r
        if n_done:
            pooled = _pool(E_kv[: n_done * r].reshape(n_done, r, width), E_sc[: n_done * r].reshape(n_done, r, width))
        fill = r - p1 % r
        new_kv = np.concatenate([E_kv[n_done * r:], _filled(width, fill, FILL_KV)])
        new_sc = np.concatenate([E_sc[n_done * r:], _filled(width, fill, FILL_SCORE)])
        first_row = p0 // r
    if pooled is None:
        return np.zeros((0, d), F32), new_kv, new_sc
    rows = host_ops.rms_norm_np(pooled, w["norm"], norm_eps)
    rows = rope_fn(rows, (np.arange(first_row, first_row + n_done) * r).astype(np.int64))
    return finish(rows), new_kv, new_sc


def _appended(old: mx.array, rows: np.ndarray) -> tuple[np.ndarray, mx.array]:
    """(the table old + rows on the host, as the new state's MLX array). Unchanged (no row: most
    tokens), the state keeps its array and the host reads a view of it; grown, MLX builds the new
    table (its one copy) and the host reads that: a long session's table is megabytes a layer."""
    if not rows.shape[0]:
        return host(old), old
    grown = mx.concatenate([old, mx.array(rows)], axis=0)
    return host(grown), grown


def attention_block(aw: AttentionWeights, c: ModelConfig, layer: int, x: np.ndarray, lay: LayerState, p0: int,
                    rounding: bool, trace: Trace | None,
                    profile: Profile | None = None) -> tuple[np.ndarray, LayerState]:
    """layers.attention_block on host arrays: x [n, E] -> (y [n, E], the layer's new state)."""
    n = x.shape[0]
    Dh, Dn, W = c.head_dim, c.nope_dim, c.window
    r = c.ratios[layer]
    rope = rope_for(c)
    cos, sin = (host(t) for t in rope.tables(r != 0, np.arange(p0, p0 + n)))

    def rope_rows(rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cs, sn = rope.tables(r != 0, pos)
        host_ops.rope_tail_inplace(rows, host(cs), host(sn))  # rows: the compressor's own array
        return rows

    a, qr, q, kv = attn_front(aw, c, rounding, x, cos, sin)
    raw = host(lay.raw)
    r0 = raw.shape[0]
    k_all = np.concatenate([raw, kv]) if r0 else kv
    new: dict[str, Any] = {"raw": mx.array(k_all[-min(W, p0 + n):])}
    comp = None
    index_inputs = None
    masks: list | None = None
    if r != 0:
        # A compressed layer has a compressor and its state; a ratio-4 layer an indexer too.
        assert aw.compressor is not None and lay.comp is not None and lay.attn_kv is not None
        assert lay.attn_score is not None

        def finish_attn(rows: np.ndarray) -> np.ndarray:
            return host_ops.f16_round_np(host_ops.fp8sim_np(rows, Dn)) if rounding else rows

        rows, akv, asc = timed(profile, "compressors+indexer", compressor_step, aw.compressor, a, p0, r, Dh,
                               host(lay.attn_kv), host(lay.attn_score), norm_eps=c.rms_eps, rope_fn=rope_rows,
                               finish=finish_attn)
        comp, new["comp"] = _appended(lay.comp, rows)
        new.update(attn_kv=mx.array(akv), attn_score=mx.array(asc))
        if r == 4:
            iw_ = aw.indexer
            assert iw_ is not None and lay.index_comp is not None and lay.index_kv is not None
            assert lay.index_score is not None

            def finish_index(rows: np.ndarray) -> np.ndarray:
                y = host_ops.qat_np(rows, rounding)
                return host_ops.f16_round_np(y) if rounding else y

            irows, ikv, isc = timed(profile, "compressors+indexer", compressor_step, iw_.compressor, a, p0, 4,
                                    c.indexer_dim, host(lay.index_kv), host(lay.index_score), norm_eps=c.rms_eps,
                                    rope_fn=rope_rows, finish=finish_index)
            icomp, new["index_comp"] = _appended(lay.index_comp, irows)
            new.update(index_kv=mx.array(ikv), index_score=mx.array(isc))
            if (p0 + n) // 4 > c.indexer_top_k:  # some query of this chunk prunes
                Hi, Di = c.indexer_heads, c.indexer_dim
                iq = host_product(iw_.q_b)(qr).reshape(n, Hi, Di)
                host_ops.rope_tail_inplace(iq, cos, sin)  # iq: the product's own array
                iweights = host_product(iw_.proj)(a) * F32(1.0 / math.sqrt(Di * Hi))
                index_inputs = (host_ops.qat_np(iq, rounding), iweights, icomp)
            if trace is not None:
                masks = trace.indexer.setdefault(layer, [])
    sinks = host_copies(aw.compiled, sinks=aw.sinks)["sinks"]
    o = attend(c, q, k_all, r0, p0, sinks, comp, r, index_inputs, masks)
    host_ops.rope_tail_inplace(o, cos, sin, inverse=True)  # o: the attention's own array
    z = out_a(aw, o.reshape(n, c.out_groups, c.heads_per_group * Dh))
    return host_product(aw.out_b)(z), LayerState(**new)


def out_a(aw: AttentionWeights, o: np.ndarray) -> np.ndarray:
    """Output projection A by groups, o [n, G, (H/G)·Dh] -> [n, G·O] (FastLinear.grouped over all
    groups in one call where the weights are a file's, else group by group)."""
    if isinstance(aw.out_a_all, FastLinear):
        return aw.out_a_all.grouped_host(o)
    return np.concatenate([host_product(lin)(o[:, g]) for g, lin in enumerate(aw.out_a)], axis=-1)


# ---- MoE --------------------------------------------------------------------------------------------


def route(fw: FFNWeights, c: ModelConfig, layer: int, h: np.ndarray, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """host_mixing.route on this layer's weights. The token ids (MLX: a decoded token's may be the
    sampler's unread id) are read back only by the hash layers that route by them."""
    w = host_copies(fw.compiled, bias=fw.bias, tid2eid=fw.tid2eid)
    hashed = c.is_hash_layer(layer)
    ids = to_host(tokens, np.int64, view=True) if hashed else None
    return host_mixing.route(host_product(fw.gate_inp), w["bias"], w["tid2eid"], h, ids, c, hashed)


def routed(fw: FFNWeights, clamp: float, h: np.ndarray, sel: np.ndarray, wts: np.ndarray) -> np.ndarray:
    """The routed experts of h [n, E] -> [n, E], the slots summed in selection order: the fast
    kernels' one call (qmatrix.routed_ffn), or for dense test experts their MLX products with the
    reference's SwiGLU and slot sum on the host."""
    g, u, d = fw.gate_exps, fw.up_exps, fw.down_exps
    if isinstance(g, FastExperts) and isinstance(u, FastExperts) and isinstance(d, FastExperts):
        return routed_ffn(g.matrix, u.matrix, d.matrix, h, sel, wts, clamp)
    hm, sm = mx.array(h), mx.array(sel)
    mid = host_ops.swiglu_np(to_host(g.gather_matmul(hm, sm), F32), to_host(u.gather_matmul(hm, sm), F32),
                             clamp) * wts[:, :, None]
    per_slot = to_host(d.gather_matmul(mx.array(mid), sm), F32)
    total = per_slot[:, 0]
    for j in range(1, per_slot.shape[1]):
        total = total + per_slot[:, j]
    return total


def shared(fw: FFNWeights, clamp: float, h: np.ndarray) -> np.ndarray:
    mid = host_ops.swiglu_np(host_product(fw.gate_shexp)(h), host_product(fw.up_shexp)(h), clamp)
    return host_product(fw.down_shexp)(mid)


def ffn_block(fw: FFNWeights, c: ModelConfig, layer: int, x: np.ndarray, tokens: Any,
              trace: Trace | None, profile: Profile | None = None) -> np.ndarray:
    """layers.ffn_block on host arrays: x [n, E] -> y [n, E]."""
    h = host_ops.rms_norm_np(x, host_copies(fw.compiled, norm=fw.norm)["norm"], c.rms_eps)
    sel, wts = timed(profile, "router", route, fw, c, layer, h, tokens)
    if trace is not None:
        trace.experts.setdefault(layer, []).append(sel)
        trace.expert_weights.setdefault(layer, []).append(wts)
    y = timed(profile, "routed experts", routed, fw, c.swiglu_clamp[layer], h, sel, wts)
    return y + timed(profile, "shared expert", shared, fw, c.swiglu_clamp[layer], h)
