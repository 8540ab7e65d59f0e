"""The TUI over a fake agent: exact UI states without a model (modals, status bar, keys)."""

from __future__ import annotations

from textual import events

from ds4agent.agent import events as ev
from ds4agent.tools import TextDisplay
from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.screens.help import HelpScreen
from ds4agent.ui.screens.permission import PermissionScreen
from ds4agent.ui.screens.question import QuestionScreen
from ds4agent.ui.screens.session_picker import SessionPicker
from ds4agent.ui.widgets.conversation import Note, ToolCard
from tests.ui.conftest import app_waiting_for_agent, make_fake_app, send, wait_until
from tests.ui.fake_agent import status
from tests.ui.screen_text import screen_lines, screen_text


def _notes(app) -> list[str]:
    return [n.text for n in app.conversation.query(Note)]


async def test_status_bar_shows_each_state():
    app, agent = make_fake_app()
    async with app.run_test(size=(120, 24)) as pilot:
        assert app.status_bar.plain.startswith("loading model… 0%")
        checks = [
            (status("loading", progress=0.37), "loading model… 37%"),
            (ev.PrefillProgress(512, 2048, 900.0), "prefill ███·········  512/2k 25.0% 900 t/s"),
            (status("generating", generated=42, decode_tps=23.14), "generating 42 tokens 23.1 t/s"),
            (status("tool", detail="bash"), "running tool bash"),
            (status("compacting"), "compacting"),
            (status("saving"), "saving"),
            (status("error", detail="model file missing"), "error: model file missing"),
            (status("idle", unsaved=True), "idle"),
        ]
        for event, expected in checks:
            agent.emit(event)
            await wait_until(pilot, lambda e=expected: app.status_bar.plain.startswith(e.replace("  ", " ")),
                             what=expected)
            await pilot.pause(0.12)
            assert expected.replace("  ", " ") in screen_text(app).replace("  ", " ")
        assert "ctx 1.2k/16.4k" in app.status_bar.plain and "unsaved ●" in app.status_bar.plain


async def test_status_bar_rates_are_measured_ones_and_the_line_fits_the_width():
    app, agent = make_fake_app()
    async with app.run_test(size=(130, 20)) as pilot:
        # Status events keep the worker's last speeds; an idle one must not bring back stale rates
        agent.emit(status("idle", prefill_tps=1430.0))   # the startup prefill speed, repeated
        await wait_until(pilot, lambda: app.status_model.state == "idle")
        assert "t/s" not in app.status_bar.plain
        agent.emit(ev.PrefillProgress(1, 1, 34.0))            # a one-token sync (before a save)
        agent.emit(status("idle", prefill_tps=34.0))
        await wait_until(pilot, lambda: app.status_model.prefill_total == 1 and app.status_model.state == "idle")
        assert "t/s" not in app.status_bar.plain
        agent.emit(ev.PrefillProgress(900, 900, 412.0), status("generating", generated=5, decode_tps=23.1),
                   status("idle", unsaved=True, prefill_tps=412.0, decode_tps=23.1))
        await wait_until(pilot, lambda: app.status_model.state == "idle" and app.status_model.dirty)
        await pilot.pause(0.15)
        last = screen_text(app).splitlines()[-1].strip()
        # the modes are the header's, right above: not repeated in the status line
        assert last == ("idle · ctx 1.2k/16.4k █······· 7% (compact at 85%) · prefill 412 t/s · decode 23.1 t/s"
                        " · unsaved ●")
        agent.emit(ev.SessionLoaded("ab" * 20, "abababab", 3000, "old work"))   # a load measures nothing
        await wait_until(pilot, lambda: app.status_model.session_id == "abababab")
        assert "t/s" not in app.status_bar.plain
        agent.emit(ev.PrefillProgress(900, 900, 412.0), status("generating", generated=5, decode_tps=23.1),
                   status("idle", unsaved=True))
        await wait_until(pilot, lambda: app.status_model.state == "idle" and app.status_model.dirty)
        # narrower terminals drop the speeds, then the threshold; never the saved mark
        for width, expected in [
            (104, "idle · ctx 1.2k/16.4k █······· 7% (compact at 85%) · prefill 412 t/s · decode 23.1 t/s · unsaved ●"),
            (70, "idle · ctx 1.2k/16.4k █······· 7% (compact at 85%) · unsaved ●"),
            (50, "idle · ctx 1.2k/16.4k █······· 7% · unsaved ●"),
        ]:
            await pilot.resize_terminal(width, 20)
            await wait_until(pilot, lambda e=expected: screen_text(app).splitlines()[-1].strip() == e, what=expected)
        await pilot.resize_terminal(90, 20)
        agent.emit(status("error", detail="startup failed: /models/x.gguf: not a GGUF file (only 8 bytes)"))
        # the context meter gives way to a long message; the saved mark stays while it fits
        expected = "error: startup failed: /models/x.gguf: not a GGUF file (only 8 bytes) · saved ✓"
        await wait_until(pilot, lambda: screen_text(app).splitlines()[-1].strip() == expected, what=expected)
        await pilot.resize_terminal(50, 20)  # then the message is cut and ends in "…"
        expected = "error: startup failed: /models/x.gguf: not a GG…"
        await wait_until(pilot, lambda: screen_text(app).splitlines()[-1].strip() == expected, what=expected)


async def test_status_bar_redraws_at_most_ten_times_a_second():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        await pilot.pause(0.05)
        before = app.status_bar.renders
        for i in range(300):
            agent.emit(status("generating", generated=i))
        await wait_until(pilot, lambda: app.status_model.gen_tokens == 299)
        await pilot.pause(0.25)
        # 300 status events drawn in a handful of repaints (timer-driven), not one per event
        assert app.status_bar.renders - before <= 6


async def test_messages_sent_while_loading_wait_as_chips(tmp_path):
    app, agent, release = app_waiting_for_agent()
    async with app.run_test(size=(100, 20)) as pilot:
        assert app.agent is None
        await send(pilot, app, "early bird")
        chips = app.chips
        assert chips.items == ("early bird",)
        assert "queued: early bird" in screen_text(app)
        release.set()
        await wait_until(pilot, lambda: app.agent is agent)
        assert ("submit", "early bird") in agent.calls


async def test_permission_modal_session_scope_and_deny_with_message():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        opts = (("y", "allow once"), ("s", "allow for this session (commands starting with git)"), ("n", "deny"))
        agent.emit(ev.PermissionRequest("p-1", "bash", "Allow bash?", "git push origin main", opts))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        text = screen_text(app)
        assert "Allow bash?" in text and "git push origin main" in text and "commands starting with git" in text
        await pilot.press("escape")  # never turns into a silent "no"
        assert isinstance(app.screen, PermissionScreen) and agent.answers == []
        await pilot.press("s")
        await wait_until(pilot, lambda: agent.answers == [("p-1", "s", "")])
        diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
        agent.emit(ev.PermissionRequest("p-2", "edit", "Allow edit to x.py?", diff, opts))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        assert "+a = 2" in screen_text(app)
        await pilot.press("m")
        for key in "nope":
            await pilot.press(key)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(agent.answers) == 2)
        assert agent.answers[1] == ("p-2", "n", "nope")


async def test_tool_cards_expand_with_ctrl_o_and_invalid_calls_are_red():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+o")  # no card yet: said, not silently ignored
        await wait_until(pilot, lambda: _notes(app) == [
            "no tool card yet: Ctrl+O opens the last one once the model has used a tool"])
        body = "\n".join(f"{i}: line {i}" for i in range(1, 6))
        agent.emit(ev.ToolCallStart(0, "read"), ev.ToolCallArgDelta(0, "path", "src/a.py"),
                   ev.ToolCallEnd(0, "read", {"path": "src/a.py"}),
                   ev.ToolResult(0, "read", True, body, TextDisplay("5 lines of src/a.py", body)),
                   ev.ToolCallInvalid("missing parameter: command", "<invoke name=\"bash\">", "error"),
                   ev.TurnEnded("done"))
        await wait_until(pilot, lambda: app.conversation.query(ToolCard) and
                         app.conversation.query_one(ToolCard).state == "ok")
        await pilot.pause(0.05)
        text = screen_text(app)
        assert "⏺ read  src/a.py" in text and "✓ 5 lines of src/a.py" in text
        assert "3: line 3" not in text
        assert "✗ invalid tool call: missing parameter: command" in text
        await pilot.press("ctrl+o")
        await pilot.pause(0.05)
        assert "│ 3: line 3" in screen_text(app)
        await pilot.press("ctrl+o")
        await pilot.pause(0.05)
        assert "3: line 3" not in screen_text(app)


async def test_thinking_collapses_and_ctrl_t_toggles():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        clock = app.clock
        agent.emit(*[ev.ThinkingDelta(f"step {i}\n") for i in range(10)])
        await wait_until(pilot, lambda: app.conversation.thinking is not None and
                         app.conversation.thinking.tokens == 10)
        await pilot.pause(0.05)
        text = screen_text(app)
        assert "Thinking…" in text and "step 9" in text and "step 2" not in text  # only the tail
        clock.t += 4.2
        agent.emit(ev.TextDelta("The answer."), ev.TurnEnded("done"))
        await wait_until(pilot, lambda: app.conversation.last_answer_text == "The answer.")
        await pilot.pause(0.05)
        text = screen_text(app)
        assert "▸ Thought for 4.2 s (10 tokens)" in text and "step 9" not in text
        await pilot.press("ctrl+t")
        await pilot.pause(0.05)
        text = screen_text(app)
        assert "▾ Thought for 4.2 s (10 tokens)" in text and "step 2" in text


async def test_slash_commands_busy_rule_copy_help_and_unknown():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        agent.busy = True
        await send(pilot, app, "/compact")
        await send(pilot, app, "/save")
        await send(pilot, app, "/bogus")
        await wait_until(pilot, lambda: len(_notes(app)) >= 2)
        assert _notes(app) == ["command requires the model to be idle: /compact",
                               "unknown command: /bogus (/help lists the commands)"]
        assert app.input.text == "/bogus"  # put back to correct and send again
        app.input.set_text("")
        assert ("save",) in agent.calls and ("compact",) not in agent.calls
        agent.busy = False
        await send(pilot, app, "/copy")
        await wait_until(pilot, lambda: "nothing to copy yet" in _notes(app))
        agent.emit(ev.TextDelta("copy me"), ev.TurnEnded("done"))
        await wait_until(pilot, lambda: app.conversation.last_answer_text == "copy me")
        await send(pilot, app, "/copy")
        await wait_until(pilot, lambda: app.clipboard == "copy me")
        await send(pilot, app, "/history 5")
        await send(pilot, app, "/think")
        await send(pilot, app, "/nothink")
        await send(pilot, app, "/permissions read-only")
        await wait_until(pilot, lambda: ("permissions", "read-only") in agent.calls)
        assert ("history", 5) in agent.calls and ("think", "think") in agent.calls
        assert ("think", "nothink") in agent.calls
        await send(pilot, app, "/save Fix the flaky test")
        await send(pilot, app, "/new extra")
        await send(pilot, app, "/history abc")
        await wait_until(pilot, lambda: "/history needs a whole number" in _notes(app)[-1])
        assert ("save", "Fix the flaky test") in agent.calls and ("new",) not in agent.calls
        assert _notes(app)[-2:] == ["/new takes no arguments (got: extra)",
                                    "/history needs a whole number (got: abc); usage: /history [N]"]
        await send(pilot, app, "/help")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "/permissions" in screen_text(app)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_command_completion_on_slash():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("/")
        await pilot.pause(0.05)
        hints = app.query_one("#hints")
        assert hints.display and "/compact" in screen_text(app)
        await pilot.press("h", "i")
        await pilot.pause(0.05)
        assert hints.names == ["history"]
        await pilot.press("tab")
        assert app.input.text == "/history "


async def test_input_history_multiline_and_newline_keys():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("a", "ctrl+j", "b")
        assert app.input.text == "a\nb"
        await pilot.press("enter")
        await wait_until(pilot, lambda: ("submit", "a\nb") in agent.calls)
        assert app.input.text == ""
        await send(pilot, app, "second")
        await pilot.press("up")
        assert app.input.text == "second"
        await pilot.press("up")
        assert app.input.text == "a\nb"
        await pilot.press("down")  # the cursor is on the last line: the next entry
        assert app.input.text == "second"


async def test_picker_orders_by_last_use_else_creation_and_marks_stripped_sessions():
    app, agent = make_fake_app()
    agent.sessions = [
        ev.SessionInfo("aaaa1111" + "0" * 32, "aaaa1111", "used an hour ago", 14200, 3 << 20,
                       1_700_000_000 - 3600, 1_600_000_000, "/kv/a"),
        # no last_used in its header: its creation (two minutes ago) orders it
        ev.SessionInfo("bbbb2222" + "0" * 32, "bbbb2222", "never used", 900, 4096, 0,
                       1_700_000_000 - 120, "/kv/b", stripped=True),
        ev.SessionInfo("cccc3333" + "0" * 32, "cccc3333", "used just now", 500, 1 << 20,
                       1_700_000_000 - 5, 1_600_000_000, "/kv/c"),
    ]
    async with app.run_test(size=(110, 30)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker))
        picker = app.screen
        assert [s.short_id for s in picker.rows] == ["cccc3333", "bbbb2222", "aaaa1111"]
        lines = {line.split()[1]: line for line in screen_text(app).splitlines()
                 if any(sid in line for sid in ("aaaa1111", "bbbb2222", "cccc3333"))}
        assert "900 stripped" in lines["bbbb2222"] and "2m ago" in lines["bbbb2222"]
        assert "stripped" not in lines["aaaa1111"] and "stripped" not in lines["cccc3333"]
        await pilot.press("escape")


async def test_picker_filters_and_deletes_with_confirmation():
    app, agent = make_fake_app()
    agent.sessions = [
        ev.SessionInfo("aaaa1111" + "0" * 32, "aaaa1111", "Fix the flaky retry test", 14200, 3 << 20,
                       1_700_000_000 - 3600, 0, "/kv/a"),
        ev.SessionInfo("bbbb2222" + "0" * 32, "bbbb2222", "Write the README", 900, 1 << 20,
                       1_700_000_000 - 60, 0, "/kv/b"),
    ]
    async with app.run_test(size=(110, 30)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionPicker))
        picker = app.screen
        assert [s.short_id for s in picker.rows] == ["bbbb2222", "aaaa1111"]  # newest first
        text = screen_text(app)
        assert "1m ago" in text and "14.2k" in text and "3.0 MiB" in text
        assert "Load a session from /tmp/kv" in text and "ctrl+d: delete" in text
        # the filter accumulates across pauses (the field gaining the focus must not select what
        # was typed, for the next key to replace); "d" is a filter letter, not delete
        await pilot.press("d", "e")
        await pilot.pause()
        assert picker.query_one("#picker-filter").value == "de" and agent.deleted == []
        await pilot.press("down")  # back to the table: Backspace still edits the filter
        await pilot.press("backspace", "backspace", "f", "l")
        await pilot.pause()
        await pilot.press("a", "k")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert picker.query_one("#picker-filter").value == "flaky"
        assert [s.short_id for s in picker.rows] == ["aaaa1111"]
        await pilot.press("ctrl+d")  # from the filter field too
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen is picker)
        await pilot.press("down")  # back to the table
        await pilot.press("delete")
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        assert "Delete session aaaa1111" in app.screen.question
        # someone typing a filter that starts with "d" ("dsml⏎") must not delete by Enter
        await pilot.press("s", "m", "l", "enter")
        await pilot.pause(0.05)
        assert agent.deleted == [] and isinstance(app.screen, QuestionScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: agent.deleted == ["aaaa1111" + "0" * 32])
        assert picker.rows == []
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, SessionPicker))
        assert not any(c[0] == "load" for c in agent.calls)


async def test_ctrl_c_twice_on_empty_idle_prompt_quits():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        agent.emit(status("idle"))
        await wait_until(pilot, lambda: app.status_model.state == "idle")
        await pilot.press("x", "ctrl+c")
        assert app.input.text == "" and app.is_running
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: "press Ctrl+C again or Ctrl+D to exit" in _notes(app))
        assert ("quit",) not in agent.calls
        app.clock.t += 0.5
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: not app.is_running)
        assert ("quit",) in agent.calls


async def test_ctrl_c_interrupts_when_busy_and_ctrl_d_quits_when_idle():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        agent.busy = True
        await pilot.press("escape")  # still loading the model: nothing to interrupt
        assert ("interrupt",) not in agent.calls
        agent.emit(status("generating"))
        await wait_until(pilot, lambda: app.status_model.state == "generating")
        await pilot.press("ctrl+c")
        await pilot.press("escape")
        assert agent.calls.count(("interrupt",)) == 2
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: "command requires the model to be idle: /quit" in _notes(app))
        agent.busy = False
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: not app.is_running)


async def test_scrolling_up_stops_following_and_end_follows_again():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 20)) as pilot:
        agent.emit(*[ev.Notice(f"line {i}") for i in range(60)])
        await wait_until(pilot, lambda: len(_notes(app)) == 60)
        await pilot.pause(0.1)
        conv = app.conversation
        assert conv.scroll_y == conv.max_scroll_y > 0
        await pilot.press("pageup")
        await pilot.pause(0.1)
        held = conv.scroll_y
        assert held < conv.max_scroll_y
        agent.emit(*[ev.Notice(f"more {i}") for i in range(10)])
        await wait_until(pilot, lambda: len(_notes(app)) == 70)
        await pilot.pause(0.1)
        assert conv.scroll_y == held  # the user's position is kept
        await pilot.press("end")
        await pilot.pause(0.1)
        assert conv.scroll_y == conv.max_scroll_y


async def test_fatal_error_is_one_readable_line():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        agent.emit(ev.Error("startup failed: no model found at x.gguf", fatal=True), ev.Exited(1))
        await wait_until(pilot, lambda: app.status_model.state == "error")
        await pilot.pause(0.12)
        text = screen_text(app)
        assert "startup failed: no model found at x.gguf" in text and "Traceback" not in text
        assert app.is_running
        agent.running = False
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: not app.is_running)
    assert app.return_code == 1


async def test_at_mentions_complete_paths_with_tab(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "client.py").write_text("x")
    app, agent = make_fake_app(cwd=str(tmp_path))
    async with app.run_test(size=(100, 30)) as pilot:
        for key in "fix @sr":
            await pilot.press(key if key != " " else "space")
        await pilot.pause(0.05)
        assert "@src/" in screen_text(app)
        await pilot.press("tab")
        assert app.input.text == "fix @src/"
        await pilot.press("tab")
        assert app.input.text == "fix @src/client.py"


async def test_old_blocks_are_pruned_at_the_end_of_a_turn():
    from ds4agent.ui.widgets import conversation

    app, agent = make_fake_app()
    async with app.run_test(size=(80, 20)) as pilot:
        agent.emit(*[ev.Notice(f"n{i}") for i in range(30)])
        await wait_until(pilot, lambda: len(_notes(app)) == 30)
        await app.conversation.prune(limit=10)
        await pilot.pause(0.05)
        texts = _notes(app)
        assert len(app.conversation.children) == 10
        assert texts[0].startswith("… earlier output hidden") and texts[-1] == "n29" and "n19" not in texts
        assert conversation.MAX_BLOCKS >= 100


async def test_bracketed_paste_inserts_newlines_without_sending_and_f1_opens_help():
    from textual import events

    app, agent = make_fake_app()
    async with app.run_test(size=(100, 30)) as pilot:
        app.post_message(events.Paste("line one\nline two\n"))  # as the driver delivers it
        await pilot.pause(0.05)
        assert app.input.text == "line one\nline two\n"
        assert not any(c[0] == "submit" for c in agent.calls)
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("f1")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        assert app.input.text == "line one\nline two\n"


async def test_large_paste_is_folded_in_the_editor_and_sent_whole():
    from textual import events

    app, agent = make_fake_app()
    big = "".join(f"row {i}\n" for i in range(50))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("s", "e", "e", "space")
        app.post_message(events.Paste(big))
        await pilot.pause(0.05)
        assert app.input.text == "see [... 50 pasted lines ...]"
        assert "[... 50 pasted lines ...]" in screen_text(app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: any(c[0] == "submit" for c in agent.calls))
        assert ("submit", "see " + big) in agent.calls
        assert app.input.text == ""


async def test_agent_that_cannot_be_built_is_one_error_line_and_exit_status_1():
    def factory():
        raise OSError("cannot create KV directory: Permission denied")

    app = Ds4App(factory, cwd="/w", history=InputHistory(persist=False), animate=False)
    async with app.run_test(size=(100, 20)) as pilot:
        await wait_until(pilot, lambda: app.status_model.state == "error")
        assert _notes(app) == ["ds4agent: cannot create KV directory: Permission denied",
                               "the agent could not start (the reason is above): leave with /quit, Ctrl+D or Ctrl+C twice"]
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: not app.is_running)
    assert app.return_code == 1


async def test_resume_question_from_the_agent_is_answered_by_key():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 24)) as pilot:
        agent.emit(ev.Question("q-1", "resume", "Resume the unsaved session from the crash journal (1234 tokens)?",
                               (("y", "resume"), ("n", "discard"))))
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        assert "crash journal" in screen_text(app)
        await pilot.press("y")
        await wait_until(pilot, lambda: agent.answers == [("q-1", "y", "")])


async def test_questions_that_pop_up_while_typing_are_not_answered_by_the_typing():
    app, agent = make_fake_app(typeahead_grace=0.5)
    clock = app.clock
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("s", "a")
        # a permission question opens while the user is still typing a follow-up message
        agent.emit(ev.PermissionRequest("p-1", "bash", "Allow bash?", "rm -rf build"))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        await pilot.press("y", "s")               # "yes" would have allowed it
        await pilot.pause(0.05)
        assert agent.answers == [] and isinstance(app.screen, PermissionScreen)
        assert app.input.text == "says"           # the typing went on into the editor
        agent.busy = True
        await pilot.press("!", "backspace", "enter")  # Enter sends the line, as it was meant to
        await wait_until(pilot, lambda: ("submit", "says") in agent.calls)
        assert agent.answers == [] and isinstance(app.screen, PermissionScreen) and app.input.text == ""
        await pilot.press("s", "a", "y", "s")
        clock.t += 0.6                            # the user stops, reads, answers
        await pilot.press("enter")                # no button has the focus: Enter picks nothing
        await pilot.pause(0.05)
        assert agent.answers == [] and isinstance(app.screen, PermissionScreen)
        await pilot.press("n")
        await wait_until(pilot, lambda: agent.answers == [("p-1", "n", "")])
        # the resume question at start-up: typing does not discard the journal, nor does Esc
        await pilot.press("o")
        agent.emit(ev.Question("q-2", "resume", "Resume the unsaved session?", (("y", "resume"), ("n", "discard"))))
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        await pilot.press("n", "e")
        clock.t += 0.6
        # a pause since the last key is not enough: the question itself must have been visible
        # that long (a save question that opens while the user types on after /load)
        agent.emit(ev.Question("q-3", "save", "Save current session?", (("y", "save"), ("n", "don't save"),
                                                                       ("c", "cancel"))))
        await wait_until(pilot, lambda: len(app.screen_stack) == 3)
        await pilot.press("c")
        await pilot.pause(0.05)
        assert agent.answers == [("p-1", "n", "")] and len(app.screen_stack) == 3
        clock.t += 0.6
        await pilot.press("c")
        await wait_until(pilot, lambda: agent.answers[-1] == ("q-3", "c", ""))
        await pilot.press("escape", "enter")
        await pilot.pause(0.05)
        assert agent.answers == [("p-1", "n", ""), ("q-3", "c", "")] and isinstance(app.screen, QuestionScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: agent.answers[-1] == ("q-2", "y", ""))
        assert app.input.text == "saysonec"  # the "c" typed too early went on into the editor


async def test_a_long_diff_in_the_permission_question_scrolls_with_the_keys():
    app, agent = make_fake_app()
    diff = "@@ -1,60 +1,60 @@\n" + "".join(f"-old line {i}\n+new line {i}\n" for i in range(30))
    async with app.run_test(size=(100, 30)) as pilot:
        agent.emit(ev.PermissionRequest("p-9", "edit", "Allow edit to a.py?", diff))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        detail = app.screen.query_one(".detail")
        assert detail.max_scroll_y > 0 and detail.scroll_y == 0
        assert "[n] deny" in screen_text(app)  # the choices stay visible below a long diff
        await pilot.press("pagedown")
        await wait_until(pilot, lambda: detail.scroll_y > 0, what="the diff scrolled")
        await pilot.press("end")
        await wait_until(pilot, lambda: detail.scroll_y == detail.max_scroll_y)
        await wait_until(pilot, lambda: "new line 29" in screen_text(app), what="the end of the diff drawn")
        assert agent.answers == []


async def test_compaction_streams_a_dim_summary_and_reports_the_result():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 24)) as pilot:
        agent.emit(ev.CompactionStarted("manual", 12000), status("compacting"),
                   ev.CompactionDelta("Goal: fix the retry test.\n"), ev.CompactionDelta("Files: src/client.py"))
        await wait_until(pilot, lambda: app.conversation.thinking is not None)
        text = screen_text(app)
        assert "compacting (manual)" in text and "Summarising the conversation…" in text and "Files: src" in text
        app.clock.t += 2.0
        agent.emit(ev.CompactionDone(True, 12000, 3100, summary_tokens=250, tail_tokens=800),
                   ev.Notice("compacted context: old=12000 summary+tail=3100 tail=800"), status("idle"))
        await wait_until(pilot, lambda: "compacted context: old=12000 summary+tail=3100 tail=800" in _notes(app))
        assert _notes(app) == ["compacting (manual): summarising durable task state",
                               "compacted context: old=12000 summary+tail=3100 tail=800"]  # said once
        assert "▸ Summarised in 2.0 s (250 tokens)" in screen_text(app)


async def test_quit_while_the_model_loads_leaves_at_once():
    app, agent = make_fake_app()
    agent.busy = True
    async with app.run_test(size=(100, 20)) as pilot:
        agent.emit(status("loading", progress=0.2))
        await wait_until(pilot, lambda: app.status_model.load_fraction == 0.2)
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: not app.is_running)
    assert ("quit",) not in agent.calls and app.return_code == 0


async def test_clicking_the_conversation_keeps_the_focus_in_the_input():
    app, agent = make_fake_app()
    async with app.run_test(size=(100, 24)) as pilot:
        agent.emit(ev.ToolCallStart(0, "list"), ev.ToolCallEnd(0, "list", {"path": "."}),
                   ev.ToolResult(0, "list", True, "a.py\nb.py", None), ev.TurnEnded("done"))
        await wait_until(pilot, lambda: app.conversation.query(ToolCard))
        card = app.conversation.query_one(ToolCard)
        await pilot.click(ToolCard)
        await pilot.pause(0.05)
        assert card.expanded and "│ b.py" in screen_text(app)
        await pilot.click("#conversation", offset=(2, 0))
        await pilot.press("x")
        assert app.focused is app.input and app.input.text == "x"


async def test_keys_arriving_in_one_burst_edit_in_order():
    """A terminal delivers a fast typist's keys (or keys queued while the UI was busy drawing) in one
    read; editing keys must apply in order with the characters around them."""
    from textual import events

    app, agent = make_fake_app()
    async with app.run_test(size=(100, 20)) as pilot:
        burst = [("x", "x"), ("y", "y"), ("z", "z"), ("backspace", None), ("slash", "/"), ("s", "s"),
                 ("left", None), ("a", "a")]
        for key, char in burst:
            app.post_message(events.Key(key, char))
        await wait_until(pilot, lambda: len(app.input.text) == 5, what="the burst typed")
        assert app.input.text == "xy/as"


async def test_the_slash_menu_at_80x24_reaches_every_command_with_the_arrow_keys():
    from ds4agent.ui import commands

    app, agent = make_fake_app()
    every = [c.name for c in commands.completions("/")]
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("/")
        await pilot.pause(0.05)
        hints = app.query_one("#hints")
        assert hints.names == every and hints.highlighted() == every[0]
        seen = []
        for i, name in enumerate(every):
            if i:
                await pilot.press("down")
                await pilot.pause(0.02)
            assert hints.highlighted() == name
            usage = next(c.usage for c in commands.COMMANDS if c.name == name)
            lines, region = screen_lines(app), hints.region
            # the highlighted entry is on screen inside the menu, and the menu fits the screen
            rows = [y for y in range(region.y, region.y + region.height) if lines[y].strip().startswith(usage)]
            assert rows, (name, lines)
            strip = app.screen._compositor.render_strips()[rows[0]]  # and drawn highlighted
            assert any(seg.style and seg.style.reverse for seg in strip if seg.text.strip()), name
            assert region.y + region.height <= 24 - 2  # the input and the status bar stay below it
            seen.append(name)
        await pilot.press("down")  # the last entry stays: no wrap to the first
        assert hints.highlighted() == every[-1] and seen == every
        assert f"of {len(every)})" in screen_text(app)  # the window says where it is
        assert app.input.text == "/"  # moving the highlight edits nothing
        await pilot.press("up")
        await pilot.press("tab")
        assert app.input.text == "/" + every[-2]


async def test_a_double_press_answers_a_question_once_and_crashes_nothing():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        opts = (("y", "allow once"), ("s", "allow for this session"), ("n", "deny"))
        agent.emit(ev.PermissionRequest("p-1", "bash", "Allow bash?", "make test", opts))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen))
        # Keys queued to the dialog before the first one closed it (a real terminal's double press).
        for key in "yyy":
            app.screen.post_message(events.Key(key, key))
        await wait_until(pilot, lambda: not isinstance(app.screen, PermissionScreen))
        await pilot.pause()
        assert agent.answers == [("p-1", "y", "")]
        answers: list[str] = []
        app.push_screen(QuestionScreen("Save current session?", (("y", "save"), ("n", "don't save"))),
                        answers.append)
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen))
        for key in "nny":
            app.screen.post_message(events.Key(key, key))
        await wait_until(pilot, lambda: not isinstance(app.screen, QuestionScreen))
        await pilot.pause()
        assert answers == ["n"] and app.is_running
