"""`@path` mentions in the input: which workspace paths complete the word under the cursor.

Only names are listed (one directory level at a time, like a shell), never file contents; on
send the agent attaches each mentioned file or directory to the message (tools/attach.py).
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_CANDIDATES = 12


def mention_at_cursor(text_before_cursor: str) -> str | None:
    """The partial path after `@` when the word under the cursor is a mention, else None."""
    if not text_before_cursor or text_before_cursor[-1].isspace():
        return None
    word = text_before_cursor.split()[-1]
    return word[1:] if word.startswith("@") else None


def candidates(cwd: str | os.PathLike[str], partial: str, limit: int = MAX_CANDIDATES) -> list[str]:
    """Paths (relative to cwd, directories ending in `/`) that extend `partial`; hidden names only
    when the typed name starts with a dot. Unreadable directories give no candidates."""
    head, _, base = partial.rpartition("/")
    directory = Path(cwd) / head if head else Path(cwd)
    try:
        entries = sorted(os.scandir(directory), key=lambda d: d.name)
    except OSError:
        return []
    out: list[str] = []
    for entry in entries:
        name = entry.name
        if not name.startswith(base) or (name.startswith(".") and not base.startswith(".")):
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        out.append((f"{head}/" if head else "") + name + ("/" if is_dir else ""))
        if len(out) >= limit:
            break
    return out
