"""A message whose prefill is interrupted before the model answered anything (a large paste, Esc)
goes back to the input box instead of staying in the conversation: the transcript, and so the
context meter, are as before it, and sending it again works."""

from __future__ import annotations

from ds4agent.agent import events as ev
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def test_an_interrupted_prefill_takes_the_message_back(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("First.", think=""), reply("Again.", think="")])
    h.turn("hello")
    before = list(h.ids)
    session = h.worker.session
    original_sync = session.sync

    def interrupted_sync(tokens, **kw):  # Esc pressed while the message is being prefilled
        h.agent.interrupt()
        return original_sync(tokens, **kw)

    session.sync = interrupted_sync
    paste = "a long paste\n" * 200
    evs = h.turn(paste)
    session.sync = original_sync
    ended = of(evs, ev.TurnEnded)[-1]
    assert ended.reason == "interrupted" and ended.generated == 0
    back = of(evs, ev.Rewound)
    assert back and back[-1].prompt == paste.strip() and back[-1].tokens == len(before)
    assert h.ids == before  # nothing of the message (nor an empty answer) stays in the conversation
    evs = h.turn("hello again")  # the conversation goes on from where it was
    assert of(evs, ev.TurnEnded)[-1].reason == "done"
    assert h.ids[:len(before)] == before
    h.stop()


def test_an_interrupt_after_the_answer_began_keeps_the_message(tmp_path):
    long = reply(" ".join(f"w{i}" for i in range(40)), think="t")
    h = AgentHarness.build(tmp_path, [long])

    h.at_step(10, h.agent.interrupt)
    evs = h.turn("talk")
    h.engine.on_step = None
    assert of(evs, ev.TurnEnded)[-1].generated > 0
    assert not of(evs, ev.Rewound)
    assert b"talk" in h.worker.tok.decode_bytes(h.ids)
    h.stop()
