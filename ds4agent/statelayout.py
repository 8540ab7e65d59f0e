"""The DSV4 session state's per-layer arrays: their names, order and shapes, and the frontier filler.

One fact that two rooms need and neither may import from the other: the engine holds these
arrays in memory (engine/state.py: LayerState derives its layout and byte size from here) and the
session store writes them to disk in this order (sessions/payload.py, kvc-format.md §9.3). Pure
Python on the ground floor, like fsutil, so both derive from it instead of restating it.

Per layer of compress ratio r after T tokens (model.md §8), with R = raw rows (min(T, window)):

    raw          [R, Dh]              the sliding window of raw KV rows, in logical order
    comp         [T // r, Dh]         compressed rows                        (r != 0)
    attn_kv      [coff·r, coff·Dh]    compressor frontier projections        (r != 0)
    attn_score   [coff·r, coff·Dh]    frontier scores                        (r != 0)
    index_comp   [T // 4, Di]         indexer rows                           (r == 4)
    index_kv     [coff·4, coff·Di]    indexer frontier                       (r == 4)
    index_score  [coff·4, coff·Di]                                           (r == 4)

coff (compressor lanes) is 2 for ratio 4 (overlapping windows), else 1; the lightning indexer
exists iff the ratio is 4 (model.md §1).
"""

from __future__ import annotations

FIELDS = ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score")
# Rows that only grow, one per token (raw: up to the window) or per compressed group.
GROWING = ("raw", "comp", "index_comp")
# Frontier rows outside the current partial window hold this canonical filler (kvc-format.md
# §9.4): readers never look at them, but fixed values make equal states equal byte for byte.
# -1e30, not -inf: ds4's softmax over the scores must stay finite.
FILL_KV = 0.0
FILL_SCORE = -1.0e30
FILLER = {"attn_kv": FILL_KV, "attn_score": FILL_SCORE, "index_kv": FILL_KV, "index_score": FILL_SCORE}


def coff(ratio: int) -> int:
    """Compressor lanes of a layer: 2 for ratio 4, 1 for any other ratio."""
    return 2 if ratio == 4 else 1


def layer_arrays(ratio: int, head_dim: int, indexer_dim: int, n_tokens: int,
                 raw_rows: int) -> list[tuple[str, int, int]]:
    """(field, rows, columns) of one layer's arrays, in FIELDS order (the ones the layer has)."""
    D, Di, r = head_dim, indexer_dim, ratio
    arrays = [("raw", raw_rows, D)]
    if r:
        c = coff(r)
        n = n_tokens // r
        arrays += [("comp", n, D), ("attn_kv", c * r, c * D), ("attn_score", c * r, c * D)]
        if r == 4:
            arrays += [("index_comp", n, Di), ("index_kv", c * r, c * Di), ("index_score", c * r, c * Di)]
    return arrays


def frontier_live_rows(ratio: int, n_tokens: int) -> tuple[int, int]:
    """The rows [lo, hi) of a compressor frontier that hold values after n_tokens (the others
    hold the filler). Ratio 4 (the attention compressor and the indexer alike): rows 0..3 are
    the previous complete group once there is one, rows 4.. the partial group; any other ratio:
    the partial group's rows."""
    if ratio == 4:
        return (0 if n_tokens >= 4 else 4), 4 + n_tokens % 4
    return 0, n_tokens % ratio
