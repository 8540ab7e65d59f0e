"""`@path` attachments: on send, each `@path` naming a file or directory inside the working tree
is expanded into the message as the tools would show it.

A text file comes as the `read` tool returns it (numbered lines, the same cap), and through the
same code, so its lines count as seen for the edit guard exactly as if the model had read them;
a directory comes as the `list` tool's entries. What cannot be attached is left as plain text and
named in the returned notes: a path outside the working tree (a mention is not a way to hand the
model `~/.ssh`), a binary or too-large file, an unreadable one. A mention of a path that does not
exist is just text (an email address, a decorator), without a note.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ds4agent.tools.context import ToolContext
from ds4agent.tools.files import ReadTool
from ds4agent.tools.listing import ListTool
from ds4agent.tools.results import ToolError

# `@` at the start of a word (not in an email address or after a path separator), then a path.
MENTION = re.compile(r"(?<![\w@/.])@([^\s@`'\"<>]+)")
_TRAILING = ".,;:!?)]}"


@dataclass
class Attachments:
    text: str  # the message with the attachments appended
    attached: list[str] = field(default_factory=list)  # the paths, as written
    notes: list[str] = field(default_factory=list)  # mentions that could not be attached, and why


_BLOCK = re.compile(r"\n\n@([^\s@`'\"<>]+):\n")


def strip(text: str) -> str:
    """The message as typed, without the attachments `expand` appended (a rewound turn's prompt
    goes back into the input box; sending it again attaches the files afresh)."""
    for m in _BLOCK.finditer(text):
        if f"@{m.group(1)}" in text[: m.start()]:
            return text[: m.start()]
    return text


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def expand(text: str, ctx: ToolContext) -> Attachments:
    out = Attachments(text)
    root = os.path.realpath(ctx.cwd)
    done: set[str] = set()
    blocks: list[str] = []
    for m in MENTION.finditer(text):
        written = m.group(1)
        # "see @a.py." : the sentence's full stop is not part of the name (unless it is).
        for name in (written, written.rstrip(_TRAILING)):
            if name and "\0" not in name and os.path.lexists(ctx.resolve(name)):  # NUL: no file
                break
        else:
            continue
        real = os.path.realpath(ctx.resolve(name))
        if real in done:
            continue
        done.add(real)
        if not _inside(real, root):
            out.notes.append(f"@{name} was not attached: it is outside the working directory")
            continue
        tool = ListTool() if os.path.isdir(real) else ReadTool()
        try:
            result = tool.run({"path": name}, ctx)
        except (ToolError, OSError) as err:
            reason = err.message if isinstance(err, ToolError) else (err.strerror or str(err))
            out.notes.append(f"@{name} was not attached: {reason}")
            continue
        blocks.append(f"@{name}:\n{result.text.rstrip()}\n")
        out.attached.append(name)
    if blocks:
        out.text = text.rstrip() + "\n\n" + "\n".join(blocks)
    return out
