"""Permission questions as events, answered through the facade (real write/bash tools)."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.tools import default_tools
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _write_calls(*paths):
    return reply("", think="t", calls=[("write", {"path": p, "content": "data\n"}) for p in paths])


def test_ask_allow_once_runs_the_write(tmp_path):
    h = AgentHarness.build(tmp_path, [_write_calls("a.txt"), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=lambda e: "y")
    evs = h.turn("write it")
    req = of(evs, ev.PermissionRequest)
    assert len(req) == 1 and req[0].tool == "write" and req[0].preview_kind == "diff"
    assert [k for k, _ in req[0].options] == ["y", "s", "n"]
    assert (tmp_path / "work" / "a.txt").read_text() == "data\n"
    assert of(evs, ev.ToolResult)[0].ok
    h.stop()


def test_deny_with_message_reaches_the_model(tmp_path):
    h = AgentHarness.build(tmp_path, [_write_calls("a.txt"), reply("ok", think="")],
                           tools=default_tools(), permission="ask",
                           answer=lambda e: ("n", "write to b.txt instead"))
    evs = h.turn("write it")
    assert not (tmp_path / "work" / "a.txt").exists()
    res = of(evs, ev.ToolResult)[0]
    assert not res.ok
    assert res.text == "Tool error: permission denied by the user; the user says: write to b.txt instead\n"
    assert b"<tool_result>Tool error: permission denied by the user; the user says: write to b.txt instead\n" in h.text()
    h.stop()


def test_allow_for_session_asks_once(tmp_path):
    h = AgentHarness.build(tmp_path, [_write_calls("a.txt", "b.txt"), reply("ok", think="")],
                           tools=default_tools(), permission="ask", answer=lambda e: "s")
    evs = h.turn("write both")
    assert len(of(evs, ev.PermissionRequest)) == 1
    assert (tmp_path / "work" / "b.txt").exists()
    h.stop()


def test_read_only_refuses_bash_without_asking(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("bash", {"command": "touch x"})]),
                                      reply("ok", think="")],
                           tools=default_tools(), permission="read-only")
    evs = h.turn("run")
    assert of(evs, ev.PermissionRequest) == []
    assert of(evs, ev.ToolResult)[0].text.startswith("Tool error: bash is not allowed in read-only mode")
    assert not (tmp_path / "work" / "x").exists()
    h.stop()


def test_interrupt_while_asking_denies_and_stops_the_block(tmp_path):
    holder = []

    def answer(e):
        holder[0].agent.interrupt()  # Esc while the question is open
        return None

    h = AgentHarness.build(tmp_path, [_write_calls("a.txt", "b.txt")], tools=default_tools(),
                           permission="ask", answer=answer)
    holder.append(h)
    evs = h.turn("write")
    res = of(evs, ev.ToolResult)
    assert res[0].text.startswith("Tool error: permission denied by the user")
    assert res[1].text == "Tool call not executed: the user interrupted."
    assert not (tmp_path / "work" / "a.txt").exists()
    assert of(evs, ev.TurnEnded)[-1].rounds == 1
    h.stop()


def test_session_answers_are_forgotten_on_new_and_load(tmp_path):
    h = AgentHarness.build(tmp_path, [_write_calls("a.txt"), reply("ok", think="")],
                           tools=default_tools(), permission="ask", answer=lambda e: "s")
    h.turn("write")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    h.engine.add(_write_calls("b.txt"), reply("ok", think=""))
    assert of(h.turn("again"), ev.PermissionRequest) == []  # remembered for this session
    h.answer = lambda e: "n" if isinstance(e, ev.Question) else "s"
    for switch in (h.agent.new, lambda: h.agent.load(saved.short_id)):
        h.command(switch)
        h.engine.add(_write_calls("c.txt"), reply("ok", think=""))
        assert len(of(h.turn("once more"), ev.PermissionRequest)) == 1
    h.stop()


def test_a_directory_swapped_for_a_link_while_the_question_waits_is_not_written_through(tmp_path):
    """The user is asked about sub/a.txt inside the tree; while the question waits, sub becomes a
    link to a directory outside. The write the user allowed does not land there."""
    import os

    work, outside = tmp_path / "work", tmp_path / "outside"
    outside.mkdir()

    def swap_then_allow(e):
        os.rename(work / "sub", work / "sub.old")
        os.symlink(outside, work / "sub")
        return "y"

    h = AgentHarness.build(tmp_path, [_write_calls("sub/a.txt"), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=swap_then_allow)
    (work / "sub").mkdir()
    evs = h.turn("write it")
    assert len(of(evs, ev.PermissionRequest)) == 1
    res = of(evs, ev.ToolResult)[0]
    assert not res.ok and "nothing was written" in res.text
    assert list(outside.iterdir()) == [] and list((work / "sub.old").iterdir()) == []
    h.stop()


def test_a_file_edited_while_the_question_waits_is_not_overwritten(tmp_path):
    work = tmp_path / "work"

    def edit_then_allow(e):
        (work / "a.txt").write_text("the user's own text\n")
        return "y"

    h = AgentHarness.build(tmp_path, [_write_calls("a.txt"), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=edit_then_allow)
    (work / "a.txt").write_text("before\n")
    evs = h.turn("write it")
    res = of(evs, ev.ToolResult)[0]
    assert not res.ok and "changed since the diff was shown" in res.text
    assert (work / "a.txt").read_text() == "the user's own text\n"
    h.stop()
