"""The layer plan every executor shares (model.md §4): compressor, attention and MoE sublayers.

What differs between kernel sets (the primitives' form, the hyper-connection and router steps, the
expert and grouped products) is asked of the executor `ex` the functions take (executors/); what
is here is the same math for all of them, with the chunk-invariance layout of model.py's
docstring. Trace and Profile are the optional recorders a forward pass carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ds4agent.statelayout import FILL_KV, FILL_SCORE

from . import ops
from .config import ModelConfig
from .hostread import to_host
from .ops import OpSet
from .state import LayerState
from .weights import AttentionWeights, CompressorWeights, FFNWeights

F32 = mx.float32
NEG_INF = float("-inf")
_COMP_BLOCK = 64  # compressed rows per attention block on non-indexer layers (see model.py's doc)
QUERY_BLOCK = 256  # queries per attention block (bounds the gathered K/V memory)
INDEX_SCORE_BUDGET = 256 << 20  # bytes of indexer score temporaries per query block


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


def timed(profile: Profile | None, name: str, fn, *args, **kwargs):
    return fn(*args, **kwargs) if profile is None else profile.section(name, fn, *args, **kwargs)


class Rope:
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


_ROPE_CACHE: dict[ModelConfig, Rope] = {}


def rope_for(config: ModelConfig) -> Rope:
    """The config's RoPE tables (one Rope per config: a pure function of it)."""
    r = _ROPE_CACHE.get(config)
    if r is None:
        r = _ROPE_CACHE[config] = Rope(config)
    return r


# ---- compressor ------------------------------------------------------------------------------------


def _pool(kv: mx.array, sc: mx.array) -> mx.array:
    """Softmax-weighted pooling over axis 1 (the fixed candidate set) of [g, m, d] -> [g, d]."""
    M = mx.max(sc, axis=1, keepdims=True)
    e = mx.exp(sc - M)
    pooled = mx.sum(e * kv, axis=1) / mx.sum(e, axis=1)
    return mx.where(M[:, 0] <= -5e29, 0.0, pooled)


def compressor_step(xo: OpSet, cw: CompressorWeights, a: mx.array, p0: int, r: int, d: int,
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
    rows = xo.rms_norm(pooled, cw.norm, norm_eps)
    positions = (np.arange(first_row, first_row + n_done) * r).astype(np.int64)
    rows = rope_fn(rows, positions)
    return finish(rows), new_kv, new_sc


# ---- attention -------------------------------------------------------------------------------------


def index_scores(iq: mx.array, iw: mx.array, keys: mx.array) -> mx.array:
    """The indexer's scores [nb, C] of queries iq [nb, Hi, Di] (head weights iw [nb, Hi]) over the
    index rows keys [C, Di]: the sum over heads of relu(q_h . key) * w_h."""
    nb, Hi, _ = iq.shape
    s = (iq.reshape(nb * Hi, -1) @ keys.T).reshape(nb, Hi, keys.shape[0])
    return mx.sum(mx.maximum(s, 0.0) * iw[:, :, None], axis=1)


def indexer_slots(c: ModelConfig, iq: mx.array | None, iw: mx.array | None, keys: mx.array,
                   n_vis: np.ndarray, trace_masks: list | None) -> tuple[mx.array, mx.array]:
    """Per-query compressed-row slots for a ratio-4 layer (§4.5): (idx [nb, K] int32 rows in
    ascending order, valid [nb, K] bool). Queries that see <= K rows get rows 0..K-1 (masked
    beyond what they see); the others get exactly the top K by indexer score, ties to the lower
    row, as a set in row order (fast_attention.top_rows is the fast set's form of the rule)."""
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
    assert iq is not None and iw is not None  # a query prunes only once index_inputs exist
    score = index_scores(iq, iw, keys)  # [nb, C]
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
    qb = QUERY_BLOCK
    if ratio == 4 and index_inputs is not None and C:
        per_query = c.indexer_heads * C * 4 * 2  # [Hi, C] f32 scores and their relu·w product
        qb = max(1, min(qb, INDEX_SCORE_BUDGET // max(per_query, 1)))
    comp_pad = None
    if C and ratio != 4:
        assert comp is not None  # C > 0
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
        n_vis = (pos + 1) // ratio if ratio else np.zeros_like(pos)
        s_c = kc = None
        if C and ratio == 4:
            assert comp is not None  # C > 0
            if index_inputs is not None:
                iq, iw, keys = index_inputs
                cidx, cvalid = indexer_slots(c, iq[i0:i1], iw[i0:i1], keys, n_vis, trace_masks)
            else:
                cidx, cvalid = indexer_slots(c, None, None, comp, n_vis, trace_masks)
            kc = comp[cidx]  # [nb, K, Dh]
            s_c = (qi @ mx.swapaxes(kc, -1, -2)) * scale
            s_c = mx.where(cvalid[:, None, :], s_c, NEG_INF)
            m = mx.maximum(m, mx.max(s_c, axis=-1, keepdims=True))
        elif C:
            assert comp_pad is not None  # C > 0 and ratio != 4
            cpad = comp_pad.shape[0]
            s_c = (qi.reshape(nb * H, Dh) @ comp_pad.T).reshape(nb, H, cpad) * scale
            cvalid = mx.array(np.arange(cpad)[None, :] < n_vis[:, None])
            s_c = mx.where(cvalid[:, None, :], s_c, NEG_INF)
            m = mx.maximum(m, mx.max(s_c, axis=-1, keepdims=True))
        e_raw = mx.exp(s_raw - m)
        denom = mx.exp(sink - m) + mx.sum(e_raw, axis=-1, keepdims=True)
        o = e_raw @ kb  # [nb, H, Dh]
        if s_c is not None and ratio == 4:
            assert kc is not None  # set with s_c
            e_c = mx.exp(s_c - m)
            denom = denom + mx.sum(e_c, axis=-1, keepdims=True)
            o = o + e_c @ kc
        elif s_c is not None:
            assert comp_pad is not None  # as above
            e_c = mx.exp(s_c - m)
            for b0 in range(0, comp_pad.shape[0], _COMP_BLOCK):
                eb = e_c[:, :, b0:b0 + _COMP_BLOCK]
                denom = denom + mx.sum(eb, axis=-1, keepdims=True)
                o = o + (eb.reshape(nb * H, _COMP_BLOCK) @ comp_pad[b0:b0 + _COMP_BLOCK]).reshape(nb, H, Dh)
        outs.append(o / denom)
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)


def attention_block(ex, aw: AttentionWeights, c: ModelConfig, layer: int, x: mx.array,
                    lay: LayerState, p0: int, rounding: bool,
                    trace: Trace | None, profile: Profile | None = None) -> tuple[mx.array, LayerState]:
    """Attention sublayer on the HC-pre input x [n, E] -> (y [n, E], new layer state), on the
    executor `ex` (its kernel set's primitives, front and output projection)."""
    xo = ex.ops
    n = x.shape[0]
    Dh, Dn, W = c.head_dim, c.nope_dim, c.window
    r = c.ratios[layer]
    eps = c.rms_eps
    rope = rope_for(c)
    positions = np.arange(p0, p0 + n)
    cos, sin = rope.tables(r != 0, positions)

    def rope_rows(rows: mx.array, pos: np.ndarray) -> mx.array:
        cs, sn = rope.tables(r != 0, pos)
        return xo.rope_tail(rows, cs, sn)

    a, qr, q, kv = ex.attn_front(aw, c, rounding, x, cos, sin)
    r0 = lay.raw.shape[0]
    k_all = mx.concatenate([lay.raw, kv], axis=0) if r0 else kv
    new_raw = k_all[-min(W, p0 + n):]

    comp = None
    new = {"raw": new_raw}
    index_inputs = None
    masks: list | None = None
    if r != 0:
        # A compressed layer has a compressor and its state; a ratio-4 layer an indexer too.
        assert aw.compressor is not None and lay.comp is not None and lay.attn_kv is not None
        assert lay.attn_score is not None

        def finish_attn(rows: mx.array) -> mx.array:
            return ops.f16_round(xo.fp8sim(rows, Dn)) if rounding else rows

        rows, akv, asc = timed(profile, "compressors+indexer", compressor_step, xo, aw.compressor, a, p0, r,
                               Dh, lay.attn_kv, lay.attn_score, norm_eps=eps, rope_fn=rope_rows,
                               finish=finish_attn)
        comp = mx.concatenate([lay.comp, rows], axis=0) if rows.shape[0] else lay.comp
        new.update(comp=comp, attn_kv=akv, attn_score=asc)
        if r == 4:
            iw_ = aw.indexer
            assert iw_ is not None and lay.index_comp is not None and lay.index_kv is not None
            assert lay.index_score is not None

            def finish_index(rows: mx.array) -> mx.array:
                y = xo.qat(rows, rounding)
                return ops.f16_round(y) if rounding else y

            irows, ikv, isc = timed(profile, "compressors+indexer", compressor_step, xo, iw_.compressor, a,
                                    p0, 4, c.indexer_dim, lay.index_kv, lay.index_score, norm_eps=eps,
                                    rope_fn=rope_rows, finish=finish_index)
            icomp = mx.concatenate([lay.index_comp, irows], axis=0) if irows.shape[0] else lay.index_comp
            new.update(index_comp=icomp, index_kv=ikv, index_score=isc)
            if (p0 + n) // 4 > c.indexer_top_k:  # some query of this chunk prunes
                Hi, Di = c.indexer_heads, c.indexer_dim
                iq = iw_.q_b(qr).reshape(n, Hi, Di)
                iq = xo.qat(xo.rope_tail(iq, cos, sin), rounding)
                wscale = mx.array(1.0 / math.sqrt(Di * Hi), dtype=F32)
                iweights = iw_.proj(a) * wscale
                index_inputs = (iq, iweights, icomp)
            if trace is not None:
                masks = trace.indexer.setdefault(layer, [])
    o = ex.attend(c, q, k_all, r0, p0, aw.sinks, comp, r, index_inputs, masks)
    o = xo.rope_tail(o, cos, sin, inverse=True)
    z = ex.out_a(aw, o.reshape(n, c.out_groups, c.heads_per_group * Dh))
    y = aw.out_b(z)
    return y, LayerState(**new)


# ---- MoE ----------------------------------------------------------------------------------------


def ffn_block(ex, fw: FFNWeights, c: ModelConfig, layer: int, x: mx.array, tokens: mx.array,
              trace: Trace | None, profile: Profile | None = None) -> mx.array:
    """MoE sublayer (§4.6) on the HC-pre input x [n, E] -> y [n, E], on the executor `ex`."""
    U = c.n_experts_used
    clamp = c.swiglu_clamp[layer]
    if profile is None:
        h, sel, wts = ex.ffn_front(fw, c, layer, x, tokens)
    else:  # the norm and the router as their own sections
        h = ex.ops.rms_norm(x, fw.norm, c.rms_eps)
        sel, wts = timed(profile, "router", ex.route, fw, c, layer, h, tokens)
    if trace is not None:
        trace.experts.setdefault(layer, []).append(to_host(sel))
        trace.expert_weights.setdefault(layer, []).append(to_host(wts))
    routed = timed(profile, "routed experts", ex.routed, fw, U, clamp, h, sel, wts)
    shared = timed(profile, "shared expert", ex.shared, fw, clamp, h)
    return routed + shared
