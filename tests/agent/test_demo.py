"""`ds4agent --demo`: the scripted tour engine drives the real agent through every kind of tool
call (read, edit, bash, a refused write outside the project, an MCP call to the stand-in
server), each behind its real permission question."""

from __future__ import annotations

import shutil

import pytest

from ds4agent.agent import Agent, demo
from ds4agent.agent import events as ev
from ds4agent.agent.settings import AgentRun, AgentSettings
from ds4agent.agent.wiring import build_from_run
from tests.support.agent_harness import AgentHarness, of


def _run(**over: object) -> AgentRun:
    base: dict = dict(ctx=100_000, permission="ask", think_mode="think", seed=1, subagents=True)
    base.update(over)
    return AgentRun(AgentSettings(**base), demo=True)


def _demo_agent(tmp_path, monkeypatch, answer, **over) -> AgentHarness:
    monkeypatch.setenv("DS4AGENT_DEMO_DIR", str(tmp_path / "demo"))
    place = demo.default_place()
    demo.prepare(place)
    loader, store, tools, settings, mcp = build_from_run(_run(**over))
    agent = Agent(loader, store, tools, settings, mcp=mcp)
    h = AgentHarness(agent, None, store, tmp_path, answer)
    h.start()
    return h


def _answers(e: ev.Event) -> str:
    if isinstance(e, ev.Question):
        return "y"  # the project .mcp.json: start the stand-in server
    assert isinstance(e, ev.PermissionRequest)
    return "n" if "outside the working directory" in e.question else "y"


def test_the_tour_reads_edits_runs_refuses_a_write_and_calls_the_mcp_server(tmp_path, monkeypatch):
    h = _demo_agent(tmp_path, monkeypatch, _answers)
    try:
        place = demo.default_place()
        assert h.agent.settings.cwd == place.project
        assert [e.kind for e in of(h.events, ev.Question)] == ["mcp"]
        evs = h.turn("show me around")
        results = of(evs, ev.ToolResult)
        assert [r.name for r in results] == ["read", "edit", "bash", "write", demo.MCP_TOOL]
        assert [r.ok for r in results] == [True, True, True, False, True]
        asked = [e.tool for e in of(evs, ev.PermissionRequest)]
        assert asked == ["edit", "bash", "write"]  # read and the read-only MCP tool ask nothing
        assert (place.project / "greet.py").read_text() == demo.GREET.replace(demo.GREET_OLD, demo.GREET_NEW)
        assert "Hello, world!" in results[2].text  # the edited script ran
        assert "denied by the user" in results[3].text
        assert not (place.root / demo.OUTSIDE).exists()
        assert "/save keeps the conversation" in results[4].text
        answer = "".join(e.text for e in of(evs, ev.TextDelta))
        assert "The write was refused" in answer and "The MCP server answered with a tip." in answer
        assert of(evs, ev.TurnEnded)[-1].reason == "done"
        # Every message runs the tour again, from the read.
        again = of(h.turn("once more"), ev.ToolResult)
        assert [r.name for r in again][:2] == ["read", "edit"]
    finally:
        h.stop()


def test_without_the_mcp_approval_the_tour_says_the_server_did_not_answer(tmp_path, monkeypatch):
    def answers(e: ev.Event) -> str:
        return "n" if isinstance(e, ev.Question) else "y"

    h = _demo_agent(tmp_path, monkeypatch, answers, permission="auto")
    try:
        evs = h.turn("go")
        results = of(evs, ev.ToolResult)
        assert results[-1].name == demo.MCP_TOOL and not results[-1].ok
        assert (demo.default_place().root / demo.OUTSIDE).exists()  # allowed this time
        answer = "".join(e.text for e in of(evs, ev.TextDelta))
        assert "You allowed the write" in answer and "The MCP server did not answer" in answer
    finally:
        h.stop()


def test_the_demo_keeps_its_files_out_of_the_users_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4AGENT_DEMO_DIR", str(tmp_path / "demo"))
    _, store, _, settings, mcp = build_from_run(_run())
    root = tmp_path / "demo"
    assert settings.kv_dir == root / "kvcache" and store.directory == root / "kvcache"
    assert str(settings.journal_dir).startswith(str(root)) and str(settings.undo_dir).startswith(str(root))
    assert mcp is not None and mcp.config_dir == root / "config" and mcp.user == ()


def test_prepare_writes_the_project_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4AGENT_DEMO_DIR", str(tmp_path / "demo"))
    place = demo.default_place()
    demo.prepare(place)
    (place.project / "greet.py").write_text("changed by the last tour\n")
    (place.root / demo.OUTSIDE).write_text("x")
    demo.prepare(place)
    assert (place.project / "greet.py").read_text() == demo.GREET
    assert not (place.root / demo.OUTSIDE).exists()


@pytest.mark.skipif(shutil.which("python3") is None, reason="the tour's bash step runs python3")
def test_nothink_mode_gets_answers_without_reasoning(tmp_path, monkeypatch):
    h = _demo_agent(tmp_path, monkeypatch, _answers, think_mode="nothink")
    try:
        evs = h.turn("hi")
        assert not of(evs, ev.ThinkingDelta)
        assert len(of(evs, ev.ToolResult)) == 5
    finally:
        h.stop()
