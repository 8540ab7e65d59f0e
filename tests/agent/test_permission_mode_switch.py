"""Agent.set_permission_mode: /permissions MODE changes what the following tool calls may do."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.tools import default_tools
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _write(path):
    return reply("", think="t", calls=[("write", {"path": path, "content": "data\n"})])


def test_switching_modes_changes_later_permission_checks(tmp_path):
    work = tmp_path / "work"
    h = AgentHarness.build(tmp_path, [_write("a.txt"), reply("ok", think=""),
                                      _write("b.txt"), reply("ok", think=""),
                                      _write("c.txt"), reply("ok", think="")],
                           tools=default_tools(), permission="ask", answer=lambda e: "n")
    # ask: the write is put to the user, who denies it
    evs = h.turn("one")
    assert len(of(evs, ev.PermissionRequest)) == 1 and not (work / "a.txt").exists()

    evs = h.command(lambda: h.agent.set_permission_mode("auto"))
    assert [n.text for n in of(evs, ev.Notice)] == ["permission mode: auto"]
    assert of(evs, ev.Status)[-1].permission_mode == "auto"
    evs = h.turn("two")
    assert of(evs, ev.PermissionRequest) == [] and (work / "b.txt").read_text() == "data\n"
    assert all(s.permission_mode == "auto" for s in of(evs, ev.Status))

    h.command(lambda: h.agent.set_permission_mode("read-only"))
    evs = h.turn("three")
    assert of(evs, ev.PermissionRequest) == [] and not (work / "c.txt").exists()
    assert of(evs, ev.ToolResult)[0].text.startswith("Tool error: write is not allowed in read-only mode")
    h.stop()


def test_unknown_mode_is_a_readable_error_and_changes_nothing(tmp_path):
    h = AgentHarness.build(tmp_path, [], permission="ask")
    evs = h.command(lambda: h.agent.set_permission_mode("yolo"))
    assert [e.text for e in of(evs, ev.Error)] == ["unknown permission mode: yolo (ask, auto, read-only, plan)"]
    assert h.worker.policy.mode == "ask" and h.worker.settings.permission == "ask"
    h.stop()
