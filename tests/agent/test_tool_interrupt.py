"""The agent's interrupt reaches a search whose regex is running (issue 10, item 2): the regex runs
in a child process, so the agent's worker thread keeps polling the interrupt flag meanwhile."""

from __future__ import annotations

import threading

from ds4agent.agent import events as ev
from ds4agent.tools import regex_worker
from ds4agent.tools.search import SearchTool
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def test_interrupt_stops_a_search_inside_a_catastrophic_regex(tmp_path, monkeypatch):
    in_regex = threading.Event()
    original = regex_worker.RegexWorker.hits

    def hits(self, *args, **kwargs):
        in_regex.set()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(regex_worker.RegexWorker, "hits", hits)
    call = ("search", {"query": r"^(\w+\s?)+$", "mode": "regex"})
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[call]), reply("Ok.", think="")],
                           tools=[SearchTool()])
    (h.root / "work" / "evil.txt").write_text("a" * 40 + "!\n")
    assert h.agent.submit("find it")
    assert in_regex.wait(30), "the search never reached the regex"
    h.agent.interrupt()
    evs = h.settle(timeout=30)
    results = of(h.events, ev.ToolResult)
    assert [(r.name, r.ok, r.text) for r in results] == [
        ("search", False, "Tool error: search interrupted by the user before any match was found\n")]
    assert of(evs, ev.TurnEnded)
    h.stop()
