"""The subagent's fork on the real engine (tiny test model): the parent's KV is bit for bit what
it was, and the fork computes what a fresh prefill of the same tokens computes."""

from __future__ import annotations

import numpy as np

from ds4agent.agent.subagent import run_subagent
from ds4agent.engine import load_engine
from ds4agent.protocol import template
from tests.support.agent_harness import AgentHarness
from tests.support.rec_tool import RecTool

CTX = 2048
# What a layer's exported state holds (sessions/payload.py LayerPayload).
LAYER_FIELDS = ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score")


def _state_bytes(payload) -> list[bytes]:
    out = [np.asarray(payload.tokens).tobytes(), np.asarray(payload.logits).tobytes()]
    for layer in payload.layers:
        for name in LAYER_FIELDS:
            value = getattr(layer, name)
            out.append(b"" if value is None else np.ascontiguousarray(value).tobytes())
    return out


def test_the_fork_leaves_the_parents_kv_bit_identical(tmp_path, tiny_model):
    def loader(progress):
        return load_engine(tiny_model, ctx=CTX, progress=progress)

    h = AgentHarness.build(tmp_path, engine=loader, tools=[RecTool("alpha", "A1\n")], round_tokens=5, seed=7,
                           ctx=CTX, subagents=True, answer=lambda e: "n")
    h.turn("hello there")
    parent = h.worker.session
    tokens = parent.tokens
    before = _state_bytes(parent.export_state())
    # The agent is idle: this thread may drive the sessions (their states are evaluated arrays).
    record = run_subagent(h.worker, "list the files", budget=6, writes=False)
    assert record.forked_at == len(tokens) and 0 < record.prefilled < 200 and 1 <= record.generated <= 6
    assert parent.tokens == tokens
    assert _state_bytes(parent.export_state()) == before

    # The fork (rewound to the parent's snapshot, then only the suffix prefilled) computes what a
    # fresh session computes from token 0.
    engine = h.worker.engine
    suffix = template.render(template.user_turn_pieces("a brief", think_mode="think"), h.worker.tok)
    child = engine.new_session()
    child.rewind(parent.snapshot())
    assert child.sync(list(tokens) + suffix) == len(suffix)
    fresh = engine.new_session()
    fresh.sync(list(tokens) + suffix)
    assert np.array_equal(child.logits, fresh.logits)
    assert _state_bytes(child.export_state()) == _state_bytes(fresh.export_state())
    assert _state_bytes(parent.export_state()) == before
    h.stop()
