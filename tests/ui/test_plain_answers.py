"""Plain line mode's answers: a person at a terminal is asked again after an answer that is not
one of the keys; piped input answers only with a line that is an answer (anything else runs as
the next input), and never answers a question meant for a person (the project's MCP approval)."""

from __future__ import annotations

import io
import json
import sys

from ds4agent.agent import events as ev
from ds4agent.ui.plain import line_answer, run_lines
from tests.support.scripted_engine import reply
from tests.ui.conftest import make_real_agent

SAVE = ev.Question(id="q1", kind="save", question="Save current session?",
                   options=(("y", "save"), ("n", "don't save"), ("c", "cancel")))
MCP = ev.Question(id="q2", kind="mcp", question="Start them?",
                  options=(("y", "yes"), ("n", "not now"), ("d", "never")))


def _answer(q, lines, person):
    feed = list(lines)
    unread, said = [], []
    got = line_answer(q, tuple(k for k, _ in q.options), person, lambda: feed.pop(0) if feed else "",
                      unread.append, said.append)
    return got, unread, feed, "".join(said)


def test_a_person_is_asked_again_after_an_invalid_answer():
    got, unread, left, said = _answer(SAVE, ["maybe\n", "/quit\n", "y\n", "more\n"], person=True)
    assert got == "y" and unread == [] and left == ["more\n"]
    assert said.count("answer with one of: y, n, c") == 2


def test_piped_input_keeps_a_line_that_is_no_answer_for_the_next_input():
    got, unread, left, said = _answer(SAVE, ["/quit\n", "y\n"], person=False)
    assert got == "c" and unread == ["/quit\n"] and left == ["y\n"]
    assert "not an answer" in said
    assert _answer(SAVE, ["yes\n"], person=False)[0] == "y"
    assert _answer(SAVE, [], person=False)[0] == "n"  # end of input: "n", as the reference


def test_piped_input_never_answers_the_mcp_approval():
    got, unread, left, _ = _answer(MCP, ["y\n", "/quit\n"], person=False)
    assert got == "n" and unread == [] and left == ["y\n", "/quit\n"]
    assert _answer(MCP, ["y\n"], person=True)[0] == "y"


def test_a_piped_quit_after_a_project_mcp_file_still_quits(tmp_path):
    from ds4agent.agent.facade import Agent
    from ds4agent.tools.mcp import load_config

    agent, engine = make_real_agent(tmp_path, [reply("hi", think="")])
    work = tmp_path / "work"
    server = {"mcpServers": {"never": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}}}
    (work / ".mcp.json").write_text(json.dumps(server), encoding="utf-8")
    mcp = load_config(work, tmp_path / "config", environ={})
    agent = Agent(engine, agent._worker.store, None, agent.settings, mcp=mcp)
    stdout = io.StringIO()
    assert run_lines(agent, io.StringIO("hello\n/quit\n"), stdout, poll=0.005) == 0
    out = stdout.getvalue()
    assert "Start them? (y = yes, for this file, n = not now, d = never for this file) " \
           "(no one at a terminal to answer) n\n" in out
    assert "› hello" in out and "hi" in out  # the first line was the message, not the answer
    assert not (tmp_path / "config" / "mcp-approvals.json").exists()
