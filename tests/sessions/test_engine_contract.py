"""Contract with the engine: a real tiny test model's exported state survives save -> file -> load
-> import exactly (the next step's logits are bit-identical), through the engine's own duck-typed
shape and state objects. sessions never imports the engine; only this test joins the two."""

import numpy as np
import pytest

from ds4agent.sessions.kvc import verify_kvc
from ds4agent.sessions.store import SessionStore


@pytest.fixture(scope="module")
def engine(tiny_model):
    from ds4agent.engine import load_engine

    return load_engine(tiny_model, ctx=256)


def test_engine_state_round_trips_through_a_session_file(engine, tmp_path):
    rng = np.random.default_rng(0)
    tokens = [0, 128803, *rng.integers(100, 120_000, 35).tolist(), 128804]  # 38: past ratio 4 and 16
    live = engine.new_session()
    live.sync(tokens)
    store = SessionStore(tmp_path)
    shape = engine.payload_shape()
    saved = store.save_session("<｜User｜>contract".encode(), live.export_state(), shape=shape,
                               quant_bits=engine.quant_bits, model_id=engine.model_id)
    assert verify_kvc(saved.path, quant_bits=engine.quant_bits).ok
    loaded = store.load_session(saved.id[:8], shape=shape, ctx=engine.ctx, model_id=engine.model_id,
                                quant_bits=engine.quant_bits)
    resumed = engine.new_session()
    resumed.import_state(loaded.payload)
    assert tuple(resumed.tokens) == tuple(tokens)
    np.testing.assert_array_equal(resumed.logits, live.logits)
    np.testing.assert_array_equal(resumed.step(77), live.step(77))
