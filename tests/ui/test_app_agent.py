"""The TUI over the real Agent and the scripted engine: what a person sees and presses."""

from __future__ import annotations

import threading

from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.screens.permission import PermissionScreen
from ds4agent.ui.screens.session_picker import SessionPicker
from ds4agent.ui.widgets.conversation import AssistantMessage, Note, ThinkingBlock, ToolCard, UserMessage
from tests.support.scripted_engine import reply, text_ids
from tests.ui.conftest import make_real_agent, send, wait_until
from tests.ui.screen_text import screen_text


def _app(agent) -> Ds4App:
    return Ds4App(agent=agent, cwd="/tmp/work", history=InputHistory(persist=False), animate=False, ctx=16384,
                  typeahead_grace=0.0)


def _idle(app) -> bool:
    return app.agent is not None and not app.agent.busy and app.status_model.state == "idle"


async def test_prompt_streams_thinking_answer_and_status(tmp_path):
    answer = "Hello **world**.\n\n```python\nvalue = 41 + 1\n```\n"
    agent, _ = make_real_agent(tmp_path, [reply(answer, think="Let me think about it.")])
    app = _app(agent)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        for key in "hello":
            await pilot.press(key)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.conversation.last_answer_text != "", what="answer")
        await wait_until(pilot, lambda: _idle(app))
        conv = app.conversation
        assert [w.text for w in conv.query(UserMessage)] == ["hello"]
        think = conv.query_one(ThinkingBlock)
        assert not think.streaming and think.text == "Let me think about it."
        # the agent merges the deltas of a fast engine; the merged deltas carry their token counts
        assert think.tokens == len(text_ids("Let me think about it."))
        assert conv.last_answer_text == answer.strip()
        assert len(conv.query(AssistantMessage)) == 1
        await pilot.pause(0.15)  # one status-bar refresh
        text = screen_text(app)
        assert "› hello" in text and "Thought for" in text
        assert "Hello world." in text and "value = 41 + 1" in text
        status = app.status_bar.plain
        assert status.startswith("idle") and "unsaved ●" in status and "ctx " in status
        assert app.status_model.ctx_used > 2000


async def test_tool_card_and_permission_answered_by_keys(tmp_path):
    script = [reply("", think="", calls=[("bash", {"command": "echo hi-there"})]), reply("All done.", think="")]
    agent, _ = make_real_agent(tmp_path, script, permission="ask")
    app = _app(agent)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "run it")
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), what="permission modal")
        modal = app.screen
        assert modal.question.endswith("?") and modal.options[0][0] == "y"
        assert "echo hi-there" in modal.detail
        assert app.status_model.state == "tool"
        await pilot.press("y")
        await wait_until(pilot, lambda: _idle(app) and "All done." in app.conversation.last_answer_text)
        card = app.conversation.query_one(ToolCard)
        assert card.tool_name == "bash" and card.state == "ok"
        assert card.status_text.startswith("exit 0")
        text = screen_text(app)
        assert "⏺ bash  echo hi-there" in text
        assert "│ hi-there" in text


async def test_permission_denied_shows_failed_card(tmp_path):
    script = [reply("", think="", calls=[("bash", {"command": "rm -rf build"})]), reply("OK, I will not.", think="")]
    agent, _ = make_real_agent(tmp_path, script, permission="ask")
    app = _app(agent)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "clean")
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        await pilot.press("n")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "OK, I will not.")
        card = app.conversation.query_one(ToolCard)
        assert card.state == "failed" and card.result is not None and card.result[0] is False


class Gate:
    """Holds the scripted engine at token `at` of a response until the test opens it, so a turn is
    reliably still running while the test queues or interrupts (no timing involved)."""

    def __init__(self, at: int = 20) -> None:
        self.at = at
        self.event = threading.Event()

    def __call__(self, session, pos) -> None:
        if pos == self.at:
            self.event.wait(30)  # bounded: a broken test must not hang the suite

    def open(self) -> None:
        self.event.set()


async def test_interrupt_with_escape(tmp_path):
    long = " ".join(f"word{i}" for i in range(400))
    gate = Gate()
    agent, _ = make_real_agent(tmp_path, [reply(long, think="")], on_step=gate)
    app = _app(agent)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "talk")
        # the engine is held at token 20 of 400 (the agent may still hold those deltas in its batcher)
        await wait_until(pilot, lambda: app.status_model.state == "generating", what="generating")
        assert app.status_model.state == "generating"
        await pilot.press("escape")
        gate.open()
        await wait_until(pilot, lambda: _idle(app), what="interrupt")
        notes = [n.text for n in app.conversation.query(Note)]
        assert "interrupted" in notes
        shown = app.conversation.last_answer_text
        assert shown.startswith("word0 word1") and "word399" not in shown


async def test_queued_message_pull_back_and_send_now(tmp_path):
    long = " ".join(f"w{i}" for i in range(400))
    gate = Gate()
    agent, _ = make_real_agent(tmp_path, [reply(long, think=""), reply("Second answer.", think="")],
                               on_step=gate)
    app = _app(agent)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "first")
        await wait_until(pilot, lambda: app.status_model.state == "generating")
        await send(pilot, app, "second one")
        chips = app.chips
        await wait_until(pilot, lambda: chips.items == ("second one",), what="queued chip")
        assert "queued: second one" in screen_text(app)
        await pilot.press("ctrl+x")
        await wait_until(pilot, lambda: chips.items == ())
        assert app.input.text == "second one"
        await pilot.press("enter")
        await wait_until(pilot, lambda: chips.items == ("second one",))
        await pilot.press("escape")  # interrupt now: the queued message goes next
        gate.open()
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "Second answer.")
        users = [(u.text) for u in app.conversation.query(UserMessage)]
        assert users == ["first", "second one"]


async def test_save_new_and_load_through_picker_start_clean_views(tmp_path):
    agent, _ = make_real_agent(tmp_path, [reply("Saved answer.", think="Weighing it up.")])
    app = _app(agent)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "remember this")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "Saved answer.")
        await send(pilot, app, "/save")
        await wait_until(pilot, lambda: app.status_model.session_id != "", what="saved")
        saved_id = app.status_model.session_id
        assert any(n.text.startswith(f"saved session {saved_id}") for n in app.conversation.query(Note))
        await wait_until(pilot, lambda: not app.status_model.dirty)
        await send(pilot, app, "/new")
        await wait_until(pilot, lambda: app.status_model.session_id == "" and _idle(app), what="new session")
        # /new starts a clean view: nothing of the previous conversation is left on screen
        await wait_until(pilot, lambda: [n.text for n in app.conversation.query(Note)] == ["new session"])
        assert not app.conversation.query(UserMessage) and not app.conversation.query(ThinkingBlock)
        assert app.conversation.last_answer_text == ""
        await send(pilot, app, "/load")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker), what="picker")
        picker = app.screen
        assert [s.short_id for s in picker.rows] == [saved_id]
        assert saved_id in screen_text(app) and "remember this" in screen_text(app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.status_model.session_id == saved_id and _idle(app), what="load")
        await wait_until(pilot, lambda: any(n.text.startswith("switched to session") for n in app.conversation.query(Note)))
        notes = [n.text for n in app.conversation.query(Note)]
        assert notes == [f'--- session {saved_id} "remember this": last 1 user turn(s) ---', "--- end history ---",
                         f"switched to session {saved_id} ({app.status_model.ctx_used} tokens)"]
        # the loaded session's last turn is replayed once, in a clean view
        assert [u.text for u in app.conversation.query(UserMessage)] == ["remember this"]
        assert app.conversation.last_answer_text == "Saved answer."  # /copy works right after a load
        await wait_until(pilot, lambda: "▸ Thought" in screen_text(app), what="replayed thinking drawn")
        text = screen_text(app)
        # replayed thinking has no timing: no "Thought for 0.0 s (0 tokens)"
        assert "▸ Thought  ctrl+t" in text and "0.0 s" not in text and "0 tokens" not in text, text
        await pilot.pause(0.15)  # one status-bar refresh
        # a load prefills nothing and decodes nothing: no speeds left over from the previous session
        assert "t/s" not in app.status_bar.plain, app.status_bar.plain


async def test_busy_commands_are_refused_and_quit_asks_to_save(tmp_path):
    long = " ".join(f"w{i}" for i in range(300))
    gate = Gate()
    agent, _ = make_real_agent(tmp_path, [reply(long, think="")], on_step=gate)
    app = _app(agent)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "go")
        await wait_until(pilot, lambda: app.status_model.state == "generating")
        await send(pilot, app, "/new")
        await wait_until(pilot, lambda: any("command requires the model to be idle: /new" == n.text
                                            for n in app.conversation.query(Note)))
        await pilot.press("escape")
        gate.open()
        await wait_until(pilot, lambda: _idle(app))
        await send(pilot, app, "/quit")
        from ds4agent.ui.screens.question import QuestionScreen

        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen), what="save question")
        assert "Save" in app.screen.question
        await pilot.press("escape")  # stay
        await wait_until(pilot, lambda: not isinstance(app.screen, QuestionScreen))
        assert app.is_running
        await send(pilot, app, "/quit")
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("n")
        await wait_until(pilot, lambda: not app.is_running, what="exit")


async def test_picker_deletes_a_saved_session_after_confirmation(tmp_path):
    agent, _ = make_real_agent(tmp_path, [reply("Keep me?", think="")])
    app = _app(agent)
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "short lived")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "Keep me?")
        await send(pilot, app, "/save")
        await wait_until(pilot, lambda: app.status_model.session_id != "" and _idle(app), what="saved")
        saved = list((tmp_path / "kv").glob("*.kv"))
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker), what="picker")
        await pilot.press("ctrl+d")
        from ds4agent.ui.screens.question import QuestionScreen

        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker) and app.screen.rows == [])
        remaining = set((tmp_path / "kv").glob("*.kv"))
        assert len(remaining) == len(saved) - 1
        assert not any(p.name.startswith(app.status_model.session_id) for p in remaining)


async def test_think_and_permission_commands_confirm_once_and_reach_the_status_bar(tmp_path):
    script = [reply("", think=None, calls=[("bash", {"command": "echo switched"})]), reply("Ran it.", think=None)]
    agent, _ = make_real_agent(tmp_path, script, permission="ask")
    app = _app(agent)
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "/nothink")
        await send(pilot, app, "/permissions auto")
        await wait_until(pilot, lambda: app.status_model.permission == "auto" and app.status_model.think_mode == "nothink")
        notes = [n.text for n in app.conversation.query(Note)][1:]  # after "ready" ("Updating…" is gone)
        assert notes == ["thinking mode: nothink", "permission mode: auto"]  # one line each, no echo
        await pilot.pause(0.15)
        assert screen_text(app).splitlines()[0].endswith("nothink · auto")
        # auto: the bash call runs without a question
        await send(pilot, app, "go")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "Ran it.")
        assert not isinstance(app.screen, PermissionScreen)
        assert app.conversation.query_one(ToolCard).state == "ok"


def test_leaving_the_app_prints_where_the_work_is(tmp_path, monkeypatch, capsys):
    # The app's own main(): after the full screen closes, the last line says which session holds
    # the work and how to get back to it.
    from ds4agent.agent.facade import Agent
    from ds4agent.agent.settings import AgentRun, AgentSettings
    from ds4agent.ui import app as app_module

    agent, _ = make_real_agent(tmp_path, [reply("Hi.", think="")])
    monkeypatch.setattr(Agent, "from_run", classmethod(lambda cls, run: agent))
    original_run = Ds4App.run

    async def chat_save_and_leave(pilot) -> None:
        app = pilot.app
        await wait_until(pilot, lambda: _idle(app), what="startup")
        await send(pilot, app, "hello")
        await wait_until(pilot, lambda: _idle(app) and app.conversation.last_answer_text == "Hi.")
        await send(pilot, app, "/save")
        await wait_until(pilot, lambda: _idle(app) and app.status_model.session_id != "", what="saved")
        await pilot.press("ctrl+d")

    monkeypatch.setattr(Ds4App, "run", lambda self: original_run(self, headless=True, auto_pilot=chat_save_and_leave))
    assert app_module.main(AgentRun(AgentSettings(ctx=16384, think_mode="think", permission="auto"))) == 0
    [saved] = [p.stem[:8] for p in (tmp_path / "kv").glob("*.kv") if not p.name.startswith("sysprompt-")]
    assert capsys.readouterr().out.endswith(f"saved {saved} — resume with ds4agent --resume {saved}\n")
