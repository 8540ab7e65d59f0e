"""Persistent input history (platformdirs user data dir), shared by the TUI and the plain mode.

One JSON list of strings (not one entry per line, because prompts are multi-line), at most 512
entries as the reference keeps, rewritten atomically on every submit so a crash never truncates it.
Pastes over MAX_SAVED_CHARS stay in this run's recall only.
A missing or unreadable file is an empty history: losing recall must never stop the app.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ds4agent.fsutil import atomic_write

MAX_ENTRIES = 512
# An entry longer than this (a pasted log, a whole file) is recalled during this run but never
# written: the file would grow by every paste, and be rewritten whole at every submit.
MAX_SAVED_CHARS = 16_384


def default_path() -> Path:
    override = os.environ.get("DS4AGENT_HISTORY")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("ds4agent")) / "history.json"


class InputHistory:
    def __init__(self, path: Path | None = None, *, persist: bool = True) -> None:
        self.path = path if path is not None else default_path()
        self.persist = persist
        self.entries: list[str] = self._read() if persist else []
        self._cursor: int | None = None   # index into entries while browsing; None = editing new text
        self._draft = ""

    def _read(self) -> list[str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        if not isinstance(data, list):
            return []
        return [e for e in data if isinstance(e, str)][-MAX_ENTRIES:]

    def add(self, text: str) -> None:
        self._cursor = None
        if not text.strip():
            return
        if self.entries and self.entries[-1] == text:
            return
        self.entries.append(text)
        del self.entries[:-MAX_ENTRIES]
        if self.persist:
            self._write()

    def _write(self) -> None:
        # ASCII JSON: a file name that is not UTF-8 (an @mention of it) reaches the text as a lone
        # surrogate (os.fsdecode), which UTF-8 cannot encode; "\udcff" escapes it and reads back.
        data = json.dumps([e for e in self.entries if len(e) <= MAX_SAVED_CHARS]).encode("ascii")
        try:
            atomic_write(self.path, data, make_parents=True)
        except OSError:
            pass  # history is a convenience; a read-only home must not break sending

    def previous(self, current: str) -> str | None:
        """The entry before the one shown (Up); None when there is nothing older."""
        if not self.entries:
            return None
        if self._cursor is None:
            self._draft = current
            self._cursor = len(self.entries)
        if self._cursor == 0:
            return None
        self._cursor -= 1
        return self.entries[self._cursor]

    def next(self) -> str | None:
        """The entry after the one shown (Down); the draft when leaving the newest; None when not browsing."""
        if self._cursor is None:
            return None
        self._cursor += 1
        if self._cursor >= len(self.entries):
            self._cursor = None
            return self._draft
        return self.entries[self._cursor]
