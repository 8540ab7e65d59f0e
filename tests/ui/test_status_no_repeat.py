"""At any width the status line does not repeat the header's think and permission modes; a power
cap (not in the header) shows."""

from __future__ import annotations

from tests.ui.conftest import make_fake_app, wait_until
from tests.ui.fake_agent import status
from tests.ui.screen_text import screen_text


async def test_a_wide_status_line_does_not_repeat_the_header():
    app, agent = make_fake_app()
    async with app.run_test(size=(200, 24)) as pilot:
        agent.emit(status("idle", unsaved=True))
        await wait_until(pilot, lambda: app.status_model.state == "idle" and app.status_model.dirty)
        await pilot.pause(0.15)
        lines = screen_text(app).splitlines()
        assert lines[0].rstrip().endswith("think · ask")
        assert "think" not in lines[-1] and " ask" not in lines[-1]
        agent.emit(status("idle", unsaved=True, power=40))
        await wait_until(pilot, lambda: app.status_model.power == 40)
        await pilot.pause(0.15)
        assert screen_text(app).splitlines()[-1].rstrip().endswith("unsaved ● · power 40%")
