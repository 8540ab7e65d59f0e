"""Headless mode: stdout gets the answer, stderr the tool activity, --json one event per line."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from ds4agent.ui import headless
from tests.support.agent_harness import AgentHarness
from tests.support.scripted_engine import reply


def _agent(tmp_path, tools, script, **kw):
    return AgentHarness.build(tmp_path, script, tools=tools, start=False, **kw).agent


def test_answer_to_stdout_tools_to_stderr(tmp_path, tools):
    agent = _agent(tmp_path, tools, [reply("Looking.", think="t", calls=[("alpha", {"x": "1"})]),
                                     reply("All good.", think="t")])
    out, err = io.StringIO(), io.StringIO()
    status = headless.run(agent, "check", out=out, err=err, timeout=30)
    assert status == 0
    assert out.getvalue() == "Looking.\n\nAll good.\n"
    assert "⏺ alpha\n  ✓ A1\n" in err.getvalue()
    assert tools[0].calls == [{"x": "1"}]


def test_json_lines_and_failure_status(tmp_path, tools):
    agent = _agent(tmp_path, tools, [reply("one two three four five", think="t")], round_tokens=3)
    out, err = io.StringIO(), io.StringIO()
    status = headless.run(agent, "go", out=out, err=err, json_mode=True, timeout=30)
    assert status == 1  # cut by the token cap: incomplete
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    types = [x["type"] for x in lines]
    assert types.index("Ready") < types.index("UserTurn") < types.index("TurnEnded")
    assert lines[-1] == {**lines[-1], "type": "TurnEnded", "reason": "token_cap"}
    assert any(x["type"] == "Status" and x["state"] == "generating" for x in lines)


def test_permission_question_without_asker_is_denied(tmp_path):
    from ds4agent.tools import default_tools

    agent = _agent(tmp_path, default_tools(),
                   [reply("", think="t", calls=[("write", {"path": "f.txt", "content": "x"})]),
                    reply("Could not write.", think="")], permission="ask")
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(agent, "write f", out=out, err=err, timeout=30) == 0
    assert not (tmp_path / "work" / "f.txt").exists()
    assert "✗ Tool error: permission denied by the user" in err.getvalue()


def test_cli_without_tty_falls_back_to_read_only(tmp_path, monkeypatch, capsys):
    """main() wiring: no TTY + ask -> read-only, said on stderr; the engine comes from the loader."""
    from ds4agent.agent import wiring
    from tests.support.scripted_engine import ScriptedEngine

    eng = ScriptedEngine([reply("", think="t", calls=[("bash", {"command": "touch made"})]),
                          reply("Refused.", think="")], ctx=16384)
    monkeypatch.setattr(wiring, "engine_loader", lambda path, ctx, device=None, **pipeline: (lambda progress: eng))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    from ds4agent.cli import parse

    args = replace(parse(["-p", "make a file", "--kv-dir", str(tmp_path / "kv"), "--ctx", "16384"]),
                   model_path=tmp_path / "unused.gguf")
    assert headless.main(args) == 0
    cap = capsys.readouterr()
    assert "running read-only" in cap.err
    assert "bash is not allowed in read-only mode" in cap.err
    assert cap.out == "Refused.\n"
    assert not (tmp_path / "made").exists()


def test_cli_end_to_end_on_the_tiny_model(tmp_path, tiny_model):
    """`ds4agent -p ... --json` in a fresh process: real engine, real store, JSON lines."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), HOME=str(tmp_path))
    cmd = [sys.executable, "-m", "ds4agent.cli", "-m", str(tiny_model), "--kv-dir", str(tmp_path / "kv"),
           "--ctx", "4096", "--tokens", "4", "--seed", "3", "--nothink", "--json", "-p", "hello"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    end = [x for x in lines if x["type"] == "TurnEnded"]
    assert end and end[0]["reason"] in ("token_cap", "done", "stop_token")
    assert end[0]["generated"] == 4 if end[0]["reason"] == "token_cap" else end[0]["generated"] <= 4
    assert res.returncode == (0 if end[0]["reason"] == "done" else 1)
    assert "running read-only" not in res.stderr  # no tool call was refused for it
    assert len(list((tmp_path / "kv").glob("sysprompt-*.kv"))) == 1


def test_unusable_kv_dir_is_one_readable_line(tmp_path, capsys):
    from ds4agent.agent import Agent, events
    from ds4agent.cli import parse

    (tmp_path / "file").write_text("x")
    args = replace(parse(["-p", "hi", "--kv-dir", str(tmp_path / "file" / "kv")]), model_path=tmp_path / "none.gguf")
    assert headless.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ds4agent: KV directory {tmp_path / 'file' / 'kv'} cannot be created: "
                          f"{tmp_path / 'file'} is a file") and "Traceback" not in err
    agent = Agent.from_run(args)  # the UI path: no exception in the caller, a fatal event instead
    agent.start()
    got = []
    while not any(isinstance(e, events.Exited) for e in got):
        got.append(agent.events.get(timeout=10))
    fatal = [e for e in got if isinstance(e, events.Error)]
    assert fatal[0].fatal and fatal[0].text.startswith("startup failed: KV directory")


class _Terminal(io.StringIO):
    """stdout and stderr on one terminal: both streams write into the same screen."""


def test_the_verdict_on_stderr_starts_its_own_line_after_an_unfinished_answer(tmp_path, tools):
    agent = _agent(tmp_path, tools, [reply("one two three four five", think=None)], round_tokens=3,
                   think_mode="nothink")
    screen = _Terminal()
    assert headless.run(agent, "go", out=screen, err=screen, timeout=30) == 1
    lines = screen.getvalue().split("\n")
    assert lines[-1] == ""
    assert lines[-2] == "ds4agent: the answer is incomplete (token cap)"
    assert lines[-3].startswith("one") and "ds4agent" not in lines[-3]


def test_a_round_that_only_thought_says_where_the_token_budget_went(tmp_path, tools):
    agent = _agent(tmp_path, tools, [reply("The answer.", think="a long chain of thought " * 5)],
                   round_tokens=6)
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(agent, "go", out=out, err=err, timeout=30) == 1
    assert out.getvalue() == ""
    assert err.getvalue() == ("ds4agent: the answer is incomplete (token cap): thinking used the round's "
                              "whole token budget before any answer (raise --tokens, or use --nothink)\n")


def test_the_printed_resume_hint_works_as_printed_and_another_model_is_refused(tmp_path, tiny_model):
    """Plain mode saves and prints "resume with `ds4agent --resume ID`"; that line, run as it is
    (no --model), reopens the session in the model it was saved with. Headless --resume into a
    same-shape model with other weights is a question no one answers: it stops, nothing runs."""
    import os
    import re
    import subprocess
    import sys

    from ds4agent.testmodels.writer import make_test_model

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), HOME=str(tmp_path),
               DS4AGENT_KV_DIR=str(tmp_path / "kv"), DS4AGENT_MODEL_DIR=str(tmp_path / "models"))
    env.pop("DS4AGENT_MODEL", None)
    work = tmp_path / "work"
    work.mkdir()
    flags = ["--ctx", "4096", "--tokens", "4", "--seed", "3", "--nothink"]
    first = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--plain", "-m", str(tiny_model), *flags],
                           input="hello\n/save\n", cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    hint = re.search(r"resume with (ds4agent --resume [0-9a-f]{8})", first.stdout).group(1)
    sid = hint.split()[-1]
    argv = hint.split()[1:]
    again = subprocess.run([sys.executable, "-m", "ds4agent.cli", *argv, *flags, "-p", "more"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert f"session {sid} was saved with {Path(tiny_model).resolve()}; using that model" in again.stderr
    assert "no model found" not in again.stderr and f"saved session {sid}" in again.stderr

    other = make_test_model(tmp_path / "other.gguf", config="tiny", seed=1)
    before = sorted(p.name for p in (tmp_path / "kv").glob("*.kv"))
    moved = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--resume", sid, "-m", str(other), *flags,
                            "-p", "more"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert moved.returncode == 1
    assert f"load cancelled: session {sid} belongs to another model" in moved.stderr
    assert "cannot continue: the session did not load; nothing was run" in moved.stderr
    assert sorted(p.name for p in (tmp_path / "kv").glob("*.kv")) == before


def test_a_custom_command_as_the_prompt_sends_its_file(tmp_path, tools):
    cmd = tmp_path / "work/.ds4agent/commands/review.md"
    cmd.parent.mkdir(parents=True)
    cmd.write_text("Review $ARGUMENTS for bugs.")
    h = AgentHarness.build(tmp_path, [reply("Reviewed.", think="t")], tools=tools, start=False,
                           config_dir=tmp_path / "conf")
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(h.agent, "/review src/x.py", out=out, err=err, timeout=30) == 0
    assert out.getvalue() == "Reviewed.\n"
    assert b"Review src/x.py for bugs.<" in h.text()


def test_subagent_lines_on_stderr(tmp_path, tools):
    agent = _agent(tmp_path, tools, [reply("", think="t", calls=[("task", {"goal": "look around"})]),
                                     reply("Nothing odd.", think="t"), reply("Fine.", think="t")],
                   subagents=True)
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(agent, "check", out=out, err=err, timeout=30) == 0
    assert "⎇ subagent: look around\n" in err.getvalue()
    assert "  ⎇ subagent done (1 rounds, " in err.getvalue() and "tokens): Nothing odd.\n" in err.getvalue()
