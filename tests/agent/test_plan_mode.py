"""Plan mode: the model reads and plans, nothing changes until the user approves the plan; then
the same session goes on in the mode the user chose."""

from __future__ import annotations

import io

from ds4agent.agent import events as ev
from ds4agent.agent.plan import APPROVED, PLAN_NOTE, SENT_BACK
from ds4agent.tools import default_tools
from ds4agent.ui import headless
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

PLAN1 = "Plan:\n1. Create a.txt with the greeting."
PLAN2 = "Plan:\n1. Create a.txt with the greeting.\n2. Create b.txt too."


def _write(path):
    return reply("", think="t", calls=[("write", {"path": path, "content": "hello\n"})])


def test_plan_is_refused_writes_then_comments_then_approval_carries_it_out(tmp_path):
    work = tmp_path / "work"
    (work).mkdir(parents=True)
    (work / "notes.txt").write_text("greet the user\n")
    asked = []

    def answer(e):
        asked.append(e)
        if e.tool == "plan":
            return ("n", "also create b.txt") if len(of(asked, ev.PermissionRequest)) == 1 else "y"
        return "y"  # the write, once the plan is approved (ask mode)

    script = [_write("a.txt"),                                           # refused: plan mode
              reply("", think="t", calls=[("read", {"path": "notes.txt"})]),
              reply(PLAN1, think="t"),                                   # plan 1: sent back
              reply(PLAN2, think="t"),                                   # plan 2: approved
              _write("a.txt"), _write("b.txt"), reply("Done: a.txt and b.txt.", think="")]
    h = AgentHarness.build(tmp_path, script, tools=default_tools(), permission="ask", answer=answer)
    evs = h.command(h.agent.toggle_plan)
    assert [n.text for n in of(evs, ev.Notice)] == [
        "permission mode: plan (plan mode: the model reads and plans; nothing is changed until you approve)"]
    assert of(evs, ev.Status)[-1].permission_mode == "plan"

    evs = h.turn("greet the user in a file")
    results = of(evs, ev.ToolResult)
    assert results[0].text == ("Tool error: write is not allowed in plan mode: no file can be changed while "
                               "planning; investigate with read, search and list, then answer with your "
                               "plan for the user to approve\n")
    assert results[1].ok and results[1].name == "read"  # reading runs
    plans = [e for e in of(evs, ev.PermissionRequest) if e.tool == "plan"]
    assert [p.detail for p in plans] == [PLAN1, PLAN2]
    assert plans[0].question == "Approve this plan?" and [k for k, _ in plans[0].options] == ["y", "a", "n", "m"]
    turns = [e.text for e in of(evs, ev.UserTurn)]
    assert turns == ["greet the user in a file", SENT_BACK.format(comments="also create b.txt"),
                     APPROVED.format(mode="ask")]
    # The model was told, in the transcript, while planning; the approved turn is a plain one.
    text = h.text().decode()
    assert text.count(PLAN_NOTE) == 2
    assert (PLAN_NOTE + "greet the user in a file") in text and (PLAN_NOTE + APPROVED.format(mode="ask")) not in text
    # Approved: the session goes on in ask mode, where the writes asked and ran.
    assert [e.tool for e in of(evs, ev.PermissionRequest)] == ["plan", "plan", "write", "write"]
    assert (work / "a.txt").read_text() == "hello\n" and (work / "b.txt").read_text() == "hello\n"
    assert h.worker.settings.permission == "ask" and h.worker.policy.mode == "ask"
    assert of(evs, ev.Status)[-1].permission_mode == "ask"
    h.stop()


def test_keep_planning_stays_in_plan_mode_and_the_toggle_returns_to_the_mode_it_left(tmp_path):
    h = AgentHarness.build(tmp_path, [reply(PLAN1, think="t")], tools=default_tools(), permission="auto",
                           answer=lambda e: "n")
    h.command(h.agent.toggle_plan)
    evs = h.turn("plan the greeting")
    assert [e.tool for e in of(evs, ev.PermissionRequest)] == ["plan"]
    assert len(of(evs, ev.UserTurn)) == 1  # no follow-up turn
    assert "still in plan mode: your next message revises the plan" in [n.text for n in of(evs, ev.Notice)][-1]
    assert h.worker.settings.permission == "plan"
    evs = h.command(h.agent.toggle_plan)
    assert h.worker.settings.permission == "auto" and of(evs, ev.Status)[-1].permission_mode == "auto"
    h.stop()


def test_approve_auto_and_no_question_outside_plan_mode(tmp_path):
    h = AgentHarness.build(tmp_path, [reply(PLAN1, think="t"), _write("a.txt"), reply("Done.", think=""),
                                      reply("Hi.", think="")],
                           tools=default_tools(), permission="plan", answer=lambda e: "a")
    evs = h.turn("plan it")
    assert [e.tool for e in of(evs, ev.PermissionRequest)] == ["plan"]  # auto: the write did not ask
    assert (tmp_path / "work" / "a.txt").read_text() == "hello\n"
    assert h.worker.settings.permission == "auto"
    evs = h.turn("thanks")
    assert of(evs, ev.PermissionRequest) == []  # an answer outside plan mode is not a plan
    h.stop()


def test_headless_plan_mode_prints_the_plan_and_runs_nothing_more(tmp_path):
    agent = AgentHarness.build(tmp_path, [_write("a.txt"), reply(PLAN1, think="t")], tools=default_tools(),
                               permission="plan", start=False).agent
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(agent, "greet", out=out, err=err, timeout=30) == 0
    assert out.getvalue().endswith(PLAN1 + "\n")
    assert "write is not allowed in plan mode" in err.getvalue()
    assert not (tmp_path / "work" / "a.txt").exists()


def test_plan_mode_is_refused_while_busy_like_every_mode_change(tmp_path):
    h = AgentHarness.build(tmp_path, [], permission="ask")
    h.agent._busy = True  # the busy rule is the facade's, checked before the worker is touched
    h.agent.toggle_plan()
    h.agent._busy = False
    evs = h.settle()
    assert [e.text for e in of(evs, ev.Error)] == ["command requires the model to be idle: /plan"]
    assert h.worker.settings.permission == "ask"
    h.stop()
