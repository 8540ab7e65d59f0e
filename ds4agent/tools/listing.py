"""list: the entries of one directory (agent-reference.md §5.9), sorted by name (baseline: directory
order, which differs between file systems and runs)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from ds4agent.tools.args import arg_str
from ds4agent.tools.beneath import open_dir
from ds4agent.tools.context import ToolContext
from ds4agent.tools.results import Observation, TextDisplay, ToolError

MAX_ENTRIES = 300


def _type_char(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "l"
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISREG(mode):
        return "-"
    return "?"


class ListTool:
    name = "list"
    description = (
        "List a directory: one entry per line with its type (d directory, - file, l symlink), size "
        "in bytes and name; dotfiles included."
    )
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "directory (. for the working directory)"}},
        "required": ["path"],
    }
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        path = arg_str(args, "path", default="") or "."
        # Opened beneath its real path (tools/beneath.py) and read through that one descriptor:
        # the entries listed and their types are of the same directory, whatever is swapped in.
        try:
            fd = open_dir(ctx.abs_key(path), path, listable=True)
        except OSError as exc:
            raise ToolError(f"opendir failed: {exc.strerror}") from None
        try:
            names = sorted(os.listdir(fd))
            lines = [f"{path}:\n"]
            for name in names[:MAX_ENTRIES]:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    t, size = _type_char(st.st_mode), st.st_size
                except OSError:
                    t, size = "?", 0
                lines.append(f"{t} {size:>10} {name}{'/' if t == 'd' else ''}\n")
        except OSError as exc:
            raise ToolError(f"opendir failed: {exc.strerror}") from None
        finally:
            os.close(fd)
        if len(names) > MAX_ENTRIES:
            lines.append("... more entries omitted ...\n")
        text = "".join(lines)
        n = len(names)
        summary = f"list {path}: {n} entr{'ies' if n != 1 else 'y'}"
        return Observation(text, display=TextDisplay(summary=summary, body=text[len(lines[0]):]))
