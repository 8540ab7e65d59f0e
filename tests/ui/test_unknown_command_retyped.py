"""An unknown command comes back to the editor selected: the next command typed replaces it
instead of being appended to it ("/lsit" then "/list" used to send "/lsit/list")."""

from __future__ import annotations

from tests.ui.conftest import make_fake_app, send, wait_until


async def test_typing_after_an_unknown_command_replaces_it():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        agent.busy = False
        await send(pilot, app, "/lsit")
        await wait_until(pilot, lambda: app.input.text == "/lsit", what="the command put back")
        await pilot.press("/", "l", "i", "s", "t")
        assert app.input.text == "/list"
        await pilot.press("enter")
        await wait_until(pilot, lambda: ("list_sessions",) in agent.calls or app.input.text == "",
                         what="/list sent")
        assert "/lsit" not in app.input.text


async def test_an_unknown_command_can_still_be_corrected_in_place():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, app, "/lsit")
        await wait_until(pilot, lambda: app.input.text == "/lsit", what="the command put back")
        await pilot.press("end", "backspace", "backspace", "backspace", "i", "s", "t")
        assert app.input.text == "/list"
