"""Skills: folders of instructions the model reads only when a task needs them.

    load_skills(cwd, config_dir) -> SkillSet
    SkillSet.system_block()   the lines the system text gains: each skill's name and description
    SkillSet.tools()          [SkillTool] when there is a skill, else [] (no tool to misuse)

A skill is a folder holding `SKILL.md` whose front matter gives `name` and `description` (the
format Claude Code's skills use), under `.ds4agent/skills/` at the working tree's root (the
project's) or `skills/` in ds4agent's user config directory (the user's; the project's wins a
name clash). The model sees only the descriptions, in the system text: a skill costs a line of
context until it is used. The `skill` tool returns the body and the folder's path, so the model
can read the other files a skill points to with `read`.

The descriptions are part of the system prefix, so they are read once, at start (and again at
/new); the body is read when the tool is called, so an edited body takes effect at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ds4agent.agent.custom_commands import PROJECT_DIR, CustomCommandError, front_matter, read_text
from ds4agent.tools import Observation, ToolContext, ToolError
from ds4agent.tools.args import arg_str

SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"
# A description is meant to be a sentence or two: a longer one is cut (it is in every prompt).
DESCRIPTION_MAX = 400


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    folder: Path
    source: str  # "project" | "user"


@dataclass(frozen=True)
class SkillSet:
    skills: tuple[Skill, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def get(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name), None)

    def system_block(self) -> str:
        """What the model sees of the skills (untrusted text, in the system prefix); "" for none."""
        if not self.skills:
            return ""
        lines = ["# Skills", "",
                 "Instructions for particular tasks. When a task matches a skill's description, call the "
                 "`skill` tool with its name first and follow what it returns.", ""]
        lines += [f"- {s.name}: {s.description}" for s in self.skills]
        return "\n".join(lines)

    def tools(self) -> list[SkillTool]:
        return [SkillTool(self)] if self.skills else []


def skill_dirs(cwd: Path, config_dir: Path) -> list[tuple[str, Path]]:
    from ds4agent.tools.mcp.config import project_root

    return [("project", project_root(cwd) / PROJECT_DIR / SKILLS_DIR), ("user", config_dir / SKILLS_DIR)]


def load_skills(cwd: Path, config_dir: Path) -> SkillSet:
    """Every usable skill (by name) and readable notes about the folders that are not."""
    found: dict[str, Skill] = {}
    notes: list[str] = []
    for source, directory in skill_dirs(cwd, config_dir):
        try:
            folders = sorted(p for p in directory.iterdir() if (p / SKILL_FILE).is_file())
        except OSError:
            continue
        for folder in folders:
            path = folder / SKILL_FILE
            try:
                fields, _ = front_matter(read_text(path))
            except CustomCommandError as err:
                notes.append(f"skill ignored: {err}")
                continue
            name = " ".join(fields.get("name", folder.name).split())
            description = " ".join(fields.get("description", "").split())
            if not name or not description:
                notes.append(f"skill {path} ignored: its front matter needs a name and a description")
                continue
            if name in found:
                continue  # the project's skill wins
            if len(description) > DESCRIPTION_MAX:
                description = description[:DESCRIPTION_MAX].rstrip() + "..."
            found[name] = Skill(name, description, folder, source)
    return SkillSet(tuple(sorted(found.values(), key=lambda s: s.name)), tuple(notes))


class SkillTool:
    """`skill name=X`: the skill's instructions (SKILL.md after its front matter) and its folder."""

    name = "skill"
    description = ("Load the instructions of one of the skills listed in the system prompt, by name. Returns "
                   "the instructions and the skill's folder (read its other files from there when told to).")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "the skill's name, as listed"}},
        "required": ["name"],
    }
    mutates = False

    def __init__(self, skills: SkillSet) -> None:
        self.skills = skills

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        name = arg_str(args, "name", default="").strip()
        skill = self.skills.get(name)
        if skill is None:
            known = ", ".join(s.name for s in self.skills.skills)
            raise ToolError(f"no skill named {name!r}; the skills are: {known}")
        try:
            _, body = front_matter(read_text(skill.folder / SKILL_FILE))
        except CustomCommandError as err:
            raise ToolError(str(err)) from None
        return Observation(f"Skill {skill.name} (folder {skill.folder}):\n\n{body.strip()}\n")
