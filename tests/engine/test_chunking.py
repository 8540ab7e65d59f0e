"""Chunk invariance (model.md §9, §10 items 2 and 6): any chunk schedule, including token by
token and one shot, gives bit-identical logits and state on CPU."""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine.config import test_config
from ds4agent.engine.model import forward
from ds4agent.engine.state import SessionState
from ds4agent.testmodels.random_weights import random_weights

N = 56  # micro: window 8, ratio-4 groups, ratio-16 rows 0..2, indexer pruning from p = 19


@lru_cache(maxsize=2)
def _setup(quantize_q8: bool):
    cfg = test_config("micro")
    w = random_weights(cfg, 7, quantize_q8=quantize_q8)
    toks = np.random.default_rng(11).integers(0, cfg.vocab, N).tolist()
    return cfg, w, toks


def _run_schedule(cfg, w, toks, sizes):
    state = SessionState.empty(cfg)
    rows = []
    i = 0
    for size in sizes:
        chunk = toks[i:i + size]
        if not chunk:
            break
        logits, state = forward(w, cfg, state, chunk)
        rows.append(np.array(logits))
        i += size
    assert i >= len(toks)
    return np.concatenate(rows), state


def _assert_states_equal(a: SessionState, b: SessionState):
    assert a.tokens == b.tokens
    assert np.array_equal(np.array(a.logits), np.array(b.logits))
    for la, lb in zip(a.layers, b.layers, strict=True):
        for name in ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score"):
            x, y = getattr(la, name), getattr(lb, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x.shape == y.shape, name
                assert np.array_equal(np.array(x), np.array(y)), name


@pytest.mark.parametrize("quantize_q8", [True, False])
def test_token_by_token_equals_one_shot_bit_for_bit(quantize_q8):
    cfg, w, toks = _setup(quantize_q8)
    one, s_one = _run_schedule(cfg, w, toks, [N])
    tbt, s_tbt = _run_schedule(cfg, w, toks, [1] * N)
    assert np.array_equal(one, tbt)
    _assert_states_equal(s_one, s_tbt)


@pytest.mark.parametrize("sizes", [[7] * 8, [3, 13, 1, 4, 16, 19], [20, 1, 35], [9, 10, 37]])
def test_odd_chunk_schedules_are_bit_identical(sizes):
    cfg, w, toks = _setup(True)
    one, s_one = _run_schedule(cfg, w, toks, [N])
    got, s_got = _run_schedule(cfg, w, toks, sizes)
    assert np.array_equal(one, got)
    _assert_states_equal(s_one, s_got)


def test_forward_never_mutates_its_input_state_and_old_states_resume():
    """Immutability = O(1) snapshots: continuing from a kept state twice gives the same result."""
    cfg, w, toks = _setup(True)
    _, s20 = _run_schedule(cfg, w, toks[:20], [20])
    before = [np.array(a) for a in s20.arrays()]
    l1, s_a = forward(w, cfg, s20, toks[20:30])
    l2, s_b = forward(w, cfg, s20, toks[20:30])
    assert np.array_equal(np.array(l1), np.array(l2))
    _assert_states_equal(s_a, s_b)
    for x, y in zip(before, s20.arrays(), strict=True):
        assert np.array_equal(x, np.array(y))


def test_causality_inside_a_chunk():
    """A query's logits never depend on later tokens of the same chunk (raw rows up to p,
    (p+1)//r compressed rows)."""
    cfg, w, toks = _setup(True)
    full, _ = _run_schedule(cfg, w, toks, [N])
    other = list(toks)
    other[30:] = [(t + 1) % cfg.vocab for t in other[30:]]
    changed, _ = _run_schedule(cfg, w, other, [N])
    assert np.array_equal(full[:30], changed[:30])
    assert not np.array_equal(full[30:], changed[30:])


def test_last_only_matches_the_last_row():
    cfg, w, toks = _setup(True)
    full, s_full = _run_schedule(cfg, w, toks[:25], [25])
    last, s_last = forward(w, cfg, SessionState.empty(cfg), toks[:25], last_only=True)
    assert last.shape == (1, cfg.vocab)
    assert np.array_equal(np.array(last[0]), full[-1])
    _assert_states_equal(s_full, s_last)
    assert isinstance(s_last.logits, mx.array)


def test_invariance_across_many_attention_blocks(monkeypatch):
    """Tiny block sizes force several query blocks and compressed-row blocks per chunk (the real
    sizes only split at long contexts): results stay bit-identical across chunk schedules, and
    the query blocking itself never changes a value (each query is computed on its own)."""
    from ds4agent.engine import layers

    cfg = test_config("micro", ratios=(0, 0, 4, 4), indexer_top_k=6)
    cfg2 = test_config("micro", ratios=(0, 2, 4, 3))
    for c in (cfg, cfg2):
        w = random_weights(c, 3)
        toks = np.random.default_rng(4).integers(0, c.vocab, 45).tolist()
        monkeypatch.setattr(layers, "_COMP_BLOCK", 4)
        monkeypatch.setattr(layers, "QUERY_BLOCK", 5)
        one, s_one = _run_schedule(c, w, toks, [45])
        parts, s_parts = _run_schedule(c, w, toks, [6, 1, 17, 2, 19])
        assert np.array_equal(one, parts)
        _assert_states_equal(s_one, s_parts)
        monkeypatch.setattr(layers, "QUERY_BLOCK", 256)
        again, _ = _run_schedule(c, w, toks, [45])
        assert np.array_equal(one, again)


def test_random_chunk_schedules_property():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    cfg, w, toks = _setup(True)
    one, s_one = _run_schedule(cfg, w, toks, [N])

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.integers(min_value=1, max_value=N), min_size=1, max_size=6))
    def check(sizes):
        total = sum(sizes)
        sizes = sizes + [N] if total < N else sizes
        got, s_got = _run_schedule(cfg, w, toks, sizes)
        assert np.array_equal(one, got)
        _assert_states_equal(s_one, s_got)

    check()


def test_invariance_when_only_some_chunks_split_their_products(monkeypatch):
    """Large Q8_0 products on CPU are split over streams only above a size, which depends on the
    chunk's row count: a schedule mixing split and unsplit chunks must still give the same bits."""
    from ds4agent.engine import device, weights

    cfg = test_config("micro")
    monkeypatch.setattr(device, "cpu_parts", lambda: 3)
    monkeypatch.setattr(weights, "_PARALLEL_MIN_MACS", cfg.vocab * cfg.dim * 4)  # head: 4+ rows
    w = random_weights(cfg, 7, quantize_q8=True)
    assert len(w.output._parts) == 3
    toks = _setup(True)[2]
    base_w = _setup(True)[1]  # built without splitting
    one, s_one = _run_schedule(cfg, base_w, toks, [N])
    got, s_got = _run_schedule(cfg, w, toks, [1, 2, 9, 3, 5, 36])
    assert np.array_equal(one, got)
    _assert_states_equal(s_one, s_got)
