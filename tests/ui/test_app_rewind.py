"""The TUI's rewind: Esc Esc on an empty prompt, the list of user turns, the action, and the prompt
back in the input box (the real Agent over the scripted engine)."""

from __future__ import annotations

from ds4agent.agent import rewind
from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.screens.rewind import RewindScreen
from ds4agent.ui.widgets.conversation import UserMessage
from tests.support.scripted_engine import reply
from tests.ui.conftest import make_real_agent, send, wait_until
from tests.ui.screen_text import screen_text


def _idle(app) -> bool:
    return app.agent is not None and not app.agent.busy and app.status_model.state == "idle"


async def test_esc_esc_opens_the_turns_then_the_actions_and_puts_the_prompt_back(tmp_path):
    agent, _ = make_real_agent(tmp_path, [reply("A1", think=""), reply("A2", think=""), reply("A3", think="")])
    app = Ds4App(agent=agent, cwd="/tmp/work", history=InputHistory(persist=False), animate=False, ctx=16384,
                 typeahead_grace=0.0)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        for text in ("first question", "second question", "third question"):
            await send(pilot, app, text)
            await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text != "")
            await wait_until(pilot, lambda: _idle(app))
        await pilot.press("escape", "escape")
        await wait_until(pilot, lambda: isinstance(app.screen, RewindScreen), what="rewind list")
        text = screen_text(app)
        assert "first question" in text and "second question" in text and "third question" in text
        await pilot.press("up", "enter")  # the latest is highlighted: up = turn 2
        await wait_until(pilot, lambda: "Restore code and conversation" in screen_text(app), what="actions")
        assert "bash are not tracked" in screen_text(app)
        await pilot.press("down", "enter")  # conversation only
        await wait_until(pilot, lambda: not isinstance(app.screen, RewindScreen) and _idle(app)
                         and app.input.text == "second question", what="rewound")
        assert [p.preview for p in rewind.points(agent._worker)] == ["first question"]
        await wait_until(pilot, lambda: "rewound to turn 2 (conversation)" in screen_text(app), what="notice")
        await wait_until(pilot, lambda: [w.text for w in app.conversation.query(UserMessage)] == ["first question"],
                         what="view replays what is left")


async def test_slash_rewind_with_a_turn_acts_directly_and_escape_backs_out(tmp_path):
    agent, _ = make_real_agent(tmp_path, [reply("A1", think=""), reply("A2", think="")])
    app = Ds4App(agent=agent, cwd="/tmp/work", history=InputHistory(persist=False), animate=False, ctx=16384,
                 typeahead_grace=0.0)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "only question")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text != "")
        await send(pilot, app, "/rewind")
        await wait_until(pilot, lambda: isinstance(app.screen, RewindScreen), what="rewind list")
        await pilot.press("enter")
        await wait_until(pilot, lambda: "Restore conversation" in screen_text(app))
        await pilot.press("escape")  # back to the turns
        await wait_until(pilot, lambda: "to before which message?" in screen_text(app))
        await pilot.press("escape")  # closed, nothing happened
        await wait_until(pilot, lambda: not isinstance(app.screen, RewindScreen))
        assert len(rewind.points(agent._worker)) == 1
        await send(pilot, app, "/rewind 1 chat")
        await wait_until(pilot, lambda: _idle(app) and app.input.text == "only question", what="rewound")
        assert rewind.points(agent._worker) == []


async def test_picker_shows_which_session_a_fork_came_from():
    from ds4agent.agent import events as ev
    from ds4agent.ui.screens.session_picker import SessionPicker
    from tests.ui.conftest import make_fake_app

    app, agent = make_fake_app()
    agent.sessions = [
        ev.SessionInfo("aaaa1111" + "0" * 32, "aaaa1111", "Fix the retry test", 1200, 1 << 20,
                       1_700_000_000 - 3600, 0, "/kv/a"),
        ev.SessionInfo("bbbb2222" + "0" * 32, "bbbb2222", "Fix the retry test (fork)", 900, 1 << 20,
                       1_700_000_000 - 60, 0, "/kv/b", forked_from="aaaa1111"),
    ]
    async with app.run_test(size=(110, 30)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker))
        text = screen_text(app)
        assert "Fix the retry test (fork)  (fork of aaaa1111)" in text


async def test_resume_without_a_prefix_opens_the_picker_once_the_agent_is_ready():
    from ds4agent.agent import events as ev
    from ds4agent.ui.screens.session_picker import SessionPicker
    from tests.ui.conftest import make_fake_app

    app, agent = make_fake_app(open_picker=True)
    agent.sessions = [ev.SessionInfo("aaaa1111" + "0" * 32, "aaaa1111", "Fix it", 1200, 1 << 20,
                                     1_700_000_000 - 3600, 0, "/kv/a")]
    async with app.run_test(size=(110, 30)) as pilot:
        await pilot.pause(0.1)
        assert not isinstance(app.screen, SessionPicker)
        agent.emit(ev.Ready("m", 16384, False))
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker), what="picker")
        await pilot.press("enter")
        await wait_until(pilot, lambda: ("load", "aaaa1111" + "0" * 32) in agent.calls, what="load")


def test_picker_fork_note_shrinks_before_the_title_does():
    from ds4agent.ui.screens.session_picker import _title_cell

    assert _title_cell("Fix the retry test", "", 40) == "Fix the retry test"
    assert _title_cell("Fix the retry test", "aaaa1111", 60) == "Fix the retry test  (fork of aaaa1111)"
    # An 80-column picker leaves the title about 25 cells: the parent's id gives way to the title.
    cell = _title_cell("Fix the retry test", "aaaa1111", 25)
    assert cell == "Fix the retry…  (fork)" and len(cell) <= 25


async def test_the_rewind_list_starts_on_the_last_turn_stops_at_its_ends_and_shows_its_keys():
    from ds4agent.agent import events as ev
    from ds4agent.ui.screens.rewind import RewindScreen as Screen
    from tests.ui.conftest import make_fake_app

    points = tuple(ev.RewindPoint(n, 1_700_000_000.0 - 60 * (4 - n), f"question {n}\nmore", 100 * n)
                   for n in (1, 2, 3))
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(Screen(points, now=lambda: 1_700_000_000.0))
        await wait_until(pilot, lambda: isinstance(app.screen, Screen))
        turns = app.screen.query_one("#rewind-turns")
        assert turns.highlighted == 2
        text = screen_text(app)
        assert "  3  1m ago    question 3" in text and "↑↓: choose · enter: pick · esc: back" in text
        await pilot.press("down")
        assert turns.highlighted == 2  # no wrap to the first turn
        await pilot.press("up", "up", "up")
        assert turns.highlighted == 0
