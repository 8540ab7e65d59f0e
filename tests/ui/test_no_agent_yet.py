"""Keys and commands that reach the agent when there is no agent to reach: before the agent
object exists (the first moments of the start-up) and after it could not be built. Each is
answered with a readable line; none may end the app with a traceback."""

from __future__ import annotations

from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.widgets.conversation import Note
from tests.ui.conftest import app_waiting_for_agent, send, wait_until


def _notes(app) -> list[str]:
    return [n.text for n in app.conversation.query(Note)]


async def test_a_command_that_runs_while_busy_is_refused_until_the_agent_exists():
    app, agent, release = app_waiting_for_agent()
    async with app.run_test(size=(100, 20)) as pilot:
        assert app.agent is None
        await send(pilot, app, "/power 50")  # /power runs while a turn is busy: not refused as busy
        await wait_until(pilot, lambda: bool(_notes(app)), what="the refusal")
        assert _notes(app)[-1] == "/power cannot run yet: the model is still loading"
        release.set()
        await wait_until(pilot, lambda: app.agent is agent)
        assert app.is_running


async def test_esc_esc_after_a_start_that_failed_says_why_it_cannot_rewind():
    def factory():
        raise ValueError("/models/x.gguf: not a GGUF file (only 8 bytes)")

    app = Ds4App(factory, cwd="/w", history=InputHistory(persist=False), animate=False)
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: app.startup_error is not None, what="the failed start")
        await pilot.press("escape", "escape")
        await wait_until(pilot, lambda: _notes(app)[-1].startswith("/rewind"), what="the refusal")
        assert _notes(app)[-1] == ("/rewind cannot run: the agent could not start (the reason is above):"
                                   " leave with /quit, Ctrl+D or Ctrl+C twice")
        assert app.is_running
