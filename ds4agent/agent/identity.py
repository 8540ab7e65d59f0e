"""SessionIdentity: who the live conversation is (kvc-format.md §12.3-12.5), in one place.

Every field that belongs to a conversation rather than to the worker lives here, so /new, /load,
/save, /fork, a crash resume and the journal's meta handle them as one value:

    title        the exact title-trailer bytes (the identity is SHA-1 over them and created_at);
                 None until the session has a title
    created_at   unix seconds of the first save (None: never saved)
    session_id   the full 40-hex identity once saved or loaded ("" before)
    legacy_path  the file this session was loaded from when that file is to be replaced on the
                 next save (an old-format name, or the name of a renamed title)
    forked_from  the id of the session this conversation was forked from ("" when none)
    dirty        the conversation has turns the saved file does not have
    activity     a user turn since start or /new (a loaded session counts): "nothing to save" else
    undo         the undo log of this conversation (sessions/undo.py), or None
    subagents    the subagents this conversation ran (subagent.py), saved beside its file

The journal's meta (to_meta / from_meta) is JSON, so the title's exact bytes travel as hex.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from ds4agent.sessions.entries import FileStamp
from ds4agent.sessions.undo import UndoLog

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class SubagentRecord:
    """One subagent run (subagent.py): what its card shows and what a saved session keeps."""

    id: str
    goal: str
    summary: str
    transcript: str  # the subagent's own part: its brief and rounds, as text
    reason: str  # "done" | "interrupted" | "budget" | "context_full" | "error"
    rounds: int = 0
    generated: int = 0
    forked_at: int = 0  # tokens of the parent's KV state it started from (shared, not prefilled)
    prefilled: int = 0  # tokens it prefilled itself (its brief and tool results)
    seconds: float = 0.0
    first_token_s: float = 0.0  # from the call to its first generated token
    # What its card showed, as (kind, text) pieces (events.SubagentDelta's kinds): a replay shows it again
    lines: tuple[tuple[str, str], ...] = ()


@dataclass
class SessionIdentity:
    title: bytes | None = None
    created_at: int | None = None
    session_id: str = ""
    legacy_path: str | None = None
    forked_from: str = ""
    dirty: bool = False
    activity: bool = False
    undo: UndoLog | None = None
    # The session file as this process last loaded or saved it (sessions.store.file_stamp): a save
    # that finds it changed (another instance saved the session) becomes a fork. None: not known
    # (a new session, a journal resumed after a crash): no check.
    file_stamp: FileStamp | None = None
    subagents: list[SubagentRecord] = field(default_factory=list)

    @property
    def unsaved_work(self) -> bool:
        """Turns that would be lost by leaving: what the save question and the journal ask about."""
        return self.dirty and self.activity

    def to_meta(self) -> dict[str, object]:
        """The identity's part of the crash journal's meta (activity is implied by a journal)."""
        return {
            "title_hex": self.title.hex() if self.title is not None else None,
            "created_at": self.created_at,
            "session_id": self.session_id,
            "legacy_path": self.legacy_path,
            "dirty": bool(self.dirty),
            "forked_from": self.forked_from,
            "checkpoints": self.undo.key if self.undo is not None else "",  # the undo log, by its former name
        }

    @classmethod
    def from_meta(cls, meta: dict[str, object], undo_dir: Path | None) -> SessionIdentity:
        """The identity a journal recorded. A resumed journal always has unsaved turns (only those
        are offered), so it is dirty and active whatever the meta says."""
        created = meta.get("created_at")
        legacy = meta.get("legacy_path")
        return cls(
            title=meta_title(meta),
            created_at=int(created) if isinstance(created, int | float) and created else None,
            session_id=str(meta.get("session_id") or ""),
            legacy_path=str(legacy) if legacy else None,
            forked_from=str(meta.get("forked_from") or ""),
            dirty=True,
            activity=True,
            undo=undo_log_for(str(meta.get("checkpoints") or ""), undo_dir),
        )


def meta_title(meta: dict[str, object]) -> bytes | None:
    """The title a journal's meta holds: `title_hex` (exact bytes), or an older journal's text."""
    hexed = meta.get("title_hex")
    if isinstance(hexed, str):
        try:
            return bytes.fromhex(hexed)
        except ValueError:
            return None
    title = meta.get("title")
    return title_bytes(str(title)) if title else None


@overload
def title_bytes(title: str | bytes) -> bytes: ...
@overload
def title_bytes(title: None) -> None: ...
def title_bytes(title: str | bytes | None) -> bytes | None:
    """The title exactly as stored in the trailer. The session identity is SHA-1 over these bytes
    (kvc-format.md §12.3), so a title is never round-tripped through str: a non-UTF-8 title from a
    ds4 file would come back with U+FFFD and re-save under a different name."""
    if title is None or isinstance(title, bytes):
        return title
    return str(title).encode("utf-8", "surrogateescape")


def undo_log_for(key: str, undo_dir: Path | None) -> UndoLog | None:
    """The undo log under `key` (an index entry's or a journal's), None for no key or a
    key that is not the hex an undo directory is named with (never a path to follow)."""
    if key and all(c in _HEX for c in key):
        return UndoLog(undo_dir, key)
    return None
