"""SessionState: counts, canonical frontier filler, payload conversion both ways (model.md §8,
§10 items 3-5; kvc-format.md §9.4)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from ds4agent.engine import StateError
from ds4agent.engine.config import test_config
from ds4agent.engine.model import forward
from ds4agent.engine.state import SessionState, from_payload, to_payload
from ds4agent.sessions.payload import LayerPayload, PayloadState
from ds4agent.testmodels.random_weights import random_weights


@lru_cache(maxsize=1)
def _setup():
    cfg = test_config("micro")
    w = random_weights(cfg, 5)
    toks = np.random.default_rng(2).integers(0, cfg.vocab, 50).tolist()
    return cfg, w, toks


@pytest.mark.parametrize("T", [0, 3, 8, 10, 16, 22, 50])
def test_counts_window_and_canonical_filler(T):
    cfg, w, toks = _setup()
    state = SessionState.empty(cfg)
    if T:
        _, state = forward(w, cfg, state, toks[:T])
    p = to_payload(state, cfg, ctx=64)
    assert p.tokens.dtype == np.uint32 and p.tokens.tolist() == toks[:T]
    for li, lay in enumerate(p.layers):
        r = cfg.ratios[li]
        assert lay.raw.shape == (min(T, cfg.window), cfg.head_dim)
        if r == 0:
            assert lay.comp is None and lay.attn_kv is None
            continue
        assert lay.comp.shape == (T // r, cfg.head_dim)
        rows = 8 if r == 4 else r
        live = np.zeros(rows, dtype=bool)
        if r == 4:
            live[4:4 + T % 4] = True
            live[:4] = T >= 4
        else:
            live[: T % r] = True
        assert np.all(lay.attn_kv[~live] == 0.0) and np.all(lay.attn_score[~live] == -1.0e30)
        assert np.all(lay.attn_score[live] > -1e29)
        # stored rows are F16-exact
        assert np.array_equal(lay.raw, lay.raw.astype(np.float16).astype(np.float32))
        assert np.array_equal(lay.comp, lay.comp.astype(np.float16).astype(np.float32))
        if r == 4:
            assert lay.index_comp.shape == (T // 4, cfg.indexer_dim)
            assert np.all(lay.index_score[~live] == -1.0e30)
    if T:
        assert np.array_equal(np.array(state.logits), p.logits)
        last_raw = p.layers[0].raw[-1]
        assert last_raw.shape == (cfg.head_dim,)


@pytest.mark.parametrize("T", [0, 9, 21, 33])
def test_payload_round_trip_then_continue_equals_uninterrupted(T):
    cfg, w, toks = _setup()
    full, s_full = forward(w, cfg, SessionState.empty(cfg), toks)
    state = SessionState.empty(cfg)
    if T:
        _, state = forward(w, cfg, state, toks[:T])
    # through the real contract dataclasses (the engine itself only duck-types them)
    p = to_payload(state, cfg, ctx=64, payload_cls=PayloadState, layer_cls=LayerPayload)
    assert isinstance(p, PayloadState)
    back = from_payload(p, cfg)
    rest, s_rest = forward(w, cfg, back, toks[T:])
    assert np.array_equal(np.array(rest), np.array(full)[T:])
    q1 = to_payload(s_rest, cfg, ctx=64)
    q2 = to_payload(s_full, cfg, ctx=64)
    for a, b in zip(q1.layers, q2.layers, strict=True):
        for name in ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or np.array_equal(x, y), name


def test_import_canonicalises_stale_frontier_rows_and_rejects_bad_shapes():
    cfg, w, toks = _setup()
    _, state = forward(w, cfg, SessionState.empty(cfg), toks[:10])
    p = to_payload(state, cfg, ctx=64)
    # ds4 may leave stale values beyond the partial window: readers must not depend on them
    p.layers[3].attn_kv[12:] = 123.0
    p.layers[3].attn_score[12:] = 7.0
    back = from_payload(p, cfg)
    assert np.all(np.array(back.layers[3].attn_kv)[10:] == 0.0)
    assert np.all(np.array(back.layers[3].attn_score)[10:] == -1.0e30)
    bad = to_payload(state, cfg, ctx=64)
    bad.layers[2].comp = bad.layers[2].comp[:1]
    with pytest.raises(StateError, match="layer 2 comp"):
        from_payload(bad, cfg)
    bad = to_payload(state, cfg, ctx=64)
    bad.tokens = np.array([cfg.vocab] * 10, dtype=np.uint32)
    with pytest.raises(StateError, match="token id"):
        from_payload(bad, cfg)
    bad = to_payload(state, cfg, ctx=64)
    bad.logits[3] = np.nan
    with pytest.raises(StateError, match="logits"):
        from_payload(bad, cfg)
