"""A lost engine (a pipeline rank died) ends the session: the turn so far is journalled
first, the UI gets one fatal error naming the rank, and the next start offers to resume."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.journal import decode
from ds4agent.engine import EngineLost
from ds4agent.protocol.tokenizer import EOS
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

LONG = "An answer that the lost rank cuts short, token by token. " * 3


def test_a_lost_engine_journals_the_turn_then_ends_with_a_fatal_error(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("First answer.", think="t"), reply(LONG, think="t")],
                           tools=tools)
    h.turn("first task")

    def lose(session, pos):
        if h.engine.responses_started == 2 and pos == 20:
            raise EngineLost("pipeline rank 1 exited (status -9) (while running the model)")

    h.engine.on_step = lose
    assert h.agent.submit("second task")
    events = h.until(lambda e: isinstance(e, ev.Exited))
    errors = of(events, ev.Error)
    assert [(e.text, e.fatal) for e in errors] == [
        ("turn failed: pipeline rank 1 exited (status -9) (while running the model)", True)]
    assert of(events, ev.Exited)[0].status == 1
    # the journal was written before the error: both turns, the second cut after 20 tokens + EOS
    (journal,) = (tmp_path / "journal").glob("*.journal")
    ids, _meta = decode(journal.read_bytes())
    assert ids[-1] == EOS and ids[-21:-1] == reply(LONG, think="t")[:20]

    h.engine.on_step = None
    h2 = AgentHarness.build(tmp_path, tools=tools, answer=lambda e: "y")
    loaded = of(h2.events, ev.SessionLoaded)[0]
    assert loaded.resumed and h2.ids == ids
    h2.stop()
