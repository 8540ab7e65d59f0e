"""Temp files a killed write left in the working tree: `remove_stale_temps(root)`.

The file tools write through fsutil.atomic_entry_at: a temp file `.<name>.<8 hex>.tmp` beside the
target, renamed over it once durable. A process killed in between leaves the temp file behind; the
agent removes such files when it starts. Only that exact name shape, only regular files this user
owns, only ones untouched for STALE_SECONDS (a write of another running instance is seconds old),
and the walk is bounded (MAX_ENTRIES, MAX_DEPTH, the tool caches and version-control directories
skipped) so a huge tree does not delay the start.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from ds4agent.fsutil import TEMP_SUFFIX

STALE_SECONDS = 3600
MAX_ENTRIES = 200_000
MAX_DEPTH = 24
_SKIP = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache",
                   ".pytest_cache", ".ruff_cache", ".tox"})
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))


def remove_stale_temps(root: str | os.PathLike[str], *, now: float | None = None) -> list[Path]:
    """Remove the stale write temps beneath `root`; the paths removed."""
    now = time.time() if now is None else now
    uid = os.getuid()
    removed: list[Path] = []
    seen = 0
    stack = [(Path(root), 0)]
    while stack and seen < MAX_ENTRIES:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH and entry.name not in _SKIP:
                        stack.append((Path(entry.path), depth + 1))
                    continue
                if not _TEMP_NAME.fullmatch(entry.name):
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == uid and now - st.st_mtime >= STALE_SECONDS:
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
            except OSError:
                continue  # gone meanwhile, or not ours to remove
    return removed
