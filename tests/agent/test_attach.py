"""`@path` on send: the agent attaches the file to the user turn (tools/attach.py does the work)."""

from __future__ import annotations

from ds4agent.agent import events as ev
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def test_the_model_receives_the_attachment_in_the_user_turn(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("ok", think="t")], tools=tools)
    (tmp_path / "work" / "notes.md").write_text("remember the milk\n")
    evs = h.turn("summarise @notes.md")
    assert "attached @notes.md" in [e.text for e in of(evs, ev.Notice)]
    assert of(evs, ev.UserTurn)[0].text == "summarise @notes.md"  # shown as typed
    assert b"@notes.md:\n" in h.text() and b"remember the milk" in h.text()
    # Rewound, the prompt comes back as typed (sending it again attaches the file afresh).
    done = of(h.command(lambda: h.agent.rewind(1, "chat")), ev.Rewound)[0]
    assert done.prompt == "summarise @notes.md"
    h.stop()
