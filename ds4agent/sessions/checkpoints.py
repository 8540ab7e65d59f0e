"""Code checkpoints: what the `write` and `edit` tools changed, so /rewind can put files back.

Per conversation, a directory under the platformdirs state directory (`.../checkpoints/<key>`):

    objects/<sha256>   file contents, content-addressed (a file written ten times with the same
                       text is stored once)
    log.jsonl          one line per tool write: {"at": T, "path": P, "before": H|null, "after": H}

`at` is the transcript index of the user turn the write belongs to (where a rewind to that turn
cuts the transcript), `before` the file's content before the write (null: it did not exist),
`after` what the tool wrote. Restoring to turn index K takes every path written at >= K and puts
back the `before` of its first such write (removing files the tools created), but only where the
file on disk still holds the `after` of its last write: a file changed since (by the user, or by
a `bash` command, which is not tracked) is reported and left alone unless the user confirms.

The key is random, made when a conversation starts; the session index maps a saved session to it
(sessions/index.py), so the checkpoints live as long as the session and go with it (`kv rm`,
the picker's delete).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from ds4agent.fsutil import atomic_entry, atomic_write


def default_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("ds4agent")) / "checkpoints"


def remove(root: Path | None, key: str) -> None:
    """Delete a conversation's checkpoints (with its session)."""
    if key and all(c in "0123456789abcdef" for c in key):
        shutil.rmtree((root or default_root()) / key, ignore_errors=True)


@dataclass(frozen=True)
class FileRestore:
    path: str
    content: bytes | None  # None: remove the file (the tools created it)
    reason: str = ""  # why it is a conflict ("" when the file is as the agent left it)


@dataclass(frozen=True)
class RestorePlan:
    keep: int
    clean: tuple[FileRestore, ...]
    conflicts: tuple[FileRestore, ...]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(path: str) -> tuple[bytes | None, str]:
    """(content, "") of the file at `path` now, (None, "") when there is none, or (None, why) when
    it cannot be compared: what stands there is not a regular file (opening a FIFO would block the
    rewind; a device never ends), or it cannot be read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None, "no longer a regular file"
        # O_NONBLOCK: a FIFO swapped in after the stat does not block the open (fstat refuses it).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, "no longer a regular file"
            return f.read(), ""
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        return None, f"cannot be read: {err.strerror or err}"


def _write_own(path: Path, data: bytes) -> None:
    """A checkpoint file (copies of the user's code): replaced as an entry, never through a
    symlink, readable by the user only, like the session files."""
    with atomic_entry(path, mode=0o600) as f:
        f.write(data)


class CodeCheckpoints:
    def __init__(self, root: Path | None = None, key: str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.key = key or uuid.uuid4().hex
        self.at = 0  # transcript index of the current user turn (set as each turn starts)

    @property
    def dir(self) -> Path:
        return self.root / self.key

    # ------------------------------------------------------------------ recording
    def _put(self, data: bytes) -> str:
        h = _sha(data)
        target = self.dir / "objects" / h
        if not target.exists():
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_own(target, data)
        return h

    def record(self, path: str, before: bytes | None, after: bytes) -> None:
        """A tool changed `path` (absolute) from `before` (None: absent) to `after`."""
        line = {"at": self.at, "path": path, "before": None if before is None else self._put(before),
                "after": self._put(after)}
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.dir / "log.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with open(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def entries(self) -> list[dict]:
        try:
            lines = (self.dir / "log.jsonl").read_text("utf-8").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a torn last line after a crash
            if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("at"), int):
                out.append(e)
        return out

    def _object(self, h: str | None) -> bytes | None:
        return None if h is None else (self.dir / "objects" / h).read_bytes()

    # ------------------------------------------------------------------ restoring
    def plan(self, keep: int) -> RestorePlan:
        first: dict[str, dict] = {}
        last: dict[str, dict] = {}
        for e in self.entries():
            if e["at"] >= keep:
                first.setdefault(e["path"], e)
                last[e["path"]] = e
        clean, conflicts = [], []
        for path, e in first.items():
            content = self._object(e["before"])
            now, problem = _current(path)
            expected = last[path]["after"]
            if problem:
                conflicts.append(FileRestore(path, content, problem))
            elif now is not None and _sha(now) == expected:
                clean.append(FileRestore(path, content))
            elif now is None:
                conflicts.append(FileRestore(path, content, "deleted since the agent wrote it"))
            else:
                conflicts.append(FileRestore(path, content, "changed since the agent last wrote it"))
        return RestorePlan(keep, tuple(clean), tuple(conflicts))

    def apply(self, plan: RestorePlan, *, force: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Restore the plan's files (conflicts too when force); returns (restored, refused) where
        refused lines read `path: reason`."""
        todo = list(plan.clean) + (list(plan.conflicts) if force else [])
        restored: list[str] = []
        refused = [] if force else [f"{c.path}: {c.reason}" for c in plan.conflicts]
        for fr in todo:
            try:
                if fr.content is None:
                    if os.path.lexists(fr.path):
                        os.unlink(fr.path)
                else:
                    atomic_write(fr.path, fr.content, make_parents=True)
            except OSError as err:
                refused.append(f"{fr.path}: {err.strerror or err}")
                continue
            restored.append(fr.path)
        done = set(restored)
        kept = [e for e in self.entries() if not (e["at"] >= plan.keep and e["path"] in done)]
        if done:
            data = "".join(json.dumps(e) + "\n" for e in kept).encode("utf-8")
            _write_own(self.dir / "log.jsonl", data)
        return tuple(restored), tuple(refused)

    def seal(self) -> None:
        """Mark every write so far as older than any turn (at = -1): no rewind restores them."""
        entries = self.entries()
        if entries:
            data = "".join(json.dumps({**e, "at": -1}) + "\n" for e in entries).encode("utf-8")
            _write_own(self.dir / "log.jsonl", data)

    # ------------------------------------------------------------------ lifecycle
    def fork(self) -> CodeCheckpoints:
        """A copy under a new key (a forked session gets its own checkpoints)."""
        other = CodeCheckpoints(self.root)
        other.at = self.at
        if self.dir.is_dir():
            shutil.copytree(self.dir, other.dir)
        return other
