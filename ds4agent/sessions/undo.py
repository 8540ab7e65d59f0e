"""The undo log: what the `write` and `edit` tools changed, so /rewind can put files back.

Per conversation, a directory under the platformdirs state directory (`.../checkpoints/<key>`: the directory keeps the name it had when this was called a checkpoint):

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
(sessions/index.py), so the undo log lives as long as the session and go with it (`kv rm`,
the picker's delete).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from ds4agent.fsutil import (
    TEMP_SUFFIX,
    PathChanged,
    atomic_entry,
    atomic_entry_at,
    current_umask,
    fsync_dir_at,
    lstat_at,
    open_dir_beneath,
    short_name,
)


def default_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("ds4agent")) / "checkpoints"


def remove(root: Path | None, key: str) -> None:
    """Delete a conversation's undo log (with its session)."""
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


_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_CHUNK = 1 << 20


def _digest_now(path: str, sizes: set[int]) -> tuple[str | None, bool, str]:
    """(sha256, exists, "") of the file at `path` now, reached without following links; the file
    is read (in chunks) only when its size is one of `sizes` (any other size cannot match, and a
    huge or sparse file is then never read): (None, True, "") for such a file. (None, False, "")
    when there is none; (None, True, why) when it cannot be compared: what stands there is not a
    regular file (a link swapped in, or a FIFO: opening one would block the rewind; a device
    never ends), or it cannot be read."""
    head, name = os.path.split(path)
    try:
        dfd = open_dir_beneath(head)
    except FileNotFoundError:
        return None, False, ""
    except PathChanged:
        return None, True, "a directory on its path is now a symbolic link"
    except OSError as err:
        return None, True, f"cannot be read: {err.strerror or err}"
    try:
        st = lstat_at(dfd, name)
        if st is None:
            return None, False, ""
        if not stat.S_ISREG(st.st_mode):
            return None, True, "no longer a regular file"
        if st.st_size not in sizes:
            return None, True, ""
        fd = os.open(name, _READ, dir_fd=dfd)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None, True, "no longer a regular file"
            h = hashlib.sha256()
            while chunk := f.read(_CHUNK):
                h.update(chunk)
            return h.hexdigest(), True, ""
    except FileNotFoundError:
        return None, False, ""
    except OSError as err:
        return None, True, f"cannot be read: {err.strerror or err}"
    finally:
        os.close(dfd)


def _write_own(path: Path, data: bytes) -> None:
    """An undo-log file (copies of the user's code): replaced as an entry, never through a
    symlink, readable by the user only, like the session files."""
    with atomic_entry(path, mode=0o600) as f:
        f.write(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class UndoLog:
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
        """A tool changed `path` (absolute) from `before` (None: absent) to `after`.

        The log is appended to. A last line left torn by a power cut or a full disk (no newline
        at its end) is closed with one first, so this record starts a line of its own: glued onto
        the torn text it would be unreadable, and lost with it."""
        line = {"at": self.at, "path": path, "before": None if before is None else self._put(before),
                "after": self._put(after)}
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.dir / "log.jsonl", flags, 0o600)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            _write_all(fd, (b"\n" if torn else b"") + json.dumps(line).encode("utf-8") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[dict]:
        try:
            data = (self.dir / "log.jsonl").read_bytes()
        except OSError:
            return []
        out = []
        for line in data.split(b"\n"):
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a torn line after a crash (or the empty text after the last newline)
            if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("at"), int):
                out.append(e)
        return out

    def _object(self, h: str | None) -> bytes | None:
        return None if h is None else (self.dir / "objects" / h).read_bytes()

    def _object_size(self, h: str) -> int:
        try:
            return (self.dir / "objects" / h).stat().st_size
        except OSError:
            return -1

    # ------------------------------------------------------------------ restoring
    def plan(self, keep: int) -> RestorePlan:
        """What a rewind to transcript index `keep` restores. A file is clean (restored without a
        question) when it holds what the agent last wrote there, or any content the tools wrote
        there since `keep`, or already the content to restore: a restore that a crash cut short
        put some files back without rewriting the log, and they must not read as changed by
        someone else at the next rewind."""
        self._sweep()
        first: dict[str, dict] = {}
        written: dict[str, set[str]] = {}
        for e in self.entries():
            if e["at"] >= keep:
                first.setdefault(e["path"], e)
                written.setdefault(e["path"], set()).add(e["after"])
        clean, conflicts = [], []
        for path, e in first.items():
            content = self._object(e["before"])
            ok = set(written[path]) | ({e["before"]} if e["before"] is not None else set())
            sizes = {self._object_size(h) for h in ok}
            digest, exists, problem = _digest_now(path, sizes)
            if problem:
                conflicts.append(FileRestore(path, content, problem))
            elif not exists:
                if content is None:
                    clean.append(FileRestore(path, None))  # already as it was: nothing to remove
                else:
                    conflicts.append(FileRestore(path, content, "deleted since the agent wrote it"))
            elif digest is not None and digest in ok:
                clean.append(FileRestore(path, content))
            else:
                conflicts.append(FileRestore(path, content, "changed since the agent last wrote it"))
        return RestorePlan(keep, tuple(clean), tuple(conflicts))

    def apply(self, plan: RestorePlan, *, force: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Restore the plan's files (conflicts too when force); returns (restored, refused) where
        refused lines read `path: reason`."""
        todo = list(plan.clean) + (list(plan.conflicts) if force else [])
        restored: list[str] = []
        refused = [] if force else [f"{c.path}: {c.reason}" for c in plan.conflicts]
        self._sweep()
        for fr in todo:
            try:
                self._restore(fr.path, fr.content)
            except OSError as err:
                refused.append(f"{fr.path}: {err.strerror or err}")
                continue
            restored.append(fr.path)
        done = set(restored)
        kept = [e for e in self.entries() if not (e["at"] >= plan.keep and e["path"] in done)]
        if done:
            data = "".join(json.dumps(e) + "\n" for e in kept).encode("utf-8")
            _write_own(self.dir / "log.jsonl", data)
        self._sweep()
        return tuple(restored), tuple(refused)

    # A restore writes the new file beside nothing of the user's when it can: in the undo
    # directory's staging/ (same filesystem as the work tree), renamed into place, so a kill -9 at
    # any moment leaves no temporary file in the work tree. Across filesystems the temp file has
    # to be made beside the target; its directory is noted in restoring.jsonl first, and the next
    # plan or apply removes what a crash left there (a name with this undo key in it).

    @property
    def _staging(self) -> Path:
        return self.dir / "staging"

    @property
    def _journal(self) -> Path:
        return self.dir / "restoring.jsonl"

    def _temp_prefix(self, name: str) -> str:
        return f".{short_name(name, 100)}.rewind-{self.key[:12]}-"

    def _stages_for(self, dir_fd: int) -> bool:
        """Whether a file for the directory open at `dir_fd` can be staged in staging/ (the same
        filesystem: a rename can move it into place)."""
        return os.fstat(dir_fd).st_dev == os.stat(self._staging).st_dev

    def _restore(self, path: str, content: bytes | None) -> None:
        """Put `content` at `path` (None: remove the file), reaching its directory without
        following links (a link swapped in for a directory since the write is refused)."""
        head, name = os.path.split(path)
        dfd = open_dir_beneath(head, create=content is not None)
        try:
            st = lstat_at(dfd, name)
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "a directory stands there now")
            if content is None:
                if st is not None:
                    os.unlink(name, dir_fd=dfd)
                    fsync_dir_at(dfd)
                return
            mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else \
                0o666 & ~current_umask()
            self._staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self._stages_for(dfd):
                fd, tmp = tempfile.mkstemp(dir=self._staging, suffix=TEMP_SUFFIX)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(content)
                        f.flush()
                        os.fchmod(f.fileno(), mode)
                        os.fsync(f.fileno())
                    os.replace(tmp, name, dst_dir_fd=dfd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                fsync_dir_at(dfd)
            else:
                with open(self._journal, "a", encoding="utf-8") as j:
                    j.write(json.dumps({"dir": head, "prefix": self._temp_prefix(name)}) + "\n")
                    j.flush()
                    os.fsync(j.fileno())
                with atomic_entry_at(dfd, name, mode=mode, prefix=self._temp_prefix(name)) as f:
                    f.write(content)
        finally:
            os.close(dfd)

    def _sweep(self) -> None:
        """Remove what a restore cut short by a crash left: staged files, and temp files beside
        targets on another filesystem (named in the journal, matched by this key's prefix)."""
        if self._staging.is_dir():
            for p in self._staging.iterdir():
                with contextlib.suppress(OSError):
                    p.unlink()
        try:
            lines = self._journal.read_bytes().split(b"\n")
        except OSError:
            return
        for line in lines:
            try:
                e = json.loads(line)
                head, prefix = str(e["dir"]), str(e["prefix"])
            except (ValueError, KeyError, TypeError):
                continue
            if not prefix.startswith(".") or "rewind-" not in prefix or "/" in prefix:
                continue
            try:
                dfd = open_dir_beneath(head, listable=True)
            except OSError:
                continue
            try:
                for n in os.listdir(dfd):
                    st = lstat_at(dfd, n) if n.startswith(prefix) and n.endswith(TEMP_SUFFIX) else None
                    if st is not None and stat.S_ISREG(st.st_mode):
                        with contextlib.suppress(OSError):
                            os.unlink(n, dir_fd=dfd)
            finally:
                os.close(dfd)
        with contextlib.suppress(OSError):
            self._journal.unlink()

    def seal(self) -> None:
        """Mark every write so far as older than any turn (at = -1): no rewind restores them."""
        entries = self.entries()
        if entries:
            data = "".join(json.dumps({**e, "at": -1}) + "\n" for e in entries).encode("utf-8")
            _write_own(self.dir / "log.jsonl", data)

    # ------------------------------------------------------------------ lifecycle
    def fork(self) -> UndoLog:
        """A copy under a new key (a forked session gets its own undo log)."""
        other = UndoLog(self.root)
        other.at = self.at
        if self.dir.is_dir():
            shutil.copytree(self.dir, other.dir)
        return other
