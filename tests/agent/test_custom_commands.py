"""Custom slash commands and skills from files (.ds4agent/commands, .ds4agent/skills, the user's)."""

from __future__ import annotations

from pathlib import Path

from ds4agent.agent import events as ev
from ds4agent.agent.custom_commands import expand, find_commands, front_matter
from ds4agent.agent.skills import SkillTool, load_skills
from ds4agent.ui import commands
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_front_matter_is_read_only_when_closed():
    assert front_matter("---\ndescription: Review a file\nargument-hint: <path>\n---\nBody\n") == (
        {"description": "Review a file", "argument-hint": "<path>"}, "Body\n")
    assert front_matter("---\nnot closed\n") == ({}, "---\nnot closed\n")
    assert front_matter("plain text") == ({}, "plain text")


def test_project_commands_win_and_built_in_names_are_refused(tmp_path):
    work, conf = tmp_path / "work", tmp_path / "conf"
    write(work / ".ds4agent/commands/review.md", "---\ndescription: Review code\n---\nReview $ARGUMENTS carefully.")
    write(conf / "commands/review.md", "the user's review")
    write(conf / "commands/standup.md", "Summarise what changed today.")
    write(conf / "commands/help.md", "shadowing /help")
    write(conf / "commands/Bad Name.md", "x")
    found, notes = find_commands(work, conf, reserved=frozenset({"help"}))
    assert [(c.name, c.source, c.description) for c in found] == [
        ("review", "project", "Review code"), ("standup", "user", "")]
    assert any("/help is a built-in command" in n for n in notes)
    assert any("Bad Name.md ignored" in n for n in notes)
    review, standup = found
    assert expand(review, " src/x.py ") == "Review src/x.py carefully."
    assert expand(standup, "") == "Summarise what changed today."
    assert expand(standup, "team A") == "Summarise what changed today.\n\nArguments: team A"


def test_a_custom_command_sends_its_text_as_the_prompt(tmp_path):
    conf = tmp_path / "conf"
    write(tmp_path / "work/.ds4agent/commands/fix.md", "Fix the bug in $ARGUMENTS and run the tests.")
    h = AgentHarness.build(tmp_path, [reply("On it.", think="t")], config_dir=conf)
    assert h.agent.run_command("fix", "parser.py")
    evs = h.settle()
    assert [e.text for e in of(evs, ev.UserTurn)] == ["Fix the bug in parser.py and run the tests."]
    assert b"Fix the bug in parser.py and run the tests.<" in h.text()
    assert h.agent.run_command("nope") is False
    assert "unknown custom command: /nope" in of(h.settle(), ev.Error)[0].text
    h.stop()


def test_the_front_ends_table_lists_parses_and_completes_custom_commands(tmp_path):
    conf = tmp_path / "conf"
    write(tmp_path / "work/.ds4agent/commands/review.md", "---\ndescription: Review code\nargument-hint: <path>\n---\nx")
    h = AgentHarness.build(tmp_path, config_dir=conf)
    try:
        assert commands.use_custom_commands(h.agent) == []
        assert "/review <path>" in commands.help_text() and "Review code (project: review.md)" in commands.help_text()
        assert [c.name for c in commands.completions("/rev")] == ["review"]
        cmd = commands.prepare("/review src/a.py", busy=True)  # a message: queued while busy
        calls = []

        class Rec:
            def run_command(self, name, args=""):
                calls.append((name, args))
                return True

        commands.call_agent(cmd, Rec())
        assert calls == [("review", "src/a.py")]
    finally:
        commands.CUSTOM.clear()
        h.stop()


def test_skills_descriptions_are_in_the_system_text_and_the_body_only_in_the_tool_result(tmp_path):
    conf = tmp_path / "conf"
    write(tmp_path / "work/.ds4agent/skills/release/SKILL.md",
          "---\nname: release\ndescription: How to cut a release of this project\n---\nStep 1: bump VERSION.\n")
    write(conf / "skills/notes/SKILL.md", "---\nname: notes\n---\nno description")
    h = AgentHarness.build(tmp_path, config_dir=conf)
    system = h.text(0)
    assert b"- release: How to cut a release of this project" in system
    assert b"Step 1: bump VERSION." not in system
    assert any("needs a name and a description" in e.text for e in of(h.events, ev.Notice))
    assert "skill" in [t.name for t in h.worker.tools]
    h.engine.add(reply("", think="t", calls=[("skill", {"name": "release"})]), reply("Bumping.", think="t"))
    h.turn("cut a release")
    folder = tmp_path / "work/.ds4agent/skills/release"
    assert f"<tool_result>Skill release (folder {folder}):\n\nStep 1: bump VERSION.\n</tool_result>".encode() in h.text()
    h.stop()


def test_no_skills_no_skill_tool_and_an_unknown_name_is_a_tool_error(tmp_path):
    skills = load_skills(tmp_path, tmp_path / "conf")
    assert skills.tools() == [] and skills.system_block() == ""
    write(tmp_path / "conf/skills/a/SKILL.md", "---\nname: a\ndescription: d\n---\nbody")
    tool = SkillTool(load_skills(tmp_path, tmp_path / "conf"))
    import pytest

    from ds4agent.tools import ToolError

    with pytest.raises(ToolError, match="no skill named 'b'; the skills are: a"):
        tool.run({"name": "b"}, None)
