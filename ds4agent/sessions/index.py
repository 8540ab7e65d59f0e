"""The session index: what a KVC file cannot say about a session, in one small JSON file beside
the KV directory (`~/.ds4/kvcache` -> `~/.ds4/kvcache.index.json`).

Per session id: the working directory it was saved from (`--continue` picks the newest saved
session of this directory), the time of that save, the session it was forked from (the picker
shows it), and the key of its undo log (removed with the session). The KVC layout itself
never changes (kvc-format.md): files written by ds4 simply have no entry, and an entry whose
file is gone is ignored and pruned at the next write.

Beside the directory, not inside it: ds4 and `kv verify` treat every file in the KV directory as
theirs. Written atomically (temp + rename); a missing or unreadable index reads as empty, so the
worst a damaged index costs is `--continue` not finding a session (never a lost session).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ds4agent.fsutil import atomic_entry

# The undo log's key is stored under its former name, so index files already on disk keep working.
_UNDO_KEY = "checkpoints"


def _fields(entry: IndexEntry) -> dict[str, object]:
    fields = asdict(entry)
    fields[_UNDO_KEY] = fields.pop("undo")
    return fields


@dataclass(frozen=True)
class IndexEntry:
    cwd: str = ""
    saved_at: float = 0.0
    forked_from: str = ""  # full id of the parent session ("" when not a fork)
    undo: str = ""  # key of the undo log directory ("" when none)
    model: str = ""  # absolute path of the model it was saved with (--resume uses it without --model)
    fingerprint: str = ""  # models.fingerprint of that model (a resume into another one warns)


def index_path(kv_dir: str | os.PathLike[str]) -> Path:
    d = Path(kv_dir)
    return d.parent / (d.name + ".index.json")


def subagents_path(kv_dir: str | os.PathLike[str], sid: str) -> Path:
    """A saved session's subagent transcripts (written by the agent), beside the KV directory for
    the same reason as the index: `~/.ds4/kvcache.subagents/<id>.json`."""
    d = Path(kv_dir)
    return d.parent / (d.name + ".subagents") / f"{sid}.json"


class SessionIndex:
    def __init__(self, kv_dir: str | os.PathLike[str]) -> None:
        self.kv_dir = Path(kv_dir)
        self.path = index_path(kv_dir)

    def read(self) -> dict[str, IndexEntry]:
        try:
            raw = json.loads(self.path.read_text("utf-8"))
            items = raw.get("sessions", {})
        except (OSError, ValueError, AttributeError):
            return {}
        out: dict[str, IndexEntry] = {}
        if not isinstance(items, dict):
            return out
        for sid, fields in items.items():
            if isinstance(sid, str) and isinstance(fields, dict):
                try:
                    out[sid] = IndexEntry(str(fields.get("cwd", "")), float(fields.get("saved_at", 0)),
                                          str(fields.get("forked_from", "")),
                                          str(fields.get(_UNDO_KEY, "")),
                                          str(fields.get("model", "")), str(fields.get("fingerprint", "")))
                except (TypeError, ValueError):
                    continue
        return out

    def get(self, sid: str) -> IndexEntry | None:
        return self.read().get(sid)

    def _write(self, entries: dict[str, IndexEntry]) -> None:
        data = {"sessions": {k: _fields(v) for k, v in entries.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # atomic_entry: a symlink planted at the index's name is replaced, never written through
        # (as for session files); 0600 like them, it names the user's working directories.
        with atomic_entry(self.path, mode=0o600) as f:
            f.write(json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))

    def _alive(self, sid: str) -> bool:
        return (self.kv_dir / f"{sid}.kv").exists()

    def record(self, sid: str, *, cwd: str | os.PathLike[str], forked_from: str = "",
               undo: str = "", model: str = "", fingerprint: str = "",
               now: float | None = None) -> None:
        """Note a save of session `sid` (keeps an earlier forked_from); prunes dead entries."""
        entries = {k: v for k, v in self.read().items() if k == sid or self._alive(k)}
        old = entries.get(sid)
        entries[sid] = IndexEntry(str(cwd), time.time() if now is None else float(now),
                                  forked_from or (old.forked_from if old else ""),
                                  undo or (old.undo if old else ""),
                                  model or (old.model if old else ""),
                                  fingerprint or (old.fingerprint if old else ""))
        self._write(entries)

    def forget(self, sid: str) -> IndexEntry | None:
        entries = self.read()
        old = entries.pop(sid, None)
        if old is not None:
            self._write(entries)
        return old

    def latest_for(self, cwd: str | os.PathLike[str]) -> str | None:
        """The id of the most recently saved session of directory `cwd` whose file still exists."""
        want = os.path.realpath(os.fspath(cwd))
        best: tuple[float, str] | None = None
        for sid, e in self.read().items():
            if e.cwd and os.path.realpath(e.cwd) == want and self._alive(sid):
                if best is None or e.saved_at > best[0]:
                    best = (e.saved_at, sid)
        return best[1] if best else None


def find_entry(kv_dir: str | os.PathLike[str], prefix: str) -> tuple[str, IndexEntry] | None:
    """The one entry whose session id starts with `prefix` (case-insensitive), None if not one."""
    p = prefix.lower()
    found = [(sid, e) for sid, e in SessionIndex(kv_dir).read().items() if p and sid.startswith(p)]
    return found[0] if len(found) == 1 else None


def remove_session_extras(kv_dir: str | os.PathLike[str], sid: str,
                          undo_root: str | os.PathLike[str] | None = None) -> None:
    """After a session file is deleted (`kv rm`, the picker): drop its index entry and its code
    undo log and subagent transcripts. Best effort: the deletion itself already happened."""
    try:
        subagents_path(kv_dir, sid).unlink(missing_ok=True)
    except (OSError, ValueError):
        pass
    try:
        entry = SessionIndex(kv_dir).forget(sid)
    except OSError:
        return
    if entry is not None and entry.undo:
        from ds4agent.sessions import undo

        undo.remove(Path(undo_root) if undo_root else None, entry.undo)
