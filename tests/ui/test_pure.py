"""Formatting, commands, history, tool views and event coalescing: the UI's pure logic."""

from __future__ import annotations

import json

import pytest

from ds4agent.agent import events as ev
from ds4agent.ui import bridge, commands, fmt, toolview
from ds4agent.ui.history import MAX_ENTRIES, InputHistory


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (999, "999"), (1000, "1k"), (1500, "1.5k"), (14200, "14.2k"), (100_000, "100k"), (1_048_576, "1M")],
)
def test_human_count(n, text):
    assert fmt.human_count(n) == text


def test_age_and_size():
    assert [fmt.format_age(s) for s in (5, 61, 7200, 3 * 86400)] == ["5s ago", "1m ago", "2h ago", "3d ago"]
    assert fmt.format_size(3 * 1024 * 1024 + 512 * 1024) == "3.5 MiB"


def test_status_line_states():
    s = fmt.StatusState(state="prefill", prefill_done=500, prefill_total=2000, prefill_tps=812.0,
                        ctx_used=14200, ctx_total=100_000)
    line = fmt.status_line(s)
    assert line.startswith("prefill ███·········  500/2k 25.0% 812 t/s".replace("  ", " "))
    assert "ctx 14.2k/100k" in line and "14% (compact at 85%)" in line
    assert line.endswith("saved ✓ · think · ask")
    s.power = 40  # a power cap shows with the modes; full power says nothing
    assert fmt.status_line(s).endswith("saved ✓ · think · ask · power 40%")
    s.power = 100
    s.state, s.gen_tokens, s.decode_tps, s.dirty = "generating", 42, 23.14, True
    assert fmt.state_segment(s) == "generating 42 tokens 23.1 t/s"
    assert "unsaved ●" in fmt.status_line(s)
    s.state, s.load_fraction = "loading", 0.37
    assert fmt.state_segment(s) == "loading model… 37%"
    s.state, s.detail = "error", "model file missing"
    assert fmt.state_segment(s) == "error: model file missing"


def test_queued_label_and_session_label():
    assert fmt.queued_label("a\nb") == "a b"
    assert fmt.queued_label("x" * 70, 60) == "x" * 60 + "… 10 characters more"
    assert fmt.session_label("", "") == "new session"
    assert fmt.session_label("3f2a9c1e00", "Fix it") == 'session 3f2a9c1e "Fix it"'


def test_command_parse_busy_rule_and_completion():
    assert commands.parse("/load  abc ") == commands.ParsedCommand("load", "abc", "/load")
    assert commands.parse("/exit").name == "quit"
    assert commands.parse("/switch 12").name == "load"
    with pytest.raises(commands.CommandError, match="unknown command: /nope"):
        commands.parse("/nope")
    for ok_busy in ("/help", "/save", "/list"):
        commands.check_allowed(commands.parse(ok_busy), busy=True)
    with pytest.raises(commands.CommandError, match="command requires the model to be idle: /new"):
        commands.check_allowed(commands.parse("/new"), busy=True)
    commands.check_allowed(commands.parse("/new"), busy=False)
    assert [c.name for c in commands.completions("/n")] == ["new", "nothink"]
    assert commands.completions("/new x") == []
    assert commands.history_count("") == 3 and commands.history_count("999") == 200
    assert commands.history_count("0") == 1
    assert "/permissions" in commands.help_text() and "Ctrl+T" in commands.help_text()


def test_commands_given_junk_arguments_say_so_instead_of_running():
    refused = {
        "/history abc": "/history needs a whole number (got: abc); usage: /history [N]",
        "/history 3 4": "/history takes one argument (got: 3 4); usage: /history [N]",
        "/new extra": "/new takes no arguments (got: extra)",
        "/quit now": "/quit takes no arguments (got: now)",
        "/exit now": "/exit takes no arguments (got: now)",
        "/compact please": "/compact takes no arguments (got: please)",
        "/load ab cd": "/load takes one argument (got: ab cd); usage: /load [prefix]",
        "/switch ab cd": "/switch takes one argument (got: ab cd); usage: /switch <prefix>",
        "/permissions auto now": "/permissions takes one argument (got: auto now); usage: /permissions [mode]",
    }
    for line, message in refused.items():
        with pytest.raises(commands.CommandError) as err:
            commands.parse(line)
        assert str(err.value) == message, line
    # What each command does take still parses; /save's title is free text.
    assert commands.parse("/history 12").arg == "12"
    assert commands.parse("/save  Fix the   flaky test ") == commands.ParsedCommand(
        "save", "Fix the   flaky test", "/save")
    assert commands.parse("/think think-max").arg == "think-max"


def test_history_persists_and_browses(tmp_path):
    path = tmp_path / "d" / "history.json"
    h = InputHistory(path)
    h.add("one")
    h.add("two\nlines")
    h.add("two\nlines")  # consecutive duplicate kept once
    h.add("   ")
    assert json.loads(path.read_text()) == ["one", "two\nlines"]
    h2 = InputHistory(path)
    assert h2.previous("draft") == "two\nlines"
    assert h2.previous("ignored") == "one"
    assert h2.previous("x") is None
    assert h2.next() == "two\nlines"
    assert h2.next() == "draft"
    assert h2.next() is None


def test_history_caps_and_survives_garbage(tmp_path):
    path = tmp_path / "h.json"
    path.write_text("{not json")
    h = InputHistory(path)
    assert h.entries == []
    for i in range(MAX_ENTRIES + 5):
        h.add(f"m{i}")
    assert len(json.loads(path.read_text())) == MAX_ENTRIES
    assert InputHistory(path).entries[0] == "m5"


def test_tool_summaries():
    assert toolview.tool_summary("bash", {"command": "pytest -q\nmore"}) == "pytest -q more"
    assert toolview.tool_summary("read", {"path": "a.py", "start_line": "10", "max_lines": "5"}) == "a.py  10–14"
    assert toolview.tool_summary("read", {"path": "a.py", "whole": "true"}) == "a.py  (whole file)"
    assert toolview.tool_summary("search", {"query": "retry", "path": "src/", "mode": "regex"}) == \
        '"retry" in src/ (regex)'
    assert toolview.tool_summary("edit", {"path": "x.py", "start_line": "3", "end_line": "4"}) == "x.py  lines 3–4"
    assert toolview.tool_summary("edit", {"path": "x.py", "range": "all"}) == "x.py  all"
    assert toolview.tool_summary("bash_stop", {"job": 2}) == "job 2"
    assert toolview.tool_summary("more", {"count": "50"}) == "next 50 lines"
    assert toolview.tool_summary("weird", {"a": 1}) == "a=1"


def test_bash_display_status_and_body():
    from ds4agent.tools import BashDisplay

    out = "\n".join(f"line {i}" for i in range(40))
    d = BashDisplay(command="make", job=1, pid=9, running=False, exit_status=2, timed_out=False, output=out,
                    output_kind="full", output_path="/tmp/o", total_bytes=300, total_lines=40, duration=3.14)
    assert toolview.result_status("bash", False, "x", d) == "exit 2  3.1 s"
    body = toolview.result_body("bash", False, "x", d)
    assert all(style == toolview.FAILED for style, _ in body if not _.startswith("…"))
    assert body[0][1] == "line 0" and body[-1][1] == "line 39"
    assert (toolview.MUTED, f"… {40 - toolview.OUTPUT_HEAD - toolview.OUTPUT_TAIL} lines …") in body
    assert len(toolview.result_body("bash", False, "x", d, expanded=True)) == 40


def test_diff_display_numbered_and_folded():
    from ds4agent.tools import DiffDisplay, DiffLine

    lines = (DiffLine("hunk", None, None, "@@ -86,3 +86,4 @@"), DiffLine("context", 86, 86, "def f():"),
             DiffLine("remove", 88, None, "    return 1"), DiffLine("add", None, 88, "    return 2"))
    d = DiffDisplay(path="a.py", created=False, unified="", lines=lines, added=1, removed=1)
    assert toolview.result_status("edit", True, "ok", d) == "+1 −1"
    body = toolview.result_body("edit", True, "ok", d)
    assert body == [(toolview.HUNK, "@@ -86,3 +86,4 @@"), (toolview.CONTEXT, "  86  def f():"),
                    (toolview.DEL, "- 88      return 1"), (toolview.ADD, "+ 88      return 2")]
    long = "\n".join(["@@ -1 +1 @@"] + [f"+l{i}" for i in range(100)])
    folded = toolview.result_body("write", True, "ok", {"diff": long})
    assert len(folded) == toolview.DIFF_HEAD + toolview.DIFF_TAIL + 1
    assert folded[toolview.DIFF_HEAD] == (toolview.MUTED, f"… {101 - toolview.DIFF_HEAD - toolview.DIFF_TAIL} lines …")


def test_folded_tools_and_errors():
    from ds4agent.tools import TextDisplay

    d = TextDisplay(summary="212 lines of a.py", body="1: x\n2: y")
    assert toolview.result_body("read", True, "1: x\n2: y", d) == []
    assert toolview.result_body("read", True, "1: x\n2: y", d, expanded=True) == [
        (toolview.OUTPUT, "1: x"), (toolview.OUTPUT, "2: y")]
    assert toolview.result_status("read", True, "t", d) == "212 lines of a.py"
    err = TextDisplay(summary="Tool error: no such file: b.py", body="")
    assert toolview.result_status("read", False, "Tool error: no such file: b.py\n", err) == "no such file: b.py"
    assert toolview.result_body("read", False, "Tool error: no such file: b.py\n") == [
        (toolview.FAILED, "Tool error: no such file: b.py")]


def test_coalesce_merges_runs_and_keeps_order():
    events = [
        ev.ThinkingDelta("a"), ev.ThinkingDelta("b"),
        ev.Status(ev.State.GENERATING, 1, 10, 8), ev.Status(ev.State.GENERATING, 2, 10, 8),
        ev.TextDelta("x"), ev.TextDelta("y"), ev.TextDelta("z"),
        ev.ToolCallStart(0, "bash"),
        ev.ToolCallArgDelta(0, "command", "ls"), ev.ToolCallArgDelta(0, "command", " -l"),
        ev.ToolCallArgDelta(0, "cwd", "/"),
        ev.PrefillProgress(1, 9, 1.0), ev.PrefillProgress(5, 9, 2.0),
        ev.TextDelta("w"),
    ]
    out = bridge.coalesce(events)
    assert out == [
        (ev.ThinkingDelta("ab", tokens=2), 2),
        (ev.Status(ev.State.GENERATING, 2, 10, 8), 2),
        (ev.TextDelta("xyz", tokens=3), 3),
        (ev.ToolCallStart(0, "bash"), 1),
        (ev.ToolCallArgDelta(0, "command", "ls -l"), 2),
        (ev.ToolCallArgDelta(0, "cwd", "/"), 1),
        (ev.PrefillProgress(5, 9, 2.0), 2),
        (ev.TextDelta("w"), 1),
    ]
    assert sum(n for _, n in out) == len(events)


def test_token_counts_survive_both_merges():
    """The agent merges a fast engine's deltas (summing their tokens); the UI merges again per frame:
    the thinking count must still be the number of sampled tokens."""
    from ds4agent.agent.stream import Coalescer

    emitted: list[ev.Event] = []
    c = Coalescer(emitted.append, interval=10.0)
    for piece in ("Let", " me", " think"):
        c.add(ev.ThinkingDelta(piece))
    c.add(ev.TextDelta("Hi"))          # another kind: the thinking run is flushed first
    c.add(ev.ToolCallStart(0, "bash"))
    assert emitted == [ev.ThinkingDelta("Let me think", tokens=3), ev.TextDelta("Hi", tokens=1),
                       ev.ToolCallStart(0, "bash")]
    out = bridge.coalesce([ev.ThinkingDelta("Let me think", tokens=3), ev.ThinkingDelta(".", tokens=2)])
    assert out == [(ev.ThinkingDelta("Let me think.", tokens=5), 5)]


def test_entering_prefill_forgets_the_previous_progress():
    s = fmt.StatusState(state="prefill", prefill_done=10, prefill_total=10)
    s.set_state("generating")
    s.set_state("prefill", "system prompt")
    assert fmt.state_segment(s) == "prefill system prompt"
    s.prefill_done, s.prefill_total = 1, 4
    assert fmt.state_segment(s).startswith("prefill ███·········  1/4 25.0%".replace("  ", " "))


def test_mentions_complete_workspace_paths(tmp_path):
    from ds4agent.ui import mentions

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "client.py").write_text("x")
    (tmp_path / "setup.cfg").write_text("x")
    (tmp_path / ".git").mkdir()
    assert mentions.mention_at_cursor("look at @sr") == "sr"
    assert mentions.mention_at_cursor("look at @src ") is None
    assert mentions.mention_at_cursor("mail me@x") is None
    assert mentions.candidates(tmp_path, "s") == ["setup.cfg", "src/"]
    assert mentions.candidates(tmp_path, "src/c") == ["src/client.py"]
    assert mentions.candidates(tmp_path, "") == ["setup.cfg", "src/"]  # hidden names need a typed dot
    assert mentions.candidates(tmp_path, ".g") == [".git/"]
    assert mentions.candidates(tmp_path, "nope/x") == []


def test_plain_mode_and_shared_logic_do_not_import_textual():
    import subprocess
    import sys

    code = ("import sys, ds4agent.ui.plain, ds4agent.ui.bridge, ds4agent.ui.fmt, ds4agent.ui.toolview, "
            "ds4agent.ui.commands, ds4agent.ui.history, ds4agent.ui.mentions; "
            "print('textual' in sys.modules, 'prompt_toolkit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]  # prompt_toolkit is imported only when the prompt starts


def test_status_speeds_come_from_measurements_not_from_repeated_status_fields():
    from tests.ui.fake_agent import status

    s = fmt.StatusState()
    s.apply_status(status("generating", decode_tps=0.0))
    s.apply_status(status("idle", decode_tps=31.5))       # a short round: its speed comes with idle
    assert s.last_decode_tps == 31.5 and s.decode_tps == 0.0
    s.switch_session("abcd1234", "loaded")                 # a load measures nothing
    s.apply_status(status("idle", decode_tps=31.5, prefill_tps=1430.0))   # the same stale fields
    assert (s.last_decode_tps, s.last_prefill_tps) == (0.0, 0.0)
    assert fmt.speed_segment(s) == ""
    s.apply_prefill(ev.PrefillProgress(1, 1, 34.0))          # a one-token sync is not a prefill speed
    assert s.last_prefill_tps == 0.0 and s.prefill_tps == 34.0
    s.apply_prefill(ev.PrefillProgress(512, 512, 900.0))
    s.apply_status(status("generating", decode_tps=20.0))
    s.apply_status(status("idle", decode_tps=20.0))
    assert fmt.speed_segment(s) == "prefill 900 t/s · decode 20.0 t/s"


def test_history_label_names_the_session_or_says_it_was_never_saved():
    assert fmt.history_label("3f2a9c1e77", "Fix the retry test") == 'session 3f2a9c1e "Fix the retry test"'
    assert fmt.history_label("3f2a9c1e", "") == "session 3f2a9c1e"
    assert fmt.history_label("", "") == "unsaved session"


def test_help_text_wraps_each_meaning_under_its_own_column():
    text = commands.help_text(60)
    lines = text.splitlines()
    assert all(len(line) <= 60 for line in lines)
    save = next(i for i, line in enumerate(lines) if line.startswith("  /save [title]"))
    column = lines[save].index("save the session")
    follow = lines[save + 1]
    assert follow[:column].strip() == "" and follow[column] != " "  # under the meaning, not at column 0
    assert " ".join(" ".join(part.split()) for part in lines[save:save + 3]) == (
        "/save [title] save the session, optionally under a new title (deferred to the end of the turn "
        "while busy)")
    assert commands.help_text() == commands.help_text(None) and "\n    " not in commands.help_text().split("keys:")[0]


def test_long_titles_are_cut_at_a_word_with_an_ellipsis_and_the_header_keeps_its_modes():
    title = "Investigate why the integration tests for the payment gateway fail on Tuesdays only"
    assert fmt.fit(title, 30) == "Investigate why the…"
    assert fmt.fit("short", 30) == "short"
    assert fmt.fit("supercalifragilisticexpialidocious", 10) == "supercali…"
    assert fmt.fit("修复支付网关的集成测试", 9) == "修复支付…"  # wide characters take two cells
    for width in (60, 78, 100, 140):
        place, label = fmt.header_parts("/tmp/work", "5a761e70", title, "think · ask", width)
        line = f"ds4agent ─ {place} ─ {label}"
        assert fmt.cells(line) + 1 + fmt.cells("think · ask") <= width, width
        assert label.startswith("session 5a761e70")
        if '"' in label:
            shown = label.split('"')[1]
            assert shown == title or (shown.endswith("…") and title.startswith(shown[:-1]))
    assert fmt.header_parts("/tmp/work", "5a761e70", title, "think · ask", 78)[1] == 'session 5a761e70 "Investigate why the…"'
    assert fmt.header_parts("/tmp/work", "", "", "think · ask", 78) == ("/tmp/work", "new session")


def test_the_status_bar_keeps_the_device_at_80_columns_and_cuts_what_does_not_fit_with_an_ellipsis():
    from ds4agent.ui.widgets.status_bar import StatusBar

    s = fmt.StatusState(state="idle", ctx_used=14200, ctx_total=100_000, last_prefill_tps=412.0,
                        last_decode_tps=23.1, device="Metal GPU", session_id="3f2a9c1e")
    bar = StatusBar(s)
    assert bar.fitted(78).plain == "idle · ctx 14.2k/100k █······· 14% (compact at 85%) · saved ✓ · Metal GPU"
    assert bar.fitted(40).plain == "idle · saved ✓ · Metal GPU"
    s.set_state("error", "startup failed: /models/x.gguf: not a GGUF file (only 8 bytes), and more words")
    line = bar.fitted(78).plain
    assert line == "error: startup failed: /models/x.gguf: not a GGUF file (only 8 by… · Metal GPU"
    assert fmt.cells(line) == 78
    s.set_state("error", "startup failed: /models/x.gguf: not a GGUF file (only 8 bytes)")
    # the saved mark gives way before the message is cut
    assert bar.fitted(90).plain == "error: startup failed: /models/x.gguf: not a GGUF file (only 8 bytes) · Metal GPU"
    tiny = bar.fitted(10).plain
    assert tiny.endswith("…") and fmt.cells(tiny) == 10


def test_the_header_abbreviates_a_long_directory_from_the_left():
    deep = "/srv/build/workspaces/team-infrastructure/monorepo/services/payments/deep/project"
    place, label = fmt.header_parts(deep, "", "", "think · ask", 78)
    assert place.startswith("…") and place.endswith("/deep/project") and deep.endswith(place[1:])
    assert fmt.cells(f"ds4agent ─ {place} ─ {label}") + 1 + fmt.cells("think · ask") <= 78
    assert label == "new session"
    # beside a session title the directory still keeps a readable tail
    place, label = fmt.header_parts(deep, "5a761e70", "Fix the flaky retry test", "think · ask", 78)
    assert place.startswith("…") and place.endswith("/deep/project")
    assert fmt.cells(f"ds4agent ─ {place} ─ {label}") + 1 + fmt.cells("think · ask") <= 78
    assert fmt.header_parts("/tmp/work", "", "", "think · ask", 78)[0] == "/tmp/work"  # short: whole


def test_control_characters_are_shown_not_sent_to_the_terminal():
    from ds4agent.ui.fmt import terminal_safe

    # a job printing "clear the screen, set the clipboard (OSC 52), CSI as one C1 byte"
    hostile = "ok\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b31m\tdone\n"
    shown = terminal_safe(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert shown == "ok␛[2J␛]52;c;ZXZpbA==␇\ufffd31m\tdone\n"


def test_history_keeps_a_mention_of_a_file_name_that_is_not_utf8(tmp_path):
    import os

    text = "look at @" + os.fsdecode(b"caf\xe9.txt")  # a Latin-1 name: a lone surrogate in the text
    h = InputHistory(tmp_path / "history.json")
    h.add(text)
    assert InputHistory(tmp_path / "history.json").entries == [text]
    assert list(tmp_path.iterdir()) == [tmp_path / "history.json"]  # no temporary file left behind


def test_an_unknown_command_suggests_a_typo_fix_or_a_prefix_never_a_word_of_another_length():
    import pytest

    from ds4agent.ui import commands

    def message(text: str) -> str:
        with pytest.raises(commands.UnknownCommand) as err:
            commands.parse(text)
        return str(err.value)

    assert message("/model") == "unknown command: /model (/help lists the commands)"
    assert message("/lsit") == "unknown command: /lsit (did you mean /list? /help lists the commands)"
    assert message("/perm") == "unknown command: /perm (did you mean /permissions? /help lists the commands)"
