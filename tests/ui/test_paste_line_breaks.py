"""A terminal pastes line breaks as CR (tmux) or CRLF: the message keeps them as newlines, folded
or not, so the transcript and the model see the lines that were pasted."""

from __future__ import annotations

from textual import events

from tests.ui.conftest import make_fake_app


def _submits(agent) -> list[str]:
    return [c[1] for c in agent.calls if c[0] == "submit"]


async def test_a_large_cr_paste_keeps_its_lines():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.busy = False
        rows = [f"row {i}" for i in range(40)]
        app.input.post_message(events.Paste("\r".join(rows)))
        await pilot.pause()
        assert app.input.text == "[... 40 pasted lines ...]"  # counted as lines, not as chars
        assert app.input.expanded_text() == "\n".join(rows)


async def test_a_small_crlf_paste_keeps_its_lines_and_replaces_the_selection():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.input.insert("old text")
        app.input.select_all()
        app.input.post_message(events.Paste("one\r\ntwo\rthree"))
        await pilot.pause()
        assert app.input.text == "one\ntwo\nthree"


async def test_a_paste_while_a_question_is_up_goes_to_the_editor():
    from ds4agent.agent import events as ev
    from ds4agent.ui.screens.question import QuestionScreen
    from tests.ui.conftest import wait_until

    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.emit(ev.Question("q-1", "resume", "Resume the unsaved session?", (("y", "resume"), ("n", "discard"))))
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen), what="the question")
        app.screen.post_message(events.Paste("pasted\rlines"))
        await wait_until(pilot, lambda: app.input.text == "pasted\nlines", what="the paste in the editor")
        assert isinstance(app.screen, QuestionScreen) and agent.answers == []


async def test_a_rewound_long_prompt_comes_back_folded():
    from ds4agent.agent import events as ev
    from tests.ui.conftest import wait_until

    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        prompt = "\n".join(f"log line {i}" for i in range(500))
        agent.emit(ev.Rewound(2, "chat", prompt, 2300, 0))
        await wait_until(pilot, lambda: app.input.text != "", what="the prompt back")
        assert app.input.text == "[... 500 pasted lines ...]"
        assert app.input.expanded_text() == prompt
