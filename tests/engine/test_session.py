"""Session API: prefix reuse, chunk grid, interrupt, snapshots, exact save/resume, errors.

All bit-exact claims hold on CPU (model.md §9): every comparison here is array_equal, not allclose.
The "micro" config (vocab 512, window 8, ratios 0/0/4/16, indexer top-k 4) reaches every
boundary within ~25 tokens: window full at 8, ratio-4 rows at 4k, ratio-16 rows at 16k, indexer
pruning from position 19 (the first query that sees 5 > 4 index rows).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from ds4agent.engine import (
    ContextOverflowError,
    Engine,
    EngineError,
    Interrupted,
    Sampler,
    StateError,
    load_engine,
)
from ds4agent.engine.chunks import chunk_cap, chunk_grid
from ds4agent.testmodels import make_test_model

CTX = 64
N_TOKENS = 30  # prompt length of the uninterrupted reference run
N_STEPS = 6  # decode steps after the prompt


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("sess") / "micro.gguf", "micro", seed=11)


@pytest.fixture(scope="module")
def engine(micro_path):
    return load_engine(micro_path, ctx=CTX, chunk=8)


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(2)
    return [int(t) for t in rng.integers(0, 512, size=N_TOKENS)]


def _layer_arrays(payload):
    """Every array of a PayloadState-shaped object, named, for exact comparison."""
    out = {"tokens": np.asarray(payload.tokens), "logits": np.asarray(payload.logits)}
    for i, layer in enumerate(payload.layers):
        for field in ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score"):
            value = getattr(layer, field)
            out[f"{i}.{field}"] = None if value is None else np.asarray(value)
    return out


def _assert_same_state(a, b):
    aa, bb = _layer_arrays(a), _layer_arrays(b)
    assert aa.keys() == bb.keys()
    for key in aa:
        if aa[key] is None or bb[key] is None:
            assert aa[key] is None and bb[key] is None, key
            continue
        assert aa[key].shape == bb[key].shape, key
        assert aa[key].dtype == bb[key].dtype, key
        assert np.array_equal(aa[key], bb[key]), key
    assert a.ctx == b.ctx


def _through_bytes(payload, engine):
    """Save -> payload bytes -> load with the session store's writer/reader."""
    from ds4agent.sessions import payload as pl

    shape = pl.PayloadShape(**{f: getattr(engine.payload_shape(), f) for f in
                               ("n_layers", "head_dim", "indexer_dim", "vocab", "window", "ratios")})
    buf = io.BytesIO()
    n = pl.write_payload(buf, payload, shape)
    assert n == len(buf.getvalue())
    buf.seek(0)
    return pl.read_payload(buf, n, shape, engine.ctx)


def test_chunk_grid_and_cap():
    assert chunk_cap(100_000) == 4096 and chunk_cap(4097) == 4096
    assert chunk_cap(4096) == 4096 and chunk_cap(100) == 100
    assert chunk_grid(5, 20, 8) == [(5, 8), (8, 16), (16, 20)]
    assert chunk_grid(16, 16, 8) == []
    assert chunk_grid(0, 3, 8) == [(0, 3)]


def test_engine_metadata(engine):
    assert engine.model_id == 0 and engine.quant_bits == 2 and engine.ctx == CTX
    shape = engine.payload_shape()
    c = engine.config
    assert (shape.n_layers, shape.head_dim, shape.indexer_dim, shape.vocab, shape.window) == (
        c.n_layers, c.head_dim, c.indexer_dim, c.vocab, c.window)
    assert shape.ratios == (0, 0, 4, 16) and [shape.coff(i) for i in range(4)] == [1, 1, 2, 1]


def test_prefix_reuse_prefills_only_new_tokens_and_equals_cold(engine, prompt):
    warm = engine.new_session()
    seen = []
    assert warm.sync(prompt[:13], progress=lambda d, t: seen.append((d, t))) == 13
    assert seen == [(8, 13), (13, 13)]  # chunks [0,8) [8,13) on the absolute grid of 8
    seen.clear()
    assert warm.sync(prompt[:27], progress=lambda d, t: seen.append((d, t))) == 14
    assert seen == [(3, 14), (11, 14), (14, 14)]  # [13,16) first: back on the grid
    assert warm.prefilled_total == 27
    assert warm.sync(prompt[:27]) == 0 and warm.prefilled_total == 27
    cold = engine.new_session()
    assert cold.sync(prompt[:27]) == 27
    assert warm.tokens == cold.tokens == tuple(prompt[:27])
    assert warm.logits.dtype == np.float32 and warm.logits.shape == (512,)
    assert np.array_equal(warm.logits, cold.logits)
    _assert_same_state(warm.export_state(), cold.export_state())


def test_step_equals_prefill(engine, prompt):
    a = engine.new_session()
    a.sync(prompt[:10])
    for t in prompt[10:14]:
        logits = a.step(t)
    b = engine.new_session()
    b.sync(prompt[:14])
    assert np.array_equal(logits, b.logits)
    _assert_same_state(a.export_state(), b.export_state())


def test_divergence_rewinds_to_a_snapshot_or_from_empty(engine, prompt):
    s = engine.new_session()
    s.sync(prompt[:12])
    snap = s.snapshot()
    s.sync(prompt[:20])
    other = prompt[:12] + [5, 6, 7]
    before = s.prefilled_total
    assert s.sync(other) == 3  # restored the 12-token snapshot, prefilled 3
    assert s.prefilled_total - before == 3 and s.tokens == tuple(other)
    cold = engine.new_session()
    cold.sync(other)
    assert np.array_equal(s.logits, cold.logits)
    del snap  # snapshots are held weakly: without one, a divergence restarts from empty
    s.sync(prompt[:20])
    assert s.sync(prompt[:4] + [9]) == 5


def test_snapshot_rewind_is_exact(engine, prompt):
    s = engine.new_session()
    s.sync(prompt[:9])
    snap = s.snapshot()
    before = s.logits.copy()
    s.sync(prompt[:25])
    s.rewind(snap)
    assert s.tokens == tuple(prompt[:9]) and np.array_equal(s.logits, before)
    s.sync(prompt[:25])
    fresh = engine.new_session()
    fresh.sync(prompt[:25])
    _assert_same_state(s.export_state(), fresh.export_state())


def test_interrupt_between_chunks_keeps_a_consistent_prefix(engine, prompt):
    s = engine.new_session()
    chunks = []

    def stop_after_two():  # asked before each chunk and after each layer: stops at the third chunk
        return len(chunks) >= 2

    with pytest.raises(Interrupted) as ei:
        s.sync(prompt[:N_TOKENS], should_stop=stop_after_two, progress=lambda done, total: chunks.append(done))
    assert (ei.value.done, ei.value.total) == (16, N_TOKENS)
    assert s.tokens == tuple(prompt[:16])
    assert s.sync(prompt[:N_TOKENS]) == N_TOKENS - 16
    cold = engine.new_session()
    cold.sync(prompt[:N_TOKENS])
    _assert_same_state(s.export_state(), cold.export_state())


def test_an_interrupt_inside_a_chunk_acts_after_the_current_sublayer(engine, prompt):
    """A prefill chunk takes minutes at the Flash shape on a CPU: should_stop is asked after every
    layer, the cut chunk is dropped (the state stays at the last chunk boundary) and the next sync
    redoes it, to the same state as an uninterrupted prefill."""
    s = engine.new_session()
    asked = []

    def stop_in_second_chunk():
        asked.append(len(s.tokens))
        # the first question inside chunk two (its before-chunk question passes)
        return sum(1 for n in asked if n == 8) == 2

    with pytest.raises(Interrupted) as ei:
        s.sync(prompt[:N_TOKENS], should_stop=stop_in_second_chunk)
    assert (ei.value.done, ei.value.total) == (8, N_TOKENS)
    assert s.tokens == tuple(prompt[:8])
    # asked before each chunk and after each sublayer (attention, FFN) of the first chunk
    assert asked.count(0) == 1 + 2 * engine.config.n_layers
    assert s.sync(prompt[:N_TOKENS]) == N_TOKENS - 8
    cold = engine.new_session()
    cold.sync(prompt[:N_TOKENS])
    _assert_same_state(s.export_state(), cold.export_state())


def _reference_run(engine, prompt, seed=1234):
    s = engine.new_session()
    s.sync(prompt)
    sampler = Sampler(seed=seed)
    logits_seq, sampled = [s.logits.copy()], []
    for _ in range(N_STEPS):
        tok = sampler.sample(s.logits)
        sampled.append(tok)
        logits_seq.append(s.step(tok).copy())
    return logits_seq, sampled, s.export_state()


@pytest.fixture(scope="module")
def reference(engine, prompt):
    return _reference_run(engine, prompt)


# 0 = fresh; 5 < window 8; 8 = window; 10 inside a ratio-4 group; 12 on 4k; 16 on the ratio-16
# boundary (and 4k); 20 = first state whose next query prunes (pruning starts at position 19,
# so 19 and 20 straddle it); 29 = one short of the prompt.
@pytest.mark.parametrize("save_at", [0, 5, 8, 10, 12, 16, 19, 20, 29])
def test_save_load_continue_equals_uninterrupted(engine, prompt, reference, save_at):
    ref_logits, ref_sampled, ref_state = reference
    sampler = Sampler(seed=1234)
    resumed = engine.new_session()
    if save_at:
        first = engine.new_session()
        first.sync(prompt[:save_at])
        payload = _through_bytes(first.export_state(), engine)
        assert len(payload.tokens) == save_at
        resumed.import_state(payload)
        assert resumed.tokens == tuple(prompt[:save_at])
        assert np.array_equal(resumed.logits, first.logits)
        assert resumed.prefilled_total == 0
    assert resumed.sync(prompt) == N_TOKENS - save_at
    got_logits, got_sampled = [resumed.logits.copy()], []
    for _ in range(N_STEPS):
        tok = sampler.sample(resumed.logits)
        got_sampled.append(tok)
        got_logits.append(resumed.step(tok).copy())
    assert got_sampled == ref_sampled
    for a, b in zip(got_logits, ref_logits, strict=True):
        assert np.array_equal(a, b)
    _assert_same_state(resumed.export_state(), ref_state)


def test_export_of_empty_session_is_refused(engine):
    with pytest.raises(EngineError, match="nothing to export"):
        engine.new_session().export_state()


def test_import_rejects_bad_payloads_without_touching_the_session(engine, prompt):
    src = engine.new_session()
    src.sync(prompt[:21])
    good = src.export_state()
    s = engine.new_session()
    s.sync(prompt[:6])
    before_tokens, before_logits = s.tokens, s.logits.copy()

    def broken(mutate):
        p = src.export_state()
        mutate(p)
        return p

    def cut_comp(p):
        p.layers[2].comp = p.layers[2].comp[:-1]

    def wide_raw(p):
        p.layers[1].raw = np.zeros((p.layers[1].raw.shape[0], 3), np.float32)

    def drop_layer(p):
        p.layers = p.layers[:-1]

    def short_logits(p):
        p.logits = p.logits[:-1]

    def bad_token(p):
        p.tokens = np.array(list(p.tokens[:-1]) + [99999], dtype=np.uint32)

    def nan_logit(p):
        p.logits = p.logits.copy()
        p.logits[3] = np.nan

    def missing_index(p):
        p.layers[2].index_comp = None

    for mutate in (cut_comp, wide_raw, drop_layer, short_logits, bad_token, nan_logit, missing_index):
        with pytest.raises(EngineError):
            s.import_state(broken(mutate))
        assert s.tokens == before_tokens and np.array_equal(s.logits, before_logits), mutate.__name__
    small = Engine(config=engine.config, weights=engine.weights, ctx=21)
    with pytest.raises(StateError, match="does not fit the context"):
        small.new_session().import_state(good)
    s.import_state(good)  # the genuine one still loads
    assert s.tokens == tuple(prompt[:21])


def test_context_overflow_is_an_engine_error(engine, prompt):
    small = Engine(config=engine.config, weights=engine.weights, ctx=10)
    s = small.new_session()
    with pytest.raises(ContextOverflowError, match="11 tokens do not fit the context of 10"):
        s.sync(prompt[:11])
    assert s.tokens == ()
    s.sync(prompt[:10])
    with pytest.raises(ContextOverflowError):
        s.step(3)
    assert s.tokens == tuple(prompt[:10])
    with pytest.raises(EngineError, match="outside the vocabulary"):
        s.sync([1, 2, 512])


def test_tiny_model_loads_with_progress(tmp_path):
    path = make_test_model(tmp_path / "tiny.gguf", "tiny", seed=0)
    fractions = []
    eng = load_engine(path, ctx=4096 + 1, progress=fractions.append)
    assert fractions and fractions[-1] == 1.0 and fractions == sorted(fractions)
    assert eng.chunk == 4096 and eng.config.vocab == 129280
    s = eng.new_session()
    assert s.sync([0, 128803, 300, 400]) == 4
    assert s.logits.shape == (129280,) and np.isfinite(s.logits).all()


def test_load_errors_are_readable(tmp_path):
    with pytest.raises(EngineError, match="cannot open model file"):
        load_engine(tmp_path / "missing.gguf", ctx=16)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all, clearly")
    with pytest.raises(EngineError, match="not a GGUF file"):
        load_engine(bad, ctx=16)


def test_bad_sizes_are_refused_before_loading_anything(micro_path):
    loaded = []
    with pytest.raises(EngineError, match=r"context size must be at least 1 token \(got 0\)"):
        load_engine(micro_path, ctx=0, progress=loaded.append)
    with pytest.raises(EngineError, match=r"prefill chunk must be at least 1 token \(got 0\)"):
        load_engine(micro_path, ctx=16, chunk=0, progress=loaded.append)
    assert loaded == []  # refused up front: no weights were read


def test_save_resume_at_real_ratio_128_and_window_128(tmp_path):
    """Flash's real large ratio and window (128/128) on a micro-width model: save just before,
    on and after the 128 boundary (first ratio-128 row, window full) and resume exactly."""
    from ds4agent.engine.config import test_config

    cfg = test_config("micro", ratios=(0, 0, 4, 128), window=128)
    path = make_test_model(tmp_path / "r128.gguf", cfg, seed=8)
    eng = load_engine(path, ctx=256, chunk=64)
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, 512, size=136)]
    ref = eng.new_session()
    ref.sync(prompt)
    ref_state = ref.export_state()
    assert ref_state.layers[3].comp.shape == (1, cfg.head_dim)  # one ratio-128 row
    assert ref_state.layers[0].raw.shape == (128, cfg.head_dim)
    for save_at in (127, 128, 130):
        first = eng.new_session()
        first.sync(prompt[:save_at])
        resumed = eng.new_session()
        resumed.import_state(_through_bytes(first.export_state(), eng))
        assert resumed.sync(prompt) == len(prompt) - save_at
        assert np.array_equal(resumed.logits, ref.logits), save_at
        _assert_same_state(resumed.export_state(), ref_state)


def test_save_mid_generation_with_rng_state_resumes_the_same_tokens(engine, prompt):
    """Save after some sampled tokens, restore payload + sampler RNG state: the continuation
    samples the same tokens with the same logits as the uninterrupted run."""
    ref_logits, ref_sampled, _ = _reference_run(engine, prompt, seed=77)
    live = engine.new_session()
    live.sync(prompt)
    sampler = Sampler(seed=77)
    for _ in range(3):
        live.step(sampler.sample(live.logits))
    payload = _through_bytes(live.export_state(), engine)
    rng_state = sampler.rng_state
    resumed = engine.new_session()
    resumed.import_state(payload)
    assert resumed.prefilled_total == 0 and np.array_equal(resumed.logits, ref_logits[3])
    restored = Sampler(seed=0)
    restored.rng_state = rng_state
    got = []
    for i in range(3, N_STEPS):
        tok = restored.sample(resumed.logits)
        got.append(tok)
        assert np.array_equal(resumed.step(tok), ref_logits[i + 1])
    assert got == ref_sampled[3:]


def test_running_out_of_memory_at_load_is_one_readable_error(micro_path, monkeypatch):
    from ds4agent.engine import session as session_mod

    def no_memory(tree):
        raise RuntimeError("[malloc] Unable to allocate 86000000000 bytes")

    monkeypatch.setattr(session_mod, "materialize", no_memory)
    with pytest.raises(EngineError, match=r"cannot hold the model's weights in memory \(\[malloc\] Unable"):
        load_engine(micro_path, ctx=16)


def test_session_state_grows_with_the_tokens_used_not_with_ctx(micro_path, prompt):
    """--ctx 1000000 must not cost memory up front. The state holds exactly the arrays of
    the tokens used (and chunking follows the same grid), so two contexts give equal states."""
    small = load_engine(micro_path, ctx=4096)
    huge = load_engine(micro_path, ctx=1_000_000)
    sizes = []
    for eng in (small, huge):
        s = eng.new_session()
        empty = sum(a.nbytes for a in s._state.arrays())
        s.sync(prompt)
        sizes.append((empty, sum(a.nbytes for a in s._state.arrays()), np.array(s.logits)))
    assert sizes[0][0] == sizes[1][0] and sizes[0][1] == sizes[1][1]
    assert sizes[0][1] > sizes[0][0]  # it did grow with the tokens
    assert np.array_equal(sizes[0][2], sizes[1][2])
