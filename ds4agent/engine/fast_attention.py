"""The fast CPU executor's attention core: each query over the rows it sees, on every core.

Same attention as layers.attention_core (model.md §4.3 step 7: the raw window, the compressed rows
visible at the query's position, for ratio-4 layers the indexer's top-k once it prunes, the sink
in the softmax), computed per (query, head) by a compiled kernel (fkernels.attend_units) over
exactly the rows the query sees. The reference instead gathers fixed-length slot sets (W raw
slots, K indexer slots) and masks the invisible ones, which keeps its float sums chunk-invariant
but, on the CPU, costs most of a decoded token and far more of a prefill chunk (a 64-query
ratio-4 block multiplied 512 slots per query while 16 were visible).

The fast set's contract (docs/numerics-fast-cpu.md): a query's output depends on that query and
its rows alone, in a fixed order (the raw slots oldest first, then the compressed rows in row
order), so decode equals a one-token prefill bit for bit and any chunk schedule gives the same
bits; against the reference it differs only by float reassociation (sums in another order).
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .layers import INDEX_SCORE_BUDGET, QUERY_BLOCK
from .qmatrix import SPLIT_LOCK, float_kernels, row_cuts


def index_scores(iq: np.ndarray, iw: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """layers.index_scores on host arrays, by the fast kernels (fkernels.index_scores: the dots in
    the dense lane order, the heads summed in head order; a (query, row) score the same in every
    chunk), the index rows spread over the threads. MLX's CPU matrix product took 43 ms a layer
    for one decoded token at 32K tokens of context (64 heads x 8,192 rows x 128); 21 such layers
    a token, and a prompt's chunk of 512 queries 512 times that."""
    qh, wh, kh = (np.ascontiguousarray(a, dtype=np.float32) for a in (iq, iw, keys))
    out = np.empty((qh.shape[0], kh.shape[0]), np.float32)
    with SPLIT_LOCK:
        float_kernels().index_scores_split(qh, wh, kh, out, row_cuts(kh.shape[0], qh.size * kh.shape[0]))
    return out


def top_rows(score: np.ndarray, n_vis: np.ndarray, K: int) -> np.ndarray:
    """layers.indexer_slots's selection for queries that see more than K rows, on host arrays:
    score [nb, C] f32, n_vis [nb] (each > K) -> [nb, K] rows in ascending order, the K largest
    scores among the rows a query sees, ties to the lower row. The same rule in O(C) per query (a
    partition, not a sort)."""
    C = score.shape[1]
    s = np.where(np.arange(C)[None, :] < n_vis[:, None], score, np.float32(-np.inf))
    kth = np.partition(s, C - K, axis=-1)[:, C - K, None]  # the K-th largest (finite: > K seen)
    above = s > kth
    tied = s == kth
    take = above | (tied & (np.cumsum(tied, axis=-1) <= K - above.sum(axis=-1, keepdims=True)))
    return np.nonzero(take)[1].reshape(-1, K)


def _comp_slots(c: ModelConfig, ratio: int, p0: int, n: int, comp: np.ndarray, base: int,
                index_inputs, trace_masks: list | None) -> np.ndarray:
    """[n, S] rows of the key table (compressed rows start at `base`) each query sees, -1 empty."""
    C = comp.shape[0]
    pos = np.arange(p0, p0 + n)
    n_vis = (pos + 1) // ratio
    if ratio != 4:
        cols = np.arange(int(n_vis.max()) if n else 0)
        return np.where(cols[None, :] < n_vis[:, None], cols[None, :] + base, -1)
    # ratio 4: the indexer's selection (layers.indexer_slots's rule, on the host: its MLX sorts and
    # masks, each read back at once, cost more than the scores), rows 0..K-1 masked beyond what a
    # query sees until it prunes, then its top K (top_rows), in query blocks of bounded memory.
    K = c.indexer_top_k
    ar_k = np.arange(K)
    rows = np.where(ar_k[None, :] < n_vis[:, None], ar_k[None, :], -1)
    pruning = np.flatnonzero(n_vis > K)
    if pruning.size:
        assert index_inputs is not None  # a query prunes only once index_inputs exist
        iq, iw, keys = (np.asarray(a, np.float32) for a in index_inputs)
        qb = max(1, min(QUERY_BLOCK, INDEX_SCORE_BUDGET // (C * 16)))
        for b0 in range(0, pruning.size, qb):
            which = pruning[b0:b0 + qb]
            rows[which] = top_rows(index_scores(iq[which], iw[which], keys), n_vis[which], K)
    if trace_masks is not None:
        mask = np.arange(C)[None, :] < n_vis[:, None]
        mask[pruning] = False
        mask[pruning[:, None], rows[pruning]] = True
        trace_masks.append(mask)
    return np.where(rows >= 0, rows + base, -1)


def _rows_seen(comp: np.ndarray, slots: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(the compressed rows some slot names, in row order; the slots renumbered into them from
    `base`, -1 kept). A long session's compressed table is far larger than what a chunk's queries
    see (a ratio-4 layer's query sees its indexer's top K rows: 512 of 8,192 at 32K tokens), and
    copying the whole table into the key table for every layer and token cost more than the
    attention itself. The renumbering keeps each query's rows in the same order, so the kernel
    adds the same values in the same order: the same bits."""
    seen = np.zeros(comp.shape[0] + 1, bool)
    seen[slots] = True  # -1 marks the spare last entry
    seen[-1] = False
    rows = np.flatnonzero(seen)
    if rows.shape[0] == comp.shape[0]:
        return comp, np.where(slots >= 0, slots + base, -1)
    number = np.cumsum(seen) - 1 + base
    return comp[rows], np.where(slots >= 0, number[slots], -1)


def attend(c: ModelConfig, q: np.ndarray, k_all: np.ndarray, r0: int, p0: int, sinks: np.ndarray,
           comp: np.ndarray | None, ratio: int, index_inputs=None, trace_masks: list | None = None) -> np.ndarray:
    """layers.attention_core's arguments and result, on host arrays: o [n, H, Dh] of queries
    q [n, H, Dh]."""
    n, H, D = (int(s) for s in q.shape)
    W = c.window
    raw = np.arange(n)[:, None] + np.arange(W)[None, :] + (r0 - W + 1)  # k_all rows, oldest first
    slots = np.where(raw >= 0, raw, -1)
    keys = np.asarray(k_all, np.float32)
    if comp is not None and comp.shape[0] and ratio:
        extra = _comp_slots(c, ratio, p0, n, comp, 0, index_inputs, trace_masks)
        comp_rows, extra = _rows_seen(np.asarray(comp, np.float32), extra, keys.shape[0])
        keys = np.concatenate([keys, comp_rows])
        slots = np.concatenate([slots, extra], axis=1)
    keys = np.ascontiguousarray(keys)
    qh = np.ascontiguousarray(q, np.float32)
    sh = np.ascontiguousarray(sinks, np.float32)
    slots = np.ascontiguousarray(slots, dtype=np.int32)
    out = np.empty((n, H, D), np.float32)
    scale = np.float32(1.0 / np.sqrt(np.float32(D)))
    with SPLIT_LOCK:
        float_kernels().attend_units_split(qh, keys, slots, sh, scale, out, row_cuts(n * H, n * H * slots.shape[1] * D * 2))
    return out
