"""Hooks: commands before/after a tool, on a submitted message and when the agent stops."""

from __future__ import annotations

import json
from pathlib import Path

from ds4agent.agent import events as ev
from ds4agent.agent.hooks import BLOCKED_PREFIX, STOP_LEAD
from ds4agent.tools.hooks import Hook, load_hooks, run_hook
from tests.support.agent_harness import AgentHarness, answer_all, of
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import reply


def hooks_file(path: Path, table: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hooks": table}))
    return path


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def entry(command: str, matcher: str = "", **extra) -> dict:
    return {"matcher": matcher, "hooks": [{"type": "command", "command": command, **extra}]}


def test_pre_tool_hook_blocks_one_tool_with_a_reason_the_model_reads(tmp_path):
    conf = tmp_path / "conf"
    block = script(tmp_path / "block.sh", 'cat > "$PWD/pre.json"\necho "no alpha today" >&2\nexit 2\n')
    hooks_file(conf / "hooks.json", {"PreToolUse": [entry(block, "alpha")]})
    alpha, beta = RecTool("alpha"), RecTool("beta", "B1\n")
    h = AgentHarness.build(tmp_path, tools=[alpha, beta], config_dir=conf)
    h.engine.add(reply("", think="t", calls=[("alpha", {"x": "1"}), ("beta", {"x": "2"})]), reply("ok", think="t"))
    evs = h.turn("go")
    assert alpha.calls == [] and beta.calls == [{"x": "2"}]  # the matcher picked alpha only
    assert f"<tool_result>{BLOCKED_PREFIX}no alpha today</tool_result>".encode() in h.text()
    assert any("PreToolUse hook blocked alpha: no alpha today" in e.text for e in of(evs, ev.Notice))
    payload = json.loads((tmp_path / "work/pre.json").read_text())
    assert payload["hook_event_name"] == "PreToolUse" and payload["tool_name"] == "alpha"
    assert payload["tool_input"] == {"x": "1"} and payload["cwd"] == str(tmp_path / "work")
    h.stop()


def test_post_tool_feedback_follows_the_result_and_a_failing_hook_blocks_nothing(tmp_path):
    conf = tmp_path / "conf"
    feedback = script(tmp_path / "post.sh", 'echo "lint: 2 warnings" >&2\nexit 2\n')
    broken = script(tmp_path / "broken.sh", 'echo oops >&2\nexit 1\n')
    hooks_file(conf / "hooks.json", {"PreToolUse": [entry(broken)], "PostToolUse": [entry(feedback, "alpha")]})
    alpha = RecTool("alpha", "A1\n")
    h = AgentHarness.build(tmp_path, tools=[alpha], config_dir=conf)
    h.engine.add(reply("", think="t", calls=[("alpha", {})]), reply("ok", think="t"))
    evs = h.turn("go")
    assert alpha.calls == [{}]
    assert b"<tool_result>A1\n[PostToolUse hook: lint: 2 warnings]\n</tool_result>" in h.text()
    assert any(f"PreToolUse hook `{broken}` failed (exit status 1): oops" == e.text for e in of(evs, ev.Notice))
    h.stop()


def test_prompt_hook_blocks_or_adds_context(tmp_path):
    conf = tmp_path / "conf"
    gate = script(tmp_path / "gate.sh", 'if grep -q secret; then echo "no secrets please" >&2; exit 2; fi\n'
                                        'echo "Branch: main"\n')
    hooks_file(conf / "hooks.json", {"UserPromptSubmit": [entry(gate)]})
    h = AgentHarness.build(tmp_path, [reply("fine", think="t")], config_dir=conf)
    before = list(h.ids)
    evs = h.turn("here is my secret key")
    assert h.ids == before  # nothing was sent
    assert "message blocked by a UserPromptSubmit hook: no secrets please" in of(evs, ev.Error)[0].text
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["blocked"]
    h.turn("what branch?")
    assert b"what branch?\n\nBranch: main<" in h.text()
    h.stop()


def test_stop_hook_sends_the_model_back_until_it_is_satisfied(tmp_path):
    conf = tmp_path / "conf"
    # The hook runs in the tree's root, inside the sandbox: it keeps its files there.
    stop = script(tmp_path / "stop.sh", 'cat >> stop-inputs\necho >> stop-inputs\n'
                                        'n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count\n'
                                        'if [ "$n" = 0 ]; then echo "tests fail: fix test_x" >&2; exit 2; fi\n')
    hooks_file(conf / "hooks.json", {"Stop": [entry(stop)]})
    h = AgentHarness.build(tmp_path, [reply("done", think="t"), reply("fixed test_x", think="t")], config_dir=conf)
    evs = h.turn("do it")
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["done", "done"]
    assert f"{STOP_LEAD}\ntests fail: fix test_x".encode() in h.text()
    assert h.text().endswith("fixed test_x<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    inputs = [json.loads(line) for line in (tmp_path / "work/stop-inputs").read_text().split("\n") if line.strip()]
    assert [(i["reason"], i["stop_hook_active"]) for i in inputs] == [("done", False), ("done", True)]
    h.stop()


def test_a_stop_hook_that_never_lets_go_gives_up_after_three_continuations(tmp_path):
    conf = tmp_path / "conf"
    hooks_file(conf / "hooks.json", {"Stop": [entry("echo again >&2; exit 2")]})
    h = AgentHarness.build(tmp_path, [reply(f"r{i}", think="t") for i in range(5)], config_dir=conf)
    evs = h.turn("do it")
    assert len(of(evs, ev.TurnEnded)) == 4
    assert any("asked to continue 4 times in a row" in e.text for e in of(evs, ev.Notice))
    h.stop()


def test_hooks_run_inside_the_job_sandbox_and_time_out(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    outside = tmp_path / "outside.txt"
    run = run_hook(Hook("Stop", f'echo in > inside.txt && echo out > "{outside}"'), {}, root)
    assert (root / "inside.txt").read_text() == "in\n"
    assert not outside.exists() and run.status not in (0, None)
    slow = run_hook(Hook("Stop", "sleep 30", timeout=0.3), {}, root)
    assert slow.status is None and slow.error == "timed out after 0.3 s" and slow.seconds < 10


def test_project_hooks_run_only_once_approved_and_the_answer_is_kept_for_that_content(tmp_path):
    conf = tmp_path / "conf"
    mark = script(tmp_path / "mark.sh", 'echo x >> ran\n')
    hooks_file(tmp_path / "work/.ds4agent/hooks.json", {"Stop": [entry(mark)]})
    h = AgentHarness.build(tmp_path, [reply("a", think="t")], config_dir=conf, answer=answer_all("n"))
    assert [e.kind for e in of(h.events, ev.Question) if e.kind == "hooks"] == ["hooks"]
    h.turn("one")
    assert not (tmp_path / "work/ran").exists()
    h.stop()
    h = AgentHarness.build(tmp_path, [reply("a", think="t")], config_dir=conf, answer=answer_all("y"))
    h.turn("two")
    assert (tmp_path / "work/ran").read_text() == "x\n"
    h.stop()
    h = AgentHarness.build(tmp_path, [reply("a", think="t")], config_dir=conf, answer=answer_all("n"))
    assert [e.kind for e in of(h.events, ev.Question) if e.kind == "hooks"] == []  # remembered for this file
    h.turn("three")
    assert (tmp_path / "work/ran").read_text() == "x\nx\n"
    h.stop()


def test_a_bad_hooks_file_is_reported_entry_by_entry(tmp_path):
    conf = tmp_path / "conf"
    hooks_file(conf / "hooks.json", {"PreToolUse": [entry("true", "("), entry("", "a"), entry("ok", "b", timeout=-1),
                                                    {"matcher": "c", "command": "flat"}],
                                     "Nope": []})
    cfg = load_hooks(tmp_path, conf)
    assert [(x.event, x.matcher, x.command) for x in cfg.hooks()] == [("PreToolUse", "c", "flat")]
    assert len(cfg.errors) == 4 and any("unknown hook event 'Nope'" in e for e in cfg.errors)
    assert cfg.matching("PreToolUse", "c") and not cfg.matching("PreToolUse", "cc")
