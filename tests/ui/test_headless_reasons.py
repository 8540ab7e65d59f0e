"""Headless (-p) says why a tool failed on stderr, agrees with --help about its permission mode,
and says when a --resume'd session is saved again with the task."""

from __future__ import annotations

import io
import re

import pytest

from ds4agent.cli import build_parser
from ds4agent.tools import default_tools, sandbox
from ds4agent.ui import headless
from tests.support.agent_harness import AgentHarness
from tests.support.scripted_engine import reply


def _run(tmp_path, script, **kw) -> tuple[int, str, str]:
    agent = AgentHarness.build(tmp_path, script, tools=default_tools(), start=False, **kw).agent
    out, err = io.StringIO(), io.StringIO()
    status = headless.run(agent, "go", out=out, err=err, timeout=60)
    return status, out.getvalue(), err.getvalue()


def test_a_failed_command_shows_its_exit_status_and_last_output_line(tmp_path):
    _, _, err = _run(tmp_path, [reply("", think="t", calls=[("bash", {"command": "echo one; echo two >&2; exit 3"})]),
                                reply("done", think="")], permission="auto")
    assert re.search(r"⏺ bash echo one; echo two >&2; exit 3\n  ✗ exit 3(  [0-9.]+ s)?\n    two\n", err), err


def test_a_command_that_succeeds_shows_exit_0_and_no_output(tmp_path):
    _, _, err = _run(tmp_path, [reply("", think="t", calls=[("bash", {"command": "echo fine"})]),
                                reply("done", think="")], permission="auto")
    assert "  ✓ exit 0" in err and err.count("fine") == 1  # in the call's line only


@pytest.mark.skipif(not sandbox.availability().available, reason="no OS sandbox on this machine")
def test_a_sandbox_refusal_says_the_sandbox_reason(tmp_path):
    (tmp_path / "outside").mkdir()
    _, _, err = _run(tmp_path, [reply("", think="t", calls=[("bash", {"command": "echo x > ../outside/f"})]),
                                reply("done", think="")], permission="auto")
    assert "  ✗ exit " in err
    assert "    sandbox: the OS sandbox refused writing to " in err and str(tmp_path / "outside/f") in err


def test_help_says_what_ask_becomes_without_a_terminal():
    text = " ".join(build_parser().format_help().split())
    assert "with -p and no terminal to ask on, ask becomes read-only" in text
    assert "without one it runs read-only unless --permission auto" in text


def test_a_resumed_session_is_said_to_be_saved_again(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("first", think=""), reply("second", think="")],
                           tools=default_tools())
    h.turn("one")
    h.command(lambda: h.agent.save("kept"))
    sid = h.worker.conv.identity.session_id
    h.stop()
    again = AgentHarness.build(tmp_path, [reply("second", think="")], tools=default_tools(), start=False,
                               resume=sid[:8], journal=False)
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(again.agent, "two", out=out, err=err, timeout=60, save=True) == 0
    text = err.getvalue()
    assert f"ds4agent: continuing session {sid[:8]}: this task's turns are added to it" in text
    assert f"ds4agent: saved session {sid[:8]} (" in text and "now with this task's turns" in text
