"""Subagents: the `task` tool forks the live KV state, works read-only, returns a summary."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.subagent import REFUSED_READ_ONLY
from tests.support.agent_harness import AgentHarness, of
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import reply


def build(tmp_path, script, tools, **kw):
    return AgentHarness.build(tmp_path, script, tools=tools, subagents=True, **kw)


def test_task_forks_the_live_state_and_returns_the_summary(tmp_path):
    alpha = RecTool("alpha", "def parse(): ...\n")
    gamma = RecTool("gamma", mutates=True)
    h = build(tmp_path, [], [alpha, gamma])
    assert "task" in [t.name for t in h.worker.tools]
    h.engine.add(
        reply("", think="delegate", calls=[("task", {"goal": "find where parse is defined"})]),
        # the subagent: a read, a refused write, then its summary
        reply("", think="look", calls=[("alpha", {"x": "parse"}), ("gamma", {"x": "w"})]),
        reply("parse is defined in a.py line 3.", think="found"),
        reply("It is in a.py.", think="t"),  # the parent again
    )
    prefills_before = len(h.engine.prefills)
    evs = h.turn("where is parse?")
    started, ended = of(evs, ev.SubagentStarted)[0], of(evs, ev.SubagentEnded)[0]
    assert started.goal == "find where parse is defined" and not started.writes
    assert (ended.reason, ended.rounds, ended.summary) == ("done", 2, "parse is defined in a.py line 3.")
    kinds = [e.kind for e in of(evs, ev.SubagentDelta) if e.id == started.id]
    assert "tool" in kinds and "result" in kinds and "text" in kinds
    # Read-only: the subagent read, and the write was refused without running.
    assert alpha.calls == [{"x": "parse"}] and gamma.calls == []
    record = h.agent.subagents()[0]
    assert REFUSED_READ_ONLY.format(name="gamma") in record.transcript
    assert "find where parse is defined" in record.transcript
    # The fork prefilled only the brief: the conversation came with the parent's state.
    assert record.forked_at > h.worker.conv.transcript.system_len + 20 and record.prefilled < 250
    # The parent reads only the summary; the subagent's own turns are not in its transcript.
    text = h.text()
    assert b"<tool_result>Subagent done (2 rounds, " in text
    assert b"tokens):\nparse is defined in a.py line 3.\n</tool_result>" in text
    assert b"You are now a subagent" not in text and b"def parse()" not in text
    assert text.endswith("It is in a.py.<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    # The parent's session was never touched: its next round prefilled only the results turn.
    parent_prefills = [p for p in h.engine.prefills[prefills_before:]]
    assert max(parent_prefills) < 250
    assert h.live == tuple(h.ids[:-1])
    h.stop()


def test_subagents_are_saved_and_restored_with_the_session(tmp_path):
    h = build(tmp_path, [], [RecTool("alpha")])
    h.engine.add(reply("", think="t", calls=[("task", {"goal": "summarise the repo"})]),
                 reply("A small repo.", think="t"), reply("Done.", think="t"))
    h.turn("go")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    h.command(h.agent.new)
    assert h.agent.subagents() == []
    h.command(lambda: h.agent.load(saved.short_id))
    (record,) = h.agent.subagents()
    assert (record.goal, record.summary, record.reason) == ("summarise the repo", "A small repo.", "done")
    assert "A small repo." in record.transcript
    assert record.lines[-1] == ("text", "A small repo.")  # what its card showed, for a replay
    h.stop()


def test_interrupting_the_subagent_stops_it_and_the_parents_turn(tmp_path):
    h = build(tmp_path, [], [RecTool("alpha")])
    h.engine.add(reply("", think="t", calls=[("task", {"goal": "long job"})]),
                 reply("working " * 200, think="t"), reply("never", think="t"))
    calls = {"n": 0}

    def on_step(session, pos):
        if session is not h.worker.session:
            calls["n"] += 1
            if calls["n"] == 20:
                h.agent.interrupt()

    h.engine.on_step = on_step
    evs = h.turn("go")
    ended = of(evs, ev.SubagentEnded)[0]
    assert ended.reason == "interrupted" and ended.generated < 40
    # As for any tool interrupted by the user: its result is kept and the turn ends at once (the
    # next round closes before its first token); the parent generates nothing more.
    assert b"<tool_result>Subagent interrupted (1 rounds" in h.text()
    assert h.text().endswith("</tool_result><｜Assistant｜><think><｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    assert len(of(evs, ev.TurnEnded)) == 1 and len(h.engine.script) == 1  # "never" was not started
    h.stop()


def test_without_the_setting_there_is_no_task_tool(tmp_path):
    h = AgentHarness.build(tmp_path, tools=[RecTool("alpha")])
    assert [t.name for t in h.worker.tools] == ["alpha"]
    h.stop()


def test_the_parents_pre_tool_hooks_judge_the_subagents_calls(tmp_path):
    import json

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": [
        {"matcher": "alpha", "hooks": [{"type": "command", "command": "echo 'alpha is off limits' >&2; exit 2"}]}]}}))
    alpha = RecTool("alpha")
    h = build(tmp_path, [], [alpha], config_dir=conf)
    h.engine.add(reply("", think="t", calls=[("task", {"goal": "read it"})]),
                 reply("", think="t", calls=[("alpha", {})]), reply("Could not read it.", think="t"),
                 reply("ok", think="t"))
    h.turn("go")
    assert alpha.calls == []
    assert "Tool call blocked by a hook: alpha is off limits" in h.agent.subagents()[0].transcript
    h.stop()
