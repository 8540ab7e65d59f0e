"""DS4 Flash forward pass over a chunk of tokens, as pure functions (model.md §4).

    logits, new_state = forward(weights, config, state, tokens)

`tokens` are appended after `state` (positions state.n_tokens ...); the whole chunk is processed
layer by layer in batch, and every query sees exactly what the streaming definition gives it
(model.md §9): raw rows max(0, p-W+1)..p, compressed rows 0..(p+1)//r - 1 (ratio 4: filtered by
the indexer over index rows 0..(p+1)//4 - 1).

Bit-exact chunk invariance on CPU (any chunk schedule -> identical logits and state) rests on
every per-query computation having a layout that depends on the query alone, never on the chunk:

* raw window: each query gathers its own W slots, slot j = position p-W+1+j (logical order),
  masked before position 0; all reductions over slots have the fixed length W.
* ratio-4 compressed rows: each query gathers its own top-k slots (rows in ascending order;
  before pruning, rows 0..K-1 with the invisible ones masked): fixed length K.
* other ratios: rows are scored in fixed blocks of `_COMP_BLOCK` rows at fixed absolute offsets
  and the per-block sums are accumulated sequentially, so trailing masked rows/blocks add exact
  zeros.
* expert outputs are summed in selection order by explicit additions; top-k selections are
  exact masks (threshold + tie rank by row index), never an unstable sort.
* compressor pooling runs over fixed-length candidate sets (r rows, or 8 for ratio 4).
Masked entries use -inf scores, so they contribute exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ds4agent.statelayout import FILL_KV, FILL_SCORE

from . import ops
from .config import ModelConfig
from .device import gpu_kernels
from .hostread import to_host
from .state import LayerState, SessionState, check_token_ids
from .weights import AttentionWeights, CompressorWeights, FFNWeights, HCWeights, LayerWeights, ModelWeights

F32 = mx.float32
NEG_INF = float("-inf")
_COMP_BLOCK = 64  # compressed rows per attention block on non-indexer layers (see module doc)
_QUERY_BLOCK = 256  # queries per attention block (bounds the gathered K/V memory)
_INDEX_SCORE_BUDGET = 256 << 20  # bytes of indexer score temporaries per query block


@dataclass
class Trace:
    """Optional per-layer record of decisions, for tests (indexer selections, expert choices)."""

    indexer: dict[int, list[np.ndarray]]  # layer -> [mask [n, C] bool per chunk]
    experts: dict[int, list[np.ndarray]]  # layer -> [sel [n, U] int per chunk]
    expert_weights: dict[int, list[np.ndarray]]  # layer -> [weights [n, U] per chunk]

    @classmethod
    def new(cls) -> Trace:
        return cls(indexer={}, experts={}, expert_weights={})


class Profile:
    """Where a forward pass's time goes, for the Flash-shape benchmark (bench/flash_shape.py).

    With a Profile, `forward` evaluates each section as soon as its graph is built and records,
    per section, the time spent building its graph in Python (`build`) and running it (`run`),
    exclusive of nested sections. The forced evaluations change the schedule a little (MLX can no
    longer overlap sections), so a profiled step is slightly slower than a plain one; the split
    is what it is for. Without a Profile nothing here runs.
    """

    def __init__(self) -> None:
        self.build: dict[str, float] = {}
        self.run: dict[str, float] = {}
        self._nested: list[float] = []

    def section(self, name: str, fn, *args, **kwargs):
        import time

        t0 = time.perf_counter()
        self._nested.append(0.0)
        out = fn(*args, **kwargs)
        t1 = time.perf_counter()
        mx.eval(_leaves(out))
        t2 = time.perf_counter()
        inner = self._nested.pop()
        self.build[name] = self.build.get(name, 0.0) + (t1 - t0) - inner
        self.run[name] = self.run.get(name, 0.0) + (t2 - t1)
        if self._nested:
            self._nested[-1] += t2 - t0
        return out


def _leaves(out) -> list[mx.array]:
    if isinstance(out, mx.array):
        return [out]
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _leaves(o)]
    return list(out.arrays()) if hasattr(out, "arrays") else []


def _call(profile: Profile | None, name: str, fn, *args, **kwargs):
    return fn(*args, **kwargs) if profile is None else profile.section(name, fn, *args, **kwargs)


class _Rope:
    """cos/sin tables of one chunk for both layer kinds (ratio-0 and compressed/YaRN)."""

    def __init__(self, config: ModelConfig):
        c = config
        self.plain = ops.rope_freqs(c.rope_dim, c.rope_base)
        lo, hi = c.yarn_lo_hi()
        self.yarn = ops.rope_freqs(c.rope_dim, c.compress_rope_base, yarn=(c.yarn_factor, lo, hi))

        self._memo: dict[tuple, tuple[mx.array, mx.array]] = {}

    def tables(self, compressed: bool, positions: np.ndarray) -> tuple[mx.array, mx.array]:
        # Every layer of a chunk needs the same tables: memoise the last few (decode builds one
        # graph per token, and this host-side work was a visible part of it).
        key = (compressed, int(positions[0]), len(positions), int(positions[-1]))
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= 16:
                self._memo.clear()
            hit = self._memo[key] = ops.rope_tables(self.yarn if compressed else self.plain, positions)
        return hit


_ROPE_CACHE: dict[ModelConfig, _Rope] = {}


def _rope(config: ModelConfig) -> _Rope:
    r = _ROPE_CACHE.get(config)
    if r is None:
        r = _ROPE_CACHE[config] = _Rope(config)
    return r


# ---- hyper-connections ---------------------------------------------------------------------------


def hc_pre(w: HCWeights, R: mx.array, c: ModelConfig) -> tuple[mx.array, mx.array, mx.array]:
    """R [n, hc, E] -> (sublayer input x [n, E], post [n, hc], comb C [n, hc, hc]) (§4.1)."""
    if gpu_kernels():  # norm, mixing matrix and the whole mixing chain, Sinkhorn included
        return _hc_pre_fused(w, c)(R)
    n, hc, E = R.shape
    flat = ops.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)
    mix = w.fn(flat)
    return _hc_mix(mix, w.scale, w.base, R, hc, c.hc_eps,
                   lambda comb: ops.sinkhorn(comb, c.hc_sinkhorn_iters, c.hc_eps))


def _hc_mix(mix: mx.array, s: mx.array, b: mx.array, R: mx.array, hc: int, eps: float,
            sinkhorn) -> tuple[mx.array, mx.array, mx.array]:
    n = R.shape[0]
    pre = mx.sigmoid(mix[:, :hc] * s[0] + b[:hc]) + eps
    post = 2.0 * mx.sigmoid(mix[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
    comb = (mix[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(n, hc, hc)
    C = sinkhorn(comb)
    x = mx.sum(pre[:, :, None] * R, axis=1)
    return x, post, C


# The GPU kernel set's hc_pre, one compiled function per HCWeights (its weights are captured as
# constants; keyed by id, the weights kept alive beside their function so an id is never reused
# while its entry lives). A decoded token calls it twice per layer: compiling it whole lets MLX
# fuse the norm's and the mix's elementwise work across what were separate small graphs.
_HC_PRE: dict[int, tuple[HCWeights, object]] = {}


def _hc_pre_fused(w: HCWeights, c: ModelConfig):
    hit = _HC_PRE.get(id(w))
    if hit is None or hit[0] is not w:
        hc, iters, eps = c.hc_count, c.hc_sinkhorn_iters, c.hc_eps
        # Each mixing column's scale (pre, post, comb: scale[0], [1], [2]) as one vector, made
        # once: the same products as scaling each slice, without the per-call slicing.
        col_scale = mx.concatenate([mx.broadcast_to(w.scale[i:i + 1], (m,))
                                    for i, m in enumerate((hc, hc, hc * hc))])
        mx.eval(col_scale)

        def pre(R: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            n, _, E = R.shape
            mix = w.fn(ops.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)) * col_scale + w.base
            pre_w = mx.sigmoid(mix[:, :hc]) + eps
            post = 2.0 * mx.sigmoid(mix[:, hc:2 * hc])
            C = ops.sinkhorn_eager(mix[:, 2 * hc:].reshape(n, hc, hc), iters, eps)
            return mx.sum(pre_w[:, :, None] * R, axis=1), post, C

        hit = _HC_PRE[id(w)] = (w, ops.fused(pre))
    return hit[1]


def _hc_post(R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
    return post[:, :, None] * y[:, None, :] + mx.swapaxes(C, -1, -2) @ R


_hc_post_fused = ops.fused(_hc_post)


def hc_post(R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
    """R'[j] = post[j]·y + Σ_i C[i][j]·R[i] (§4.2)."""
    return _hc_post_fused(R, y, post, C) if gpu_kernels() else _hc_post(R, y, post, C)


# ---- compressor ------------------------------------------------------------------------------------


def _pool(kv: mx.array, sc: mx.array) -> mx.array:
    """Softmax-weighted pooling over axis 1 (the fixed candidate set) of [g, m, d] -> [g, d]."""
    M = mx.max(sc, axis=1, keepdims=True)
    e = mx.exp(sc - M)
    pooled = mx.sum(e * kv, axis=1) / mx.sum(e, axis=1)
    return mx.where(M[:, 0] <= -5e29, 0.0, pooled)


def compressor_step(cw: CompressorWeights, a: mx.array, p0: int, r: int, d: int,
                    state_kv: mx.array, state_sc: mx.array, *, norm_eps: float,
                    rope_fn, finish) -> tuple[mx.array, mx.array, mx.array]:
    """Run the compressor (§4.4) over chunk inputs a [n, E] at positions p0.. .

    Returns (new rows [n_done, d] in row order, new frontier kv, new frontier score), the frontier
    in the canonical layout (filler outside the partial window). `rope_fn(rows, positions)`
    applies the layer's RoPE; `finish(rows)` applies fp8sim / qat and the f16 rounding.
    """
    n = a.shape[0]
    p1 = p0 + n
    kvp = cw.kv(a)
    pos_mod = mx.array((np.arange(p0, p1) % r).astype(np.int32))
    scp = cw.gate(a) + cw.ape[pos_mod]
    width = kvp.shape[1]
    if r == 4:
        s0, m0 = p0 % 4, p0 // 4
        E_kv = mx.concatenate([state_kv[: 4 + s0], kvp], axis=0)  # positions 4(m0-1) .. p1-1
        E_sc = mx.concatenate([state_sc[: 4 + s0], scp], axis=0)
        n_done = p1 // 4 - m0
        if n_done:
            g_kv = E_kv[: 4 * (n_done + 1)].reshape(n_done + 1, 4, width)
            g_sc = E_sc[: 4 * (n_done + 1)].reshape(n_done + 1, 4, width)
            # Candidates per output dim: previous group's first half, current group's second half.
            cand_kv = mx.concatenate([g_kv[:-1, :, :d], g_kv[1:, :, d:]], axis=1)
            cand_sc = mx.concatenate([g_sc[:-1, :, :d], g_sc[1:, :, d:]], axis=1)
            pooled = _pool(cand_kv, cand_sc)
            prev_kv = g_kv[-1]
            prev_sc = g_sc[-1]
        else:
            prev_kv, prev_sc = state_kv[:4], state_sc[:4]
        rest = p1 % 4
        cur_kv = E_kv[4 * (n_done + 1):]
        cur_sc = E_sc[4 * (n_done + 1):]
        fill = 4 - rest
        new_kv = mx.concatenate([prev_kv, cur_kv, mx.full((fill, width), FILL_KV, dtype=F32)], axis=0)
        new_sc = mx.concatenate([prev_sc, cur_sc, mx.full((fill, width), FILL_SCORE, dtype=F32)], axis=0)
        first_row = m0
    else:
        s0 = p0 % r
        E_kv = mx.concatenate([state_kv[:s0], kvp], axis=0)  # positions p0-s0 .. p1-1
        E_sc = mx.concatenate([state_sc[:s0], scp], axis=0)
        n_done = p1 // r - p0 // r
        if n_done:
            pooled = _pool(E_kv[: n_done * r].reshape(n_done, r, width),
                           E_sc[: n_done * r].reshape(n_done, r, width))
        rest = p1 % r
        fill = r - rest
        new_kv = mx.concatenate([E_kv[n_done * r:], mx.full((fill, width), FILL_KV, dtype=F32)], axis=0)
        new_sc = mx.concatenate([E_sc[n_done * r:], mx.full((fill, width), FILL_SCORE, dtype=F32)], axis=0)
        first_row = p0 // r
    if not n_done:
        return mx.zeros((0, d), dtype=F32), new_kv, new_sc
    rows = ops.rms_norm(pooled, cw.norm, norm_eps)
    positions = (np.arange(first_row, first_row + n_done) * r).astype(np.int64)
    rows = rope_fn(rows, positions)
    return finish(rows), new_kv, new_sc


# ---- attention -------------------------------------------------------------------------------------


def _indexer_slots(c: ModelConfig, iq: mx.array, iw: mx.array, keys: mx.array,
                   n_vis: np.ndarray, trace_masks: list | None) -> tuple[mx.array, mx.array]:
    """Per-query compressed-row slots for a ratio-4 layer (§4.5): (idx [nb, K] int32 rows in
    ascending order, valid [nb, K] bool). Queries that see <= K rows get rows 0..K-1 (masked
    beyond what they see); the others get exactly the top K by indexer score, ties to the lower
    row, as a set in row order."""
    K = c.indexer_top_k
    C = keys.shape[0]
    nb = len(n_vis)
    ar_k = np.arange(K)
    base_idx = mx.array(np.broadcast_to(np.minimum(ar_k, max(C - 1, 0)), (nb, K)).astype(np.int32))
    base_valid = mx.array(ar_k[None, :] < n_vis[:, None])
    prune = n_vis > K
    if not prune.any():
        if trace_masks is not None:
            trace_masks.append(np.arange(C)[None, :] < n_vis[:, None])
        return base_idx, base_valid
    Hi = c.indexer_heads
    s = (iq.reshape(nb * Hi, -1) @ keys.T).reshape(nb, Hi, C)
    score = mx.sum(mx.maximum(s, 0.0) * iw[:, :, None], axis=1)  # [nb, C]
    ar_c = np.arange(C)
    visible = mx.array(ar_c[None, :] < n_vis[:, None])
    score = mx.where(visible, score, NEG_INF)
    vk = mx.sort(score, axis=-1)[:, C - K][:, None]  # K-th largest (finite where pruning)
    gt = score > vk
    eq = score == vk
    need = K - mx.sum(gt.astype(mx.int32), axis=-1, keepdims=True)
    rank = mx.cumsum(eq.astype(mx.int32), axis=-1)
    mask = gt | (eq & (rank <= need))
    mask = mask & visible
    ar_c_mx = mx.array(ar_c.astype(np.int32))
    key = mx.where(mask, ar_c_mx, ar_c_mx + C)
    sel = mx.sort(key, axis=-1)[:, :K]
    pr = mx.array(prune)[:, None]
    idx = mx.where(pr, sel, base_idx)
    valid = mx.where(pr, True, base_valid)
    if trace_masks is not None:
        m = to_host(mask)
        m[~prune] = (ar_c[None, :] < n_vis[:, None])[~prune]
        trace_masks.append(m)
    return idx.astype(mx.int32), valid


def attention_core(c: ModelConfig, q: mx.array, k_all: mx.array, r0: int, p0: int,
                   sinks: mx.array, comp: mx.array | None, ratio: int,
                   index_inputs=None, trace_masks: list | None = None) -> mx.array:
    """Attention of chunk queries q [n, H, Dh] (§4.3 step 7) -> o [n, H, Dh].

    k_all [r0 + n, Dh]: the previous raw window (r0 rows, positions p0-r0..p0-1) followed by the
    chunk's rows. comp: all compressed rows after this chunk (or None). index_inputs (ratio 4):
    (iq [n, Hi, Di] after qat, weights [n, Hi], index rows [C, Di]) or None before pruning can
    start.
    """
    n, H, Dh = q.shape
    W = c.window
    scale = mx.array(1.0 / math.sqrt(Dh), dtype=F32)
    C = 0 if comp is None else comp.shape[0]
    sink = sinks.reshape(1, H, 1)
    qb = _QUERY_BLOCK
    if ratio == 4 and index_inputs is not None and C:
        per_query = c.indexer_heads * C * 4 * 2  # [Hi, C] f32 scores and their relu·w product
        qb = max(1, min(qb, _INDEX_SCORE_BUDGET // max(per_query, 1)))
    comp_pad = None
    if C and ratio != 4:
        nblk = -(-C // _COMP_BLOCK)
        pad = nblk * _COMP_BLOCK - C
        comp_pad = mx.concatenate([comp, mx.zeros((pad, Dh), dtype=F32)], axis=0) if pad else comp
    outs = []
    for i0 in range(0, n, qb):
        i1 = min(n, i0 + qb)
        nb = i1 - i0
        qi = q[i0:i1]
        pos = np.arange(p0 + i0, p0 + i1)
        # raw window: slot j of query i holds k_all row i + j + r0 - W + 1 (position p-W+1+j)
        idx = np.arange(i0, i1)[:, None] + np.arange(W)[None, :] + (r0 - W + 1)
        valid = idx >= 0
        kb = k_all[mx.array(np.maximum(idx, 0).astype(np.int32))]  # [nb, W, Dh]
        s_raw = (qi @ mx.swapaxes(kb, -1, -2)) * scale  # [nb, H, W]
        s_raw = mx.where(mx.array(valid)[:, None, :], s_raw, NEG_INF)
        m = mx.maximum(mx.max(s_raw, axis=-1, keepdims=True), sink)
        n_vis = (pos + 1) // ratio if ratio else None
        s_c = kc = None
        if C and ratio == 4:
            if index_inputs is not None:
                iq, iw, keys = index_inputs
                cidx, cvalid = _indexer_slots(c, iq[i0:i1], iw[i0:i1], keys, n_vis, trace_masks)
            else:
                cidx, cvalid = _indexer_slots(c, None, None, comp, n_vis, trace_masks)
            kc = comp[cidx]  # [nb, K, Dh]
            s_c = (qi @ mx.swapaxes(kc, -1, -2)) * scale
            s_c = mx.where(cvalid[:, None, :], s_c, NEG_INF)
            m = mx.maximum(m, mx.max(s_c, axis=-1, keepdims=True))
        elif C:
            cpad = comp_pad.shape[0]
            s_c = (qi.reshape(nb * H, Dh) @ comp_pad.T).reshape(nb, H, cpad) * scale
            cvalid = mx.array(np.arange(cpad)[None, :] < n_vis[:, None])
            s_c = mx.where(cvalid[:, None, :], s_c, NEG_INF)
            m = mx.maximum(m, mx.max(s_c, axis=-1, keepdims=True))
        e_raw = mx.exp(s_raw - m)
        denom = mx.exp(sink - m) + mx.sum(e_raw, axis=-1, keepdims=True)
        o = e_raw @ kb  # [nb, H, Dh]
        if s_c is not None and ratio == 4:
            e_c = mx.exp(s_c - m)
            denom = denom + mx.sum(e_c, axis=-1, keepdims=True)
            o = o + e_c @ kc
        elif s_c is not None:
            e_c = mx.exp(s_c - m)
            for b0 in range(0, comp_pad.shape[0], _COMP_BLOCK):
                eb = e_c[:, :, b0:b0 + _COMP_BLOCK]
                denom = denom + mx.sum(eb, axis=-1, keepdims=True)
                o = o + (eb.reshape(nb * H, _COMP_BLOCK) @ comp_pad[b0:b0 + _COMP_BLOCK]).reshape(nb, H, Dh)
        outs.append(o / denom)
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)


def _attn_front(aw: AttentionWeights, c: ModelConfig, rounding: bool, x: mx.array, cos: mx.array,
                sin: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """The attention input's norms and projections: (a, q_a rows, roped q, roped kv row)."""
    n, eps = x.shape[0], c.rms_eps
    a = ops.rms_norm(x, aw.norm, eps)
    qr = ops.rms_norm(aw.q_a(a), aw.q_a_norm, eps)
    q = ops.rms_norm(aw.q_b(qr).reshape(n, c.n_heads, c.head_dim), None, eps)
    kv = ops.rms_norm(aw.kv(a), aw.kv_norm, eps)
    q = ops.rope_tail(q, cos[:, None, :], sin[:, None, :])
    kv = ops.rope_tail(kv, cos, sin)
    if rounding:
        kv = ops.f16_round(ops.fp8sim(kv, c.nope_dim))
    return a, qr, q, kv


# The GPU kernel set's _attn_front, one compiled function per layer's weights (captured as
# constants; kept alive beside their function, as _HC_PRE does).
_ATTN_FRONT: dict[tuple[int, bool], tuple[AttentionWeights, object]] = {}


def _attn_front_fused(aw: AttentionWeights, c: ModelConfig, rounding: bool):
    key = (id(aw), rounding)
    hit = _ATTN_FRONT.get(key)
    if hit is None or hit[0] is not aw:
        hit = _ATTN_FRONT[key] = (aw, ops.fused(lambda x, cos, sin: _attn_front(aw, c, rounding, x, cos, sin)))
    return hit[1]


def attention_block(aw: AttentionWeights, c: ModelConfig, layer: int, x: mx.array,
                    lay: LayerState, p0: int, rounding: bool,
                    trace: Trace | None, profile: Profile | None = None) -> tuple[mx.array, LayerState]:
    """Attention sublayer on the HC-pre input x [n, E] -> (y [n, E], new layer state)."""
    n = x.shape[0]
    Dh, Dn, W = c.head_dim, c.nope_dim, c.window
    r = c.ratios[layer]
    eps = c.rms_eps
    rope = _rope(c)
    positions = np.arange(p0, p0 + n)
    cos, sin = rope.tables(r != 0, positions)

    def rope_rows(rows: mx.array, pos: np.ndarray) -> mx.array:
        cs, sn = rope.tables(r != 0, pos)
        return ops.rope_tail(rows, cs, sn)

    if gpu_kernels():
        a, qr, q, kv = _attn_front_fused(aw, c, rounding)(x, cos, sin)
    else:
        a, qr, q, kv = _attn_front(aw, c, rounding, x, cos, sin)
    r0 = lay.raw.shape[0]
    k_all = mx.concatenate([lay.raw, kv], axis=0) if r0 else kv
    new_raw = k_all[-min(W, p0 + n):]

    comp = None
    new = {"raw": new_raw}
    index_inputs = None
    masks: list | None = None
    if r != 0:
        def finish_attn(rows: mx.array) -> mx.array:
            return ops.f16_round(ops.fp8sim(rows, Dn)) if rounding else rows

        rows, akv, asc = _call(profile, "compressors+indexer", compressor_step, aw.compressor, a, p0, r,
                               Dh, lay.attn_kv, lay.attn_score, norm_eps=eps, rope_fn=rope_rows,
                               finish=finish_attn)
        comp = mx.concatenate([lay.comp, rows], axis=0) if rows.shape[0] else lay.comp
        new.update(comp=comp, attn_kv=akv, attn_score=asc)
        if r == 4:
            iw_ = aw.indexer

            def finish_index(rows: mx.array) -> mx.array:
                y = ops.qat(rows, rounding)
                return ops.f16_round(y) if rounding else y

            irows, ikv, isc = _call(profile, "compressors+indexer", compressor_step, iw_.compressor, a,
                                    p0, 4, c.indexer_dim, lay.index_kv, lay.index_score, norm_eps=eps,
                                    rope_fn=rope_rows, finish=finish_index)
            icomp = mx.concatenate([lay.index_comp, irows], axis=0) if irows.shape[0] else lay.index_comp
            new.update(index_comp=icomp, index_kv=ikv, index_score=isc)
            if (p0 + n) // 4 > c.indexer_top_k:  # some query of this chunk prunes
                Hi, Di = c.indexer_heads, c.indexer_dim
                iq = iw_.q_b(qr).reshape(n, Hi, Di)
                iq = ops.qat(ops.rope_tail(iq, cos[:, None, :], sin[:, None, :]), rounding)
                wscale = mx.array(1.0 / math.sqrt(Di * Hi), dtype=F32)
                iweights = iw_.proj(a) * wscale
                index_inputs = (iq, iweights, icomp)
            if trace is not None:
                masks = trace.indexer.setdefault(layer, [])
    o = attention_core(c, q, k_all, r0, p0, aw.sinks, comp, r, index_inputs, masks)
    o = ops.rope_tail(o, cos[:, None, :], sin[:, None, :], inverse=True)
    G, hpg = c.out_groups, c.heads_per_group
    if gpu_kernels() and aw.out_a_all is not None:
        z = aw.out_a_all.grouped(o.reshape(n, G, hpg * Dh))
    else:
        z = mx.concatenate([aw.out_a[g](o[:, g * hpg:(g + 1) * hpg].reshape(n, hpg * Dh)) for g in range(G)],
                           axis=-1)
    y = aw.out_b(z)
    return y, LayerState(**new)


# ---- MoE -------------------------------------------------------------------------------------------


def _top_u(score: mx.array, U: int) -> mx.array:
    """Indices [n, U] of the U largest entries per row, by descending score, ties to the lower
    index (exact: U rounds of max + lowest index attaining it).

    GPU kernel set: one sort instead of 4·U small ops. Its ids are a permutation's, so always
    in 0..n_experts-1, even for NaN scores (where the exact rounds would give n_experts);
    exact ties (measure zero for real scores) may pick either index."""
    if gpu_kernels():
        return mx.argsort(-score, axis=-1)[:, :U].astype(mx.int32)
    ne = score.shape[-1]
    ar = mx.arange(ne, dtype=mx.int32)
    picks = []
    s = score
    for _ in range(U):
        m = mx.max(s, axis=-1, keepdims=True)
        j = mx.min(mx.where(s == m, ar, ne), axis=-1)
        picks.append(j)
        s = mx.where(ar[None, :] == j[:, None], NEG_INF, s)
    return mx.stack(picks, axis=-1)


def _route(fw: FFNWeights, c: ModelConfig, layer: int, h: mx.array,
           tokens: mx.array) -> tuple[mx.array, mx.array]:
    """Router (§4.6): (selected experts [n, U] int32, their weights [n, U])."""
    U = c.n_experts_used
    prob = mx.sqrt(ops.softplus(fw.gate_inp(h)))
    if c.is_hash_layer(layer):
        sel = fw.tid2eid[tokens]  # router bias unused on hash layers
    else:
        sel = _top_u(prob + fw.bias if fw.bias is not None else prob, U)
    sel = sel.astype(mx.int32)
    pw = mx.take_along_axis(prob, sel, axis=-1)  # [n, U]
    if gpu_kernels():
        total = mx.sum(pw, axis=-1)
    else:
        total = pw[:, 0]
        for k in range(1, U):  # selection order
            total = total + pw[:, k]
    return sel, pw / mx.maximum(total, 6.103515625e-5)[:, None] * c.expert_weights_scale


def _routed(fw: FFNWeights, U: int, clamp: float, h: mx.array, sel: mx.array, wts: mx.array) -> mx.array:
    both = None
    if gpu_kernels() and hasattr(fw.gate_exps, "gather_matmul_with"):
        both = fw.gate_exps.gather_matmul_with(fw.up_exps, h, sel)
    if both is not None:
        g, u = both
    else:
        g = fw.gate_exps.gather_matmul(h, sel)
        u = fw.up_exps.gather_matmul(h, sel)
    mid = ops.swiglu(g, u, clamp) * wts[:, :, None]  # [n, U, F]
    down = fw.down_exps.gather_matmul(mid, sel)  # [n, U, E]
    if gpu_kernels():
        return mx.sum(down, axis=1)
    routed = down[:, 0]
    for k in range(1, U):  # selection order
        routed = routed + down[:, k]
    return routed


def _shared(fw: FFNWeights, clamp: float, h: mx.array) -> mx.array:
    return fw.down_shexp(ops.swiglu(fw.gate_shexp(h), fw.up_shexp(h), clamp))


# The GPU kernel set's FFN norm and router, one compiled function per layer (as _HC_PRE).
_FFN_FRONT: dict[tuple[int, int], tuple[FFNWeights, object]] = {}


def _ffn_front_fused(fw: FFNWeights, c: ModelConfig, layer: int):
    key = (id(fw), layer)
    hit = _FFN_FRONT.get(key)
    if hit is None or hit[0] is not fw:

        def front(x: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            h = ops.rms_norm(x, fw.norm, c.rms_eps)
            return (h, *_route(fw, c, layer, h, tokens))

        hit = _FFN_FRONT[key] = (fw, ops.fused(front))
    return hit[1]


def ffn_block(fw: FFNWeights, c: ModelConfig, layer: int, x: mx.array, tokens: mx.array,
              trace: Trace | None, profile: Profile | None = None) -> mx.array:
    """MoE sublayer (§4.6) on the HC-pre input x [n, E] -> y [n, E]."""
    U = c.n_experts_used
    clamp = c.swiglu_clamp[layer]
    if gpu_kernels() and profile is None:
        h, sel, wts = _ffn_front_fused(fw, c, layer)(x, tokens)
    else:
        h = ops.rms_norm(x, fw.norm, c.rms_eps)
        sel, wts = _call(profile, "router", _route, fw, c, layer, h, tokens)
    if trace is not None:
        trace.experts.setdefault(layer, []).append(to_host(sel))
        trace.expert_weights.setdefault(layer, []).append(to_host(wts))
    routed = _call(profile, "routed experts", _routed, fw, U, clamp, h, sel, wts)
    shared = _call(profile, "shared expert", _shared, fw, clamp, h)
    return routed + shared


# ---- whole model ------------------------------------------------------------------------------------


def output_head(w: ModelWeights, c: ModelConfig, R: mx.array) -> mx.array:
    """§4.7: HC head + output norm + output projection; R [n, hc, E] -> logits [n, V]."""
    if gpu_kernels():
        hit = _HEAD.get(id(w))
        if hit is None or hit[0] is not w:
            hit = _HEAD[id(w)] = (w, ops.fused(lambda R: _output_head(w, c, R)))
        return hit[1](R)
    return _output_head(w, c, R)


# The GPU kernel set's output head, compiled per model's weights (as _HC_PRE).
_HEAD: dict[int, tuple[ModelWeights, object]] = {}


def _output_head(w: ModelWeights, c: ModelConfig, R: mx.array) -> mx.array:
    n, hc, E = R.shape
    flat = ops.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)
    pre = w.head.fn(flat)
    wts = mx.sigmoid(pre * w.head.scale[0] + w.head.base) + c.hc_eps
    e = mx.sum(wts[:, :, None] * R, axis=1)
    return w.output(ops.rms_norm(e, w.output_norm, c.rms_eps))


def embed(weights: ModelWeights, c: ModelConfig, toks: mx.array) -> mx.array:
    """Token ids [n] -> the hyper-connection input R [n, hc, E] (f32; every stream = the embedding)."""
    x0 = weights.token_embd[toks].astype(F32)
    return mx.broadcast_to(x0[:, None, :], (toks.shape[0], c.hc_count, c.dim))


def run_layers(layer_weights: Sequence[LayerWeights], c: ModelConfig, layer_states: Sequence[LayerState],
               R: mx.array, toks: mx.array, p0: int, *, first_layer: int, rounding: bool = True,
               trace: Trace | None = None,
               profile: Profile | None = None) -> tuple[mx.array, tuple[LayerState, ...]]:
    """Layers first_layer.. (as many as `layer_weights`) on R [n, hc, E] at positions p0..:
    (R after them, their new states). `forward` runs every layer through this; a pipeline rank
    runs its own contiguous range (engine/pipeline/), so both run the same per-layer math."""
    n = R.shape[0]
    new_layers = []
    for li, (lw, lay) in enumerate(zip(layer_weights, layer_states, strict=True), start=first_layer):
        x, post, C = _call(profile, "hyper-connections", hc_pre, lw.hc_attn, R, c)
        y, new_lay = _call(profile, "attention", attention_block, lw.attn, c, li, x, lay, p0, rounding,
                           trace, profile)
        R = _call(profile, "hyper-connections", hc_post, R, y, post, C)
        x, post, C = _call(profile, "hyper-connections", hc_pre, lw.hc_ffn, R, c)
        y = _call(profile, "ffn (norm, sum)", ffn_block, lw.ffn, c, li, x, toks, trace, profile)
        R = _call(profile, "hyper-connections", hc_post, R, y, post, C)
        new_layers.append(new_lay)
        if n > 1:
            # Prefill: materialise layer by layer (bounded graph and memory); decode builds the
            # whole token as one graph.
            mx.eval(R, *new_lay.arrays())
    return R, tuple(new_layers)


def forward(weights: ModelWeights, config: ModelConfig, state: SessionState,
            tokens: Sequence[int] | mx.array, *, rounding: bool = True, last_only: bool = False,
            trace: Trace | None = None, profile: Profile | None = None) -> tuple[mx.array, SessionState]:
    """Append `tokens` to `state`: (logits [n, V] float32, new state).

    logits row i = logits after token i (last_only: only the last row, shape [1, V]).
    `rounding=False` turns off the three rounding simulations (f16 rows, fp8sim, fp4 of qat):
    a test-only switch for oracle comparisons of deep configs (model.md §10). `trace` collects
    indexer masks and expert selections for tests.
    """
    c = config
    tok_list = check_token_ids(to_host(tokens).reshape(-1).tolist() if isinstance(tokens, mx.array)
                               else tokens, c.vocab)
    n = len(tok_list)
    if n == 0:
        return mx.zeros((0, c.vocab), dtype=F32), state
    toks = mx.array(np.asarray(tok_list, dtype=np.int32))
    logits, new_layers = build(weights, c, state, toks, rounding=rounding, last_only=last_only,
                               trace=trace, profile=profile)
    new_state = SessionState(tokens=state.tokens + tuple(tok_list), logits=logits[-1],
                             layers=new_layers)
    mx.eval(logits, *new_state.arrays())
    return logits, new_state


def build(weights: ModelWeights, config: ModelConfig, state: SessionState, toks: mx.array, *,
          rounding: bool = True, last_only: bool = False, trace: Trace | None = None,
          profile: Profile | None = None) -> tuple[mx.array, tuple[LayerState, ...]]:
    """The graph of `forward` over device token ids toks [n] int32: (logits, new layer states),
    unevaluated for decode (n = 1; prefill evaluates layer by layer in run_layers). Reads no
    id back: decode.py passes the sampler's lazy id straight in. The caller guarantees the ids
    are in the vocabulary (the sampler can only draw such ids; `forward` checks host lists)."""
    c = config
    p0 = state.n_tokens
    R = embed(weights, c, toks)
    R, new_layers = run_layers(weights.layers, c, state.layers, R, toks, p0, first_layer=0,
                               rounding=rounding, trace=trace, profile=profile)
    logits = _call(profile, "head", output_head, weights, c, R[-1:] if last_only else R)
    return logits, new_layers
