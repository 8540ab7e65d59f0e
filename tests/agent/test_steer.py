"""/steer: guidance reaches the running answer after the current tool call, nothing is cancelled."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.facade import steering_text
from tests.support.agent_harness import AgentHarness, of
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import reply


def test_steer_during_a_tool_call_follows_that_rounds_results_and_the_block_still_runs(tmp_path):
    holder: dict = {}

    def first(args):
        holder["h"].agent.steer("use the v2 API instead")
        return "A1\n"

    alpha = RecTool("alpha", fn=first)
    beta = RecTool("beta", "B1\n")
    h = AgentHarness.build(tmp_path, tools=[alpha, beta])
    holder["h"] = h
    h.engine.add(reply("", think="t", calls=[("alpha", {"x": "1"}), ("beta", {"x": "2"})]),
                 reply("Switched to v2.", think="t2"))
    evs = h.turn("port the client")
    # Both calls of the block ran: steering cancels nothing.
    assert alpha.calls == [{"x": "1"}] and beta.calls == [{"x": "2"}]
    text = h.text()
    expected = ("<tool_result>A1\n</tool_result>\n\n<tool_result>B1\n</tool_result>\n\n"
                + steering_text("use the v2 API instead")
                + "<｜Assistant｜><think>t2</think>Switched to v2.<｜end▁of▁sentence｜>").encode()  # noqa: RUF001
    assert text.endswith(expected)
    # One turn, two rounds: the guidance went into the running answer, not into a turn of its own.
    ended = of(evs, ev.TurnEnded)
    assert [(e.reason, e.rounds) for e in ended] == [("done", 2)]
    assert any(isinstance(e, ev.QueueChanged) and e.items == ("/steer use the v2 API instead",) for e in evs)
    assert h.agent.queued() == ()
    h.stop()


def test_steer_when_the_answer_ends_without_a_tool_call_is_the_next_message(tmp_path):
    h = AgentHarness.build(tmp_path)
    sent = []

    def on_step(session, pos):
        if pos == 2 and not sent:
            sent.append(h.agent.steer("shorter please"))

    h.engine.on_step = on_step
    h.engine.add(reply("A long answer here.", think="t"), reply("Short.", think="t"))
    evs = h.turn("explain")
    assert sent == [True]
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["done", "done"]
    assert steering_text("shorter please").encode() in h.text()
    assert h.text().endswith("Short.<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    h.stop()


def test_steer_while_idle_is_a_plain_message_and_empty_is_refused(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("ok", think="t")])
    assert h.agent.steer("   ") is False
    assert of(h.settle(), ev.Error)[0].text.startswith("usage: /steer")
    h.agent.steer("hello there")
    h.settle()
    assert b"hello there<" in h.text() and steering_text("hello there").encode() not in h.text()
    h.stop()
