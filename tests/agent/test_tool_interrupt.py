"""The agent's interrupt reaches a running search: rg runs in a child process, so the agent's
worker thread keeps polling the interrupt flag meanwhile, and kills rg when it is set."""

from __future__ import annotations

import stat
import time

from ds4agent.agent import events as ev
from ds4agent.tools import search
from ds4agent.tools.search import SearchTool
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def test_interrupt_stops_a_running_search(tmp_path, monkeypatch):
    # rg runs inside the sandbox: it may write in the working tree only.
    (tmp_path / "work").mkdir(exist_ok=True)
    started = tmp_path / "work" / ".started"
    slow_rg = tmp_path / "slow-rg"  # a stand-in for rg on a tree that takes minutes
    slow_rg.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    slow_rg.chmod(slow_rg.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(search, "find_rg", lambda: str(slow_rg))
    call = ("search", {"query": "needle"})
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[call]), reply("Ok.", think="")],
                           tools=[SearchTool()])
    assert h.agent.submit("find it")
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the search never started rg"
        time.sleep(0.01)
    h.agent.interrupt()
    evs = h.settle(timeout=30)
    results = of(h.events, ev.ToolResult)
    assert [(r.name, r.ok, r.text) for r in results] == [
        ("search", False, "Tool error: search interrupted by the user before any match was found\n")]
    assert of(evs, ev.TurnEnded)
    h.stop()
