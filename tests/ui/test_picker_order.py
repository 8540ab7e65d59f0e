"""The session picker and /list list the same sessions in the same order: readable ones newest
first, then unreadable files (the picker used to mix a broken file in by its mtime)."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.ui import fmt
from ds4agent.ui.screens.session_picker import SessionPicker
from tests.ui.conftest import make_fake_app, wait_until

NOW = 1_700_000_000
SESSIONS = [
    ev.SessionInfo("aaaa1111" + "0" * 32, "aaaa1111", "an hour ago", 100, 4096, NOW - 3600, 0, "/kv/a"),
    ev.SessionInfo("cccc3333" + "0" * 32, "cccc3333", "just now", 100, 4096, NOW - 5, 0, "/kv/c"),
    # unreadable, with a recent mtime: still after every readable session, as /list has it
    ev.SessionInfo("dddd4444" + "0" * 32, "dddd4444", "(unreadable session: cut short)", 0, 10, NOW - 1, 0,
                   "/kv/d", unreadable="cut short"),
]


async def test_the_picker_orders_as_list_does():
    listed = [line.split()[0] for line in fmt.session_list_lines("/kv", SESSIONS[1::-1] + SESSIONS[2:], NOW)[1:]]
    assert listed == ["cccc3333", "aaaa1111", "dddd4444"]
    app, agent = make_fake_app()
    agent.sessions = SESSIONS
    async with app.run_test(size=(110, 30)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker))
        assert [s.short_id for s in app.screen.rows] == listed
