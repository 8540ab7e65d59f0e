"""Compaction mid-response: one answer that fills the context is compacted and goes on."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.compaction import CONTINUE_NOTE, MIDTURN_RESERVE
from ds4agent.protocol.tokenizer import EOS, Tokenizer
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply, text_ids

TOK = Tokenizer.load()
CTX = 4096


def long_answer(n: int) -> str:
    return "x" + " x" * (n - 1)  # about n tokens


def test_an_answer_that_fills_the_context_is_compacted_and_continues(tmp_path):
    h = AgentHarness.build(tmp_path, ctx=CTX)
    start = len(h.ids)
    h.engine.add(reply(long_answer(CTX), think="t"),  # far more than the context holds
                 text_ids("Wrote part one of the essay.") + [EOS],  # the compaction's summary
                 reply("Part two.", think="t2"))
    evs = h.turn("write a long essay")
    # The round stopped while a compaction still fitted, not at the end of the context.
    stopped = of(evs, ev.CompactionStarted)
    assert [(s.reason, s.tokens_before) for s in stopped] == [("mid-response", CTX - MIDTURN_RESERVE)]
    assert of(evs, ev.CompactionDone)[0].ok
    # One turn, two rounds, ended normally.
    assert [(e.reason, e.rounds) for e in of(evs, ev.TurnEnded)] == [("done", 2)]
    text = h.text()
    assert b"Wrote part one of the essay." in text
    assert b"The user's first request (verbatim):\nwrite a long essay" in text
    assert text.endswith(f"<tool_result>{CONTINUE_NOTE}</tool_result><｜Assistant｜><think>t2</think>"  # noqa: RUF001
                         "Part two.<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    assert start < len(h.ids) < start + 300  # the long answer lives on only in the summary
    assert h.live == tuple(h.ids[:-1])
    h.stop()


def test_when_that_compaction_fails_the_turn_ends_saying_so(tmp_path):
    h = AgentHarness.build(tmp_path, ctx=CTX)
    h.engine.add(reply(long_answer(CTX), think="t"), [EOS])  # an empty summary: compaction fails
    evs = h.turn("write a long essay")
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["context_full"]
    assert any("compaction failed: the model wrote an empty summary" in e.text for e in of(evs, ev.Error))
    assert len(h.ids) == CTX - MIDTURN_RESERVE  # the answer is kept, closed by its EOS
    assert h.ids[-1] == EOS
    h.stop()


def test_the_users_token_cap_still_ends_the_turn(tmp_path):
    h = AgentHarness.build(tmp_path, ctx=CTX, round_tokens=50)
    h.engine.add(reply(long_answer(CTX), think="t"))
    evs = h.turn("write a long essay")
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["token_cap"]
    assert not of(evs, ev.CompactionStarted)
    h.stop()
