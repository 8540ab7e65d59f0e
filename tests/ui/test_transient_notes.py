""""Updating system prompt cache..." is a progress line: the app drops it once the start is over
(the ready line says so) instead of leaving it in the conversation."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.ui.widgets.conversation import Note
from tests.ui.conftest import make_fake_app, wait_until


async def test_the_sysprompt_update_line_goes_when_the_agent_is_ready():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.emit(ev.Notice(ev.SYSPROMPT_UPDATING))
        await wait_until(pilot, lambda: any(n.text == ev.SYSPROMPT_UPDATING for n in app.conversation.query(Note)),
                         what="the progress line")
        agent.emit(ev.Notice("MCP servers: demo (1 tool)"), ev.Ready("m", 16384, False))
        await wait_until(pilot, lambda: any(n.text.startswith("ready") for n in app.conversation.query(Note)),
                         what="the ready line")
        texts = [n.text for n in app.conversation.query(Note)]
        assert ev.SYSPROMPT_UPDATING not in texts
        assert "MCP servers: demo (1 tool)" in texts  # other notes stay
