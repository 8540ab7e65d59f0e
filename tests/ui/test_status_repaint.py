"""The status bar and the header repaint themselves from the state they are given: a change of
the state is drawn with no call to the bars, and an unchanged state costs no repaint."""

from __future__ import annotations

from tests.ui.conftest import make_fake_app, wait_until
from tests.ui.screen_text import screen_text


async def test_a_changed_state_is_drawn_without_telling_the_bars():
    app, _agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: screen_text(app).splitlines()[-1].strip().startswith("loading model… 0%"))
        app.status_model.set_state("tool", "bash")
        app.status_model.session_id, app.status_model.permission = "5a761e70", "auto"
        await wait_until(pilot, lambda: screen_text(app).splitlines()[-1].strip().startswith("running tool bash"),
                         what="the status line")
        header = screen_text(app).splitlines()[0]
        assert "session 5a761e70" in header and header.rstrip().endswith("think · auto")


async def test_an_unchanged_state_is_not_redrawn():
    app, _agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        await pilot.pause(0.15)
        before = app.status_bar.renders
        await pilot.pause(0.35)  # three or four looks of the bar's timer at a state nobody changed
        assert app.status_bar.renders == before
        app.status_model.gen_tokens = 7
        await wait_until(pilot, lambda: app.status_bar.renders == before + 1, what="one repaint")
