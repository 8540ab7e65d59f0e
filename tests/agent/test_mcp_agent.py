"""MCP tools through the real agent: the scripted engine writes the DSML calls, the fixture server
(tests/tools/mcp_fixture_server.py) runs them over stdio. One agent (and one server) for the module;
each test sets the permission mode it needs and scripts its own rounds."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from ds4agent.agent import events as ev
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import ASSISTANT, EOS, THINK
from ds4agent.sessions.store import SessionStore
from ds4agent.tools import default_tools
from ds4agent.tools.mcp import Approvals, load_config
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

pytestmark = pytest.mark.xdist_group("mcp-agent")

FIXTURE = str(Path(__file__).resolve().parent.parent / "tools" / "mcp_fixture_server.py")
LOOKUP_LINE = ('{"name": "fixture__lookup", "description": "Look up a colour\'s hex value.", "parameters": '
               '{"properties": {"key": {"type": "string"}, "delay": {"type": "number"}}, "required": ["key"], '
               '"type": "object"}}')
WRITE_LINE = ('{"name": "fixture__write_note", "description": "Write a note to a file.", "parameters": '
              '{"properties": {"path": {"type": "string"}, "text": {"type": "string"}}, "required": '
              '["path", "text"], "type": "object"}}')


def _configure(root: Path, project: dict, user: dict | None = None):
    work = root / "work"
    (work / ".git").mkdir(parents=True, exist_ok=True)
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": project}), encoding="utf-8")
    config_dir = root / "config"
    config_dir.mkdir(exist_ok=True)
    if user is not None:
        (config_dir / "mcp.json").write_text(json.dumps({"mcpServers": user}), encoding="utf-8")
    config = load_config(work, config_dir, environ={})
    return dataclasses.replace(config, log_dir=root / "logs")


class Answers:
    """The module agent's answers: "y" to the project question, then whatever a test sets."""

    def __init__(self) -> None:
        self.permission = "y"
        self.asked: list[ev.Event] = []

    def __call__(self, e: ev.Event):
        self.asked.append(e)
        if isinstance(e, ev.Question):
            return "y" if e.kind == "mcp" else "n"
        return self.permission


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp-agent")
    config = _configure(root, {"fixture": {"command": sys.executable, "args": [FIXTURE]}},
                        user={"broken": {"command": str(root / "nothing-here")}})
    answers = Answers()
    h = AgentHarness.build(root, answer=answers, mcp=config, permission="ask")
    h.start_events = list(h.events)
    h.answers = answers
    h.config = config
    yield h
    h.stop()


def _mode(h, mode: str) -> None:
    h.command(lambda: h.agent.set_permission_mode(mode))


def _results(events):
    return [(r.name, r.ok, r.text) for r in of(events, ev.ToolResult)]


def test_the_project_file_is_asked_about_once_and_the_answer_remembered(agent):
    questions = [e for e in agent.start_events if isinstance(e, ev.Question)]
    assert [q.kind for q in questions] == ["mcp"]
    assert f"`fixture`: {sys.executable} {FIXTURE}" in questions[0].question
    assert [k for k, _ in questions[0].options] == ["y", "n", "d"]
    assert Approvals(agent.config.config_dir).answer(agent.config.project) is True
    notices = [n.text for n in of(agent.start_events, ev.Notice)]
    assert "MCP servers: fixture (2 tools)" in notices
    # The user's broken server is a notice, not a failed start.
    assert any(n.startswith("MCP server `broken` could not start: No such file or directory") for n in notices)
    assert of(agent.start_events, ev.Ready)


def test_mcp_tools_follow_ours_in_the_tools_block(agent):
    system = agent.text(0)[: len(agent.worker.tok.decode_bytes(agent.worker.conv.system_ids))].decode("utf-8")
    ours = [template.tool_schema_line(t) for t in default_tools()]
    block = template.TOOLS_BLOCK_HEAD + "\n".join([*ours, LOOKUP_LINE, WRITE_LINE]) + template.TOOLS_BLOCK_TAIL
    assert system.endswith("\n\n" + block)


def test_a_call_is_routed_to_its_server_and_its_result_rendered(agent):
    _mode(agent, "ask")
    agent.engine.add(reply("", think="t", calls=[("fixture__lookup", {"key": "red"})]), reply("Red.", think=""))
    start = len(agent.ids)
    evs = agent.turn("what is red?")
    assert _results(evs) == [("fixture__lookup", True, "#ff0000\n")]
    assert not of(evs, ev.PermissionRequest)  # a read-only tool never asks
    assert b"<tool_result>#ff0000\n</tool_result>" in agent.text(start)


def test_ask_mode_asks_with_the_arguments_shown(agent):
    _mode(agent, "ask")
    work = agent.root / "work"
    call = ("fixture__write_note", {"path": "a.txt", "text": "one"})
    agent.answers.permission = "y"
    agent.engine.add(reply("", think="t", calls=[call]), reply("Written.", think=""))
    evs = agent.turn("write a")
    [request] = of(evs, ev.PermissionRequest)
    assert request.tool == "fixture__write_note"
    assert request.question == "Allow the MCP tool (it declares itself destructive) `fixture__write_note`?"
    assert json.loads(request.detail) == {"path": "a.txt", "text": "one"}
    assert request.preview_kind == "arguments"
    assert request.options == (("y", "allow once"), ("s", "allow `fixture__write_note` for this session"),
                               ("n", "deny"))
    assert _results(evs) == [("fixture__write_note", True, "wrote a.txt\n")]
    assert (work / "a.txt").read_text() == "one"
    agent.answers.permission = "n"
    agent.engine.add(reply("", think="t", calls=[("fixture__write_note", {"path": "b.txt", "text": "x"})]),
                     reply("Ok.", think=""))
    evs = agent.turn("write b")
    assert _results(evs) == [("fixture__write_note", False, "Tool error: permission denied by the user\n")]
    assert not (work / "b.txt").exists()


def test_auto_mode_asks_only_for_a_tool_that_declares_itself_destructive(agent):
    _mode(agent, "auto")
    agent.answers.permission = "y"
    calls = [("fixture__lookup", {"key": "green"}), ("fixture__write_note", {"path": "c.txt", "text": "c"})]
    agent.engine.add(reply("", think="t", calls=calls), reply("Ok.", think=""))
    evs = agent.turn("both")
    assert [r.tool for r in of(evs, ev.PermissionRequest)] == ["fixture__write_note"]
    assert _results(evs) == [("fixture__lookup", True, "#00ff00\n"), ("fixture__write_note", True, "wrote c.txt\n")]


def test_read_only_mode_runs_only_the_tools_that_declare_themselves_read_only(agent):
    _mode(agent, "read-only")
    calls = [("fixture__lookup", {"key": "red"}), ("fixture__write_note", {"path": "d.txt", "text": "d"})]
    agent.engine.add(reply("", think="t", calls=calls), reply("Ok.", think=""))
    evs = agent.turn("both again")
    assert not of(evs, ev.PermissionRequest)
    assert _results(evs) == [
        ("fixture__lookup", True, "#ff0000\n"),
        ("fixture__write_note", False, "Tool error: fixture__write_note is not allowed in read-only mode: this MCP "
                                       "tool does not declare itself read-only\n"),
    ]
    assert not (agent.root / "work" / "d.txt").exists()


def test_a_slow_call_is_cancelled_by_the_interrupt(agent):
    _mode(agent, "auto")
    agent.engine.add(reply("", think="t", calls=[("fixture__lookup", {"key": "red", "delay": 60})]))
    assert agent.agent.submit("slow")
    agent.until(lambda e: isinstance(e, ev.Status) and e.state == ev.State.TOOL and e.detail == "fixture__lookup")
    agent.agent.interrupt()
    evs = agent.settle()
    assert _results(evs) == [("fixture__lookup", False, "Tool error: interrupted by the user; the call to "
                              "`lookup` on the MCP server `fixture` was cancelled\n")]
    # The turn is over: the results, then an empty answer (THINK_TOKEN directly followed by EOS).
    assert agent.ids[-3:] == [ASSISTANT, THINK, EOS]
    assert len(of(evs, ev.TurnEnded)) == 1
    # The server is still there for the next call.
    agent.engine.add(reply("", think="t", calls=[("fixture__lookup", {"key": "green"})]), reply("Ok.", think=""))
    assert _results(agent.turn("again")) == [("fixture__lookup", True, "#00ff00\n")]


def test_a_session_saved_with_mcp_tools_loads_without_the_server(agent, tmp_path):
    _mode(agent, "auto")
    agent.engine.add(reply("", think="t", calls=[("fixture__lookup", {"key": "red"})]), reply("Red.", think=""))
    agent.turn("what is red?")
    [saved] = of(agent.command(lambda: agent.agent.save("with mcp")), ev.SessionSaved)
    saved_ids = agent.ids

    # Another run, in which no MCP server is configured; the same session directory.
    other = AgentHarness.build(tmp_path, store=SessionStore(agent.root / "kv"))
    try:
        evs = other.command(lambda: other.agent.load(saved.short_id))
        assert of(evs, ev.SessionLoaded)
        assert other.ids == saved_ids  # the transcript is exactly the saved one, its tools block included
        assert any("saved with a different system prompt" in n.text for n in of(evs, ev.Notice))
        other.engine.add(reply("", think="t", calls=[("fixture__lookup", {"key": "red"})]), reply("Hm.", think=""))
        evs = other.turn("and now?")
        assert _results(evs) == [("fixture__lookup", False, "Tool error: unknown tool: fixture__lookup: no MCP "
                                  "server `fixture` is running in this session")]
        assert other.ids[: len(saved_ids)] == saved_ids
    finally:
        other.stop()


@pytest.mark.parametrize("key, remembered", [("n", None), ("d", False)])
def test_a_project_file_not_approved_starts_nothing(tmp_path, key, remembered):
    config = _configure(tmp_path, {"proj": {"command": str(tmp_path / "would-run")}})
    h = AgentHarness.build(tmp_path, answer=lambda e: key if isinstance(e, ev.Question) else None, mcp=config)
    try:
        assert [q.kind for q in of(h.events, ev.Question)] == ["mcp"]
        assert h.worker.mcp is None
        assert any("are not started" in n.text for n in of(h.events, ev.Notice))
        assert Approvals(config.config_dir).answer(config.project) is remembered
    finally:
        h.stop()
    if remembered is False:
        again = AgentHarness.build(tmp_path / "again", answer=lambda e: "y", mcp=config)
        try:
            assert not of(again.events, ev.Question)  # refused for good: not asked again
            assert again.worker.mcp is None
        finally:
            again.stop()
