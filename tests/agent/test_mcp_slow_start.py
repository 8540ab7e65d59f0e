"""A hanging MCP server does not hold the start behind a silent "loading model… 100%": the status
says which server it waits for, and a message sent meanwhile ends the wait (the message runs, the
server's tools join at the next /new)."""

from __future__ import annotations

import os
import sys

import pytest

from ds4agent.agent import events as ev
from ds4agent.agent import mcp_glue
from ds4agent.tools.mcp import McpConfig, ServerConfig
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def test_a_message_sent_while_waiting_for_a_hanging_server_starts_without_it(tmp_path, monkeypatch):
    # Longer than the harness's guard: only the sent message can end this wait in time.
    monkeypatch.setattr(mcp_glue, "JOIN_TIMEOUT", 3600.0)
    pid_file = tmp_path / "slow.pid"
    hang = ServerConfig("slow", sys.executable, ("-c", f"import os, time; open({str(pid_file)!r}, 'w')"
                                                       ".write(str(os.getpid())); time.sleep(3600)"))
    mcp = McpConfig(tmp_path / "config", user=(hang,), log_dir=tmp_path / "log")
    h = AgentHarness.build(tmp_path, [reply("Hello.", think="")], start=False, mcp=mcp)
    try:
        h.agent.start()
        waiting = h.until(lambda e: isinstance(e, ev.Status) and e.detail.startswith("waiting for MCP server"))
        assert waiting[-1].detail == "waiting for MCP server slow (send a message to go on without it)"
        assert waiting[-1].state is ev.State.LOADING
        assert h.agent.submit("hi")  # queued: the agent is still starting
        evs = h.until(lambda e: isinstance(e, ev.Ready), timeout=60)
        notes = [e.text for e in of(evs, ev.Notice)]
        assert "MCP server `slow` is still starting; its tools join with the next /new session" in notes
        evs = h.settle()
        assert "".join(e.text for e in of(evs, ev.TextDelta)) == "Hello."
    finally:
        h.stop()
    # Stopping the agent stops the server that never finished starting: no process left behind.
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_status_line_shows_the_wait():
    from ds4agent.ui import fmt

    s = fmt.StatusState()
    s.set_state("loading", "waiting for MCP server slow (send a message to go on without it)")
    assert fmt.state_segment(s) == "waiting for MCP server slow (send a message to go on without it)…"
    s.set_state("loading", "loading model")
    s.load_fraction = 0.37
    assert fmt.state_segment(s) == "loading model… 37%"
