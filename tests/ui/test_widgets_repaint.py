"""The widgets repaint themselves from their state: the status bar and the header from the
StatusState they are given (a change is drawn with no call to the bars, an unchanged state costs
no repaint), the queue chips and the task list from their own Textual vars."""

from __future__ import annotations

from ds4agent.tools.todo import TodoItem
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


async def test_the_chips_repaint_from_their_own_state():
    app, _agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        app.chips.waiting = ("early bird",)
        app.chips.queued = ("second one",)
        await pilot.pause()
        text = screen_text(app)
        assert "queued: early bird" in text and "queued: second one" in text
        assert "ctrl+x: edit the last one · sent when the model is ready" in text
        app.chips.loading = False
        await pilot.pause()
        assert "ctrl+x: edit the last one · esc: send now (interrupts)" in screen_text(app)
        app.chips.waiting = app.chips.queued = ()
        await pilot.pause()
        assert "queued:" not in screen_text(app) and not app.chips.display


async def test_the_task_list_repaints_from_its_own_state():
    app, _agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        panel = app.query_one("#todos")
        panel.items = (TodoItem("write the test", "in_progress"), TodoItem("run it", "pending"))
        await pilot.pause()
        assert "write the test" in screen_text(app) and "run it" in screen_text(app)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert "(ctrl+g: open)" in screen_text(app) and "run it" not in screen_text(app)
