"""Plain mode (line mode) over the real Agent and the scripted engine, and its renderer."""

from __future__ import annotations

import io

from ds4agent.agent import events as ev
from ds4agent.tools import DiffDisplay, DiffLine
from ds4agent.ui import toolview
from ds4agent.ui.plain import PlainRenderer, run_lines
from tests.support.scripted_engine import reply
from tests.ui.conftest import make_real_agent


def test_line_mode_turn_with_permission_answered_from_stdin(tmp_path):
    script = [reply("", think="Check first.", calls=[("bash", {"command": "echo plain-ok"})]),
              reply("It printed plain-ok.", think="")]
    agent, _ = make_real_agent(tmp_path, script, permission="ask")
    stdin = io.StringIO("run it\ny\n/help\n/bogus\n")
    stdout = io.StringIO()
    status = run_lines(agent, stdin, stdout, poll=0.005)
    out = stdout.getvalue()
    assert status == 0
    assert "› run it" in out
    assert "Check first." in out and "(thought for" in out
    assert "⏺ bash  echo plain-ok" in out
    assert "  ✓ exit 0" in out and "  │ plain-ok" in out
    assert "It printed plain-ok." in out
    assert "/permissions" in out  # /help
    assert "unknown command: /bogus" in out
    # the end of input answers the save question with "n", as the reference does
    assert out.endswith("(y = save, n = don't save, c = cancel) n\nnot saved\n")
    assert "Traceback" not in out


def test_line_mode_denies_when_input_ends_before_the_answer(tmp_path):
    script = [reply("", think="", calls=[("bash", {"command": "touch x"})]), reply("Denied, fine.", think="")]
    agent, _ = make_real_agent(tmp_path, script, permission="ask")
    stdout = io.StringIO()
    run_lines(agent, io.StringIO("make a file\n"), stdout, poll=0.005)
    out = stdout.getvalue()
    assert "  ✗ " in out and "Denied, fine." in out
    assert not (tmp_path / "work" / "x").exists()


def test_renderer_styles_diffs_and_collapses_thinking():
    pieces: list[tuple[str, str]] = []
    t = [10.0]
    r = PlainRenderer(lambda text, style: pieces.append((text, style)), clock=lambda: t[0])
    r.handle(ev.ThinkingDelta("hmm"), 3)
    t[0] += 1.5
    lines = (DiffLine("remove", 3, None, "a = 1"), DiffLine("add", None, 3, "a = 2"))
    r.handle(ev.ToolCallEnd(0, "edit", {"path": "x.py"}))
    r.handle(ev.ToolResult(0, "edit", True, "ok", DiffDisplay("x.py", False, "", lines, 1, 1)))
    text = "".join(p for p, _ in pieces)
    assert "hmm\n(thought for 1.5 s, 3 tokens)\n" in text
    assert "⏺ edit  x.py\n  ✓ +1 −1\n" in text
    assert ("- 3  a = 1\n", toolview.DEL) in pieces and ("+ 3  a = 2\n", toolview.ADD) in pieces


def test_line_mode_rewind_lists_turns_and_goes_back(tmp_path):
    script = [reply("A1", think=""), reply("A2", think=""), reply("A3", think="")]
    agent, _ = make_real_agent(tmp_path, script)
    stdin = io.StringIO("first question\nsecond question\n/rewind\n/rewind 9\n/rewind 2 sideways\n"
                        "/rewind 2 chat\n/fork side branch\n/list\nthird question\n")
    stdout = io.StringIO()
    run_lines(agent, stdin, stdout, poll=0.005)
    out = stdout.getvalue()
    assert "user turns (1 = the first):" in out
    assert "  1  " in out and "first question" in out and "  2  " in out
    assert "Changes made through bash are not tracked" in out
    assert "ds4agent: no user turn 9 (1..2)" in out
    assert "usage: /rewind [N [both|chat|code|fork]]" in out
    assert "rewound to turn 2 (conversation): " in out and ", 0 prefilled" in out
    assert "side branch" in out  # the fork is saved under its title and listed
    # After the rewind the conversation went on from turn 1: the third question is turn 2 now.
    worker = agent._worker
    from ds4agent.agent import rewind

    assert [p.preview for p in rewind.points(worker)] == ["first question", "third question"]
    assert "Traceback" not in out


def test_leaving_says_where_the_work_is(tmp_path):
    agent, _ = make_real_agent(tmp_path, [reply("One.", think=""), reply("Two.", think="")])
    stdout = io.StringIO()
    assert run_lines(agent, io.StringIO("first\n/save\n"), stdout, poll=0.005) == 0
    [saved] = [p.stem for p in (tmp_path / "kv").glob("*.kv") if not p.name.startswith("sysprompt-")]
    assert stdout.getvalue().endswith(f"saved {saved[:8]} — resume with ds4agent --resume {saved[:8]}\n")

    # A later turn not saved (the end of input answers the save question "n").
    agent, _ = make_real_agent(tmp_path, [reply("Three.", think="")])
    stdout = io.StringIO()
    run_lines(agent, io.StringIO(f"/load {saved[:8]}\nmore\n"), stdout, poll=0.005)
    assert stdout.getvalue().endswith(
        f"the last turns were not saved; session {saved[:8]} holds the conversation up to its last save "
        f"— resume with ds4agent --resume {saved[:8]}\n")

    (tmp_path / "other").mkdir()
    agent, _ = make_real_agent(tmp_path / "other", [reply("Four.", think="")])
    stdout = io.StringIO()
    run_lines(agent, io.StringIO("never saved\n"), stdout, poll=0.005)
    assert stdout.getvalue().endswith("Save current session? (y = save, n = don't save, c = cancel) n\nnot saved\n")

    # Nothing said, nothing to report.
    (tmp_path / "idle").mkdir()
    agent, _ = make_real_agent(tmp_path / "idle", [])
    stdout = io.StringIO()
    run_lines(agent, io.StringIO(""), stdout, poll=0.005)
    assert "saved" not in stdout.getvalue()


def test_plain_help_lists_only_what_works_in_a_line_editor():
    from ds4agent.ui import commands

    text = commands.help_text(80, plain=True)
    assert "/load" in text and "Tab" in text and "Ctrl+X" in text
    for absent in ("Ctrl+T", "Ctrl+O", "Ctrl+L", "Esc Esc", "PageUp", "F1", "Shift+Enter"):
        assert absent not in text, absent
    assert all(len(line) <= 80 for line in text.splitlines())


def test_tab_completes_commands_and_mentioned_paths(tmp_path):
    from ds4agent.ui.plain import completions_for

    (tmp_path / "src").mkdir()
    (tmp_path / "setup.py").write_text("")
    got = completions_for("/lo", str(tmp_path))
    assert [(text, start) for text, start, _ in got] == [("/load", -3)]
    assert completions_for("/load 3f", str(tmp_path)) == []
    got = completions_for("look at @s", str(tmp_path))
    assert [(text, start) for text, start, _ in got] == [("@setup.py", -2), ("@src/", -2)]
    assert completions_for("plain words", str(tmp_path)) == []


def test_the_status_line_fits_80_columns_keeping_the_device():
    from ds4agent.ui import fmt

    s = fmt.StatusState(state="generating", gen_tokens=1234, decode_tps=23.1, last_prefill_tps=812.0,
                        last_decode_tps=23.1, ctx_used=14200, ctx_total=100_000, dirty=True, device="CPU",
                        think_mode="think-max")
    assert len(fmt.status_line(s)) > 80
    line = fmt.status_line(s, 78)
    assert len(line) <= 78 and line.startswith("generating 1234 tokens") and line.endswith("CPU")
    assert fmt.status_line(s, 30).endswith("…") and len(fmt.status_line(s, 30)) <= 30


def test_an_unknown_command_is_refused_with_a_hint_and_comes_back_to_the_editor():
    from ds4agent.ui.plain import PlainFrontEnd

    class Lines:
        def __init__(self):
            self.lines = []

        def line(self, text, style=""):
            self.lines.append((text, style))

    class IdleAgent:
        busy = False

    lines = Lines()
    fe = PlainFrontEnd(IdleAgent(), lines)
    assert fe.run_command("/lsit  ") == "/lsit"
    assert lines.lines == [("unknown command: /lsit (did you mean /list? /help lists the commands)", "error")]


def test_plain_prints_the_task_list_and_answers_a_plan_in_line_mode(tmp_path):
    from ds4agent.tools.todo import TodoItem

    pieces: list[tuple[str, str]] = []
    r = PlainRenderer(lambda text, style: pieces.append((text, style)))
    r.handle(ev.TodoList((TodoItem("read", "done"), TodoItem("fix", "in_progress"), TodoItem("test", "pending"))))
    assert "".join(p for p, _ in pieces) == "Tasks 1/3 done · now: fix\n  ✔ read\n  ▶ fix\n  ○ test\n"
    # Line mode: the plan question reads its answer from the next line; "a" approves into auto.
    script = [reply("Plan: 1. write x.", think="t"),
              reply("", think="t", calls=[("write", {"path": "x", "content": "1\n"})]), reply("Done.", think="")]
    agent, _ = make_real_agent(tmp_path, script, permission="plan")
    stdout = io.StringIO()
    run_lines(agent, io.StringIO("plan it\na\n"), stdout, poll=0.005)
    out = stdout.getvalue()
    assert "Plan: 1. write x.\nApprove this plan? (y = approve: carry it out, asking before changes" in out
    assert "The user approved the plan." in out and "Done." in out
    assert (tmp_path / "work" / "x").read_text() == "1\n"
