"""The agent loop end to end on a model with ds4's native MXFP4 routed experts (MLX gather_qmm):
turns through the real engine, a saved session recording 4-bit quantisation, and a load that
continues exactly as the uninterrupted run."""

from __future__ import annotations

import pytest

from ds4agent.agent import events as ev
from tests.support.agent_harness import of
from tests.support.real_engine import real_agent, reference_ids


@pytest.fixture(scope="module")
def mxfp4_model(tmp_path_factory):
    from ds4agent.testmodels import make_test_model

    return make_test_model(tmp_path_factory.mktemp("model") / "tiny-mxfp4.gguf", config="tiny", seed=0,
                           experts="mxfp4")


def test_agent_turns_save_and_load_on_mxfp4_experts(tmp_path, mxfp4_model):
    from ds4agent.engine.experts.mxfp4 import Mxfp4Experts
    from ds4agent.sessions.store import SessionStore

    kv = SessionStore(tmp_path / "kv")
    a = real_agent(tmp_path / "a", mxfp4_model, kv)
    assert type(a.worker.engine.weights.layers[0].ffn.gate_exps) is Mxfp4Experts
    assert of(a.events, ev.Ready)[0].experts == "mxfp4 via MLX gather_qmm"  # the status line's words
    reference = reference_ids(a)

    b = real_agent(tmp_path / "b", mxfp4_model, kv)
    b.turn("hello there")
    first = b.ids
    assert len(first) > len(b.worker.conv.system_ids)  # the model answered
    saved = of(b.command(b.agent.save), ev.SessionSaved)[0]
    assert kv.resolve(saved.id).header.quant_bits == 4  # MXFP4 experts are 4-bit (kvc-format.md §2)
    b.command(b.agent.new)
    evs = b.command(lambda: b.agent.load(saved.short_id))
    assert of(evs, ev.SessionLoaded)[0].prefilled == 0 and b.live == tuple(first)
    b.turn("and again")
    assert b.ids == reference  # continues exactly as the uninterrupted run
    b.stop()
