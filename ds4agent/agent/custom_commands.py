"""Custom slash commands from Markdown files: `/NAME args` sends the file's text as the prompt.

    find_commands(cwd, config_dir) -> list[CustomCommand]   the project's, then the user's
    expand(command, args) -> str                            the prompt `/NAME args` sends
    front_matter(text) -> (fields, body)                    the `---` header both commands and
                                                            skills (skills.py) may open with

Where they live, as in Claude Code: `.ds4agent/commands/NAME.md` at the working tree's root (the
project's, shared through the repository) and `commands/NAME.md` in ds4agent's user config
directory (the user's own, in every project); the project's file wins a name clash. A file may
open with a front matter block (`description: ...`, `argument-hint: ...`) that /help shows; the
rest is the prompt. `$ARGUMENTS` in it becomes what was typed after the name; a file without it
gets the arguments appended, so `/review src/x.py` never drops what the user typed.

The files are read when listed and again when used, so an edited command takes effect at once.
A built-in command's name cannot be taken (the front ends drop such a file with a notice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

COMMANDS_DIR = "commands"
PROJECT_DIR = ".ds4agent"
# The name as typed after `/`: what a file name may be to become a command.
COMMAND_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ARGUMENTS = "$ARGUMENTS"
# A prompt file is a few KiB; anything larger is not one (and is not read).
MAX_FILE_BYTES = 256 * 1024


class CustomCommandError(Exception):
    """A command file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class CustomCommand:
    name: str
    path: Path
    source: str  # "project" | "user"
    description: str = ""
    argument_hint: str = ""

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.argument_hint or '[args]'}"

    @property
    def help(self) -> str:
        return f"{self.description or 'custom command'} ({self.source}: {self.path.name})"


def front_matter(text: str) -> tuple[dict[str, str], str]:
    """A `---` block of `key: value` lines at the very top, and the text after it. Only flat
    string values (what command and skill files use); a file without the block has no fields."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text
    fields: dict[str, str] = {}
    for i, line in enumerate(lines[1:], 1):
        if line.strip() == "---":
            return fields, "".join(lines[i + 1:])
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip().lower()] = value.strip().strip("\"'")
    return {}, text  # never closed: not a header, the whole file is the text


def read_text(path: Path) -> str:
    """A command or skill file as text (CustomCommandError naming it when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise CustomCommandError(f"cannot read {path}: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CustomCommandError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


def command_dirs(cwd: Path, config_dir: Path) -> list[tuple[str, Path]]:
    """(source, directory) in precedence order: the project's, then the user's."""
    from ds4agent.tools.mcp.config import project_root

    return [("project", project_root(cwd) / PROJECT_DIR / COMMANDS_DIR), ("user", config_dir / COMMANDS_DIR)]


def find_commands(cwd: Path, config_dir: Path, *, reserved: frozenset[str] = frozenset()
                  ) -> tuple[list[CustomCommand], list[str]]:
    """The usable command files (project first; a name already taken is skipped) and readable
    notes about the files that are not (a bad name, a built-in's name, unreadable)."""
    found: dict[str, CustomCommand] = {}
    notes: list[str] = []
    for source, directory in command_dirs(cwd, config_dir):
        try:
            paths = sorted(p for p in directory.iterdir() if p.suffix == ".md")
        except OSError:
            continue  # no such directory: no commands of that kind
        for path in paths:
            name = path.stem.lower()
            if not COMMAND_NAME.fullmatch(name):
                notes.append(f"custom command {path} ignored: a name is letters, digits, '-' and '_'")
                continue
            if name in reserved:
                notes.append(f"custom command {path} ignored: /{name} is a built-in command")
                continue
            if name in found:
                continue  # the project's file wins
            try:
                fields, _ = front_matter(read_text(path))
            except CustomCommandError as err:
                notes.append(f"custom command ignored: {err}")
                continue
            found[name] = CustomCommand(name, path, source, fields.get("description", ""),
                                        fields.get("argument-hint", ""))
    return sorted(found.values(), key=lambda c: c.name), notes


def expand(command: CustomCommand, args: str) -> str:
    """The prompt `/NAME args` sends: the file's text after its front matter, `$ARGUMENTS`
    replaced by args (or args appended after a blank line when the text has no `$ARGUMENTS`)."""
    _, body = front_matter(read_text(command.path))
    body = body.strip()
    args = args.strip()
    if ARGUMENTS in body:
        return body.replace(ARGUMENTS, args)
    if not args:
        return body
    return f"{body}\n\nArguments: {args}" if body else args
