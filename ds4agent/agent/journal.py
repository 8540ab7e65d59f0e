"""Crash journal: nothing typed or generated is lost when the process dies.

After every round (and after each user turn is appended, a compaction, a load or /new) the
agent rewrites its journal: the transcript's token ids plus the session identity, replaced
atomically through ds4agent.fsutil (same-directory temp file, rename). The journal lives in the
platformdirs user *state* directory, outside the KV directory, so ds4 and the KV-directory scans
never see it.

Durability: once `write` returns, the new journal is in place for any process (the rename is
done), which is all a crash of this process needs: the kernel keeps the file. Against a power
cut the file and its directory are fsynced too, but by a helper thread after `write` returns:
two fsyncs cost milliseconds each, a turn writes the journal about twice per round, and on the
worker thread that wait was most of the agent loop's own per-token cost (bench/loop_overhead.py).

Liveness: each running agent holds an exclusive flock on `<name>.lock` for its whole life (the
OS drops it when the process dies, however it dies). At start the agent looks for journals of
the same working directory whose lock it can take: those are orphans of a crashed run. A clean
exit deletes its journal; a journal of a session that had been saved (not dirty) is deleted
without asking, since the saved file has everything.

File layout (little endian):
    b"DS4AJRNL" | u32 version (1) | u32 meta_len | meta (UTF-8 JSON) | u32 n | n x u32 tokens
    | u32 crc32 of everything before it
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX only (MLX runs on macOS and Linux); without fcntl every journal looks live
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

import numpy as np

from ds4agent.fsutil import atomic_entry, fsync_dir, fsync_file

MAGIC = b"DS4AJRNL"
VERSION = 1


class JournalError(Exception):
    """A journal file cannot be read (truncated, bad checksum); the message names the file."""


def default_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("ds4agent")) / "journal"


def encode(tokens: Sequence[int], meta: Mapping[str, object]) -> bytes:
    meta_b = json.dumps(meta, ensure_ascii=False, sort_keys=True).encode("utf-8")
    arr = np.asarray(tokens, dtype="<u4")
    body = b"".join((MAGIC, struct.pack("<II", VERSION, len(meta_b)), meta_b,
                     struct.pack("<I", arr.size), arr.tobytes()))
    return body + struct.pack("<I", zlib.crc32(body))


def decode(data: bytes, name: str = "journal") -> tuple[list[int], dict]:
    if len(data) < 20 or not data.startswith(MAGIC):
        raise JournalError(f"{name}: not a ds4agent journal")
    if struct.unpack_from("<I", data, len(data) - 4)[0] != zlib.crc32(data[:-4]):
        raise JournalError(f"{name}: checksum mismatch (truncated or damaged)")
    version, meta_len = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise JournalError(f"{name}: unsupported journal version {version}")
    pos = 16
    meta = json.loads(data[pos:pos + meta_len].decode("utf-8"))
    pos += meta_len
    (n,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if pos + 4 * n + 4 != len(data):
        raise JournalError(f"{name}: token count does not match the file size")
    tokens = np.frombuffer(data, dtype="<u4", count=n, offset=pos).astype(np.int64).tolist()
    return tokens, meta


@dataclass(frozen=True)
class Orphan:
    """A journal left by a run that died."""

    path: Path
    tokens: list[int]
    meta: dict
    mtime: float

    def discard(self) -> None:
        for p in (self.path, self.path.with_suffix(".lock")):
            try:
                p.unlink()
            except OSError:
                pass


class Journal:
    """This process's journal. Owns `<dir>/<id>.journal` and holds the lock on `<id>.lock`."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_dir()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{int(time.time())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.dir / f"{name}.journal"
        self._lock_fd: int | None = None
        self._syncer: _Syncer | None = None  # started by the first write
        lock = self.dir / f"{name}.lock"
        self._lock_fd = os.open(lock, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        if fcntl is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(self, tokens: Sequence[int], meta: Mapping[str, object]) -> None:
        # The one atomic-replace procedure for our own files (temp beside it, rename): a crash
        # mid-write leaves the previous journal, never a torn one, and a link planted at the
        # journal's name is replaced, never written through. The fsyncs follow on the syncer.
        with atomic_entry(self.path, mode=0o600, durable=False) as fh:
            fh.write(encode(tokens, meta))
        if self._syncer is None:
            self._syncer = _Syncer(self.path)
        self._syncer.request()

    def sync(self) -> None:
        """Wait until the last journal written is on disk (tests; close does it too)."""
        if self._syncer is not None:
            self._syncer.wait()

    def clear(self) -> None:
        """Forget the journalled transcript (clean exit)."""
        try:
            self.path.unlink()
        except OSError:
            pass

    def close(self, *, keep: bool = False) -> None:
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None
        if not keep:
            self.clear()
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = None
            if not keep:
                try:
                    self.path.with_suffix(".lock").unlink()
                except OSError:
                    pass

    def orphans(self, cwd: str) -> list[Orphan]:
        """Journals of dead runs for this working directory, newest first. Unreadable ones are
        deleted (they can never be resumed)."""
        found: list[Orphan] = []
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        for name in names:
            if not name.endswith(".journal"):
                continue
            path = self.dir / name
            if path == self.path or not _is_orphan(path):
                continue
            try:
                data = path.read_bytes()
                tokens, meta = decode(data, name)
                mtime = path.stat().st_mtime
            except (OSError, JournalError, ValueError):
                Orphan(path, [], {}, 0.0).discard()
                continue
            if meta.get("cwd") != cwd:
                continue
            found.append(Orphan(path, tokens, meta, mtime))
        found.sort(key=lambda o: -o.mtime)
        return found


class _Syncer:
    """fsyncs the journal file and its directory on a thread of its own, after each write.
    Requests coalesce: writes that come while a sync runs are covered by one more sync."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._cond = threading.Condition()
        self._asked = 0  # writes requested so far
        self._done = 0  # writes covered by a finished sync
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="journal-sync", daemon=True)
        self._thread.start()

    def request(self) -> None:
        with self._cond:
            self._asked += 1
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._done >= self._asked)

    def stop(self) -> None:
        """Finish the sync still owed, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._asked > self._done or self._stopping)
                if self._asked == self._done:
                    return
                target = self._asked
            try:
                fsync_file(self._path)
                fsync_dir(self._path.parent)
            except OSError:
                pass  # the journal was removed meanwhile (clear): nothing left to make durable
            with self._cond:
                self._done = target
                self._cond.notify_all()


def _is_orphan(journal: Path) -> bool:
    """True when no live process holds the journal's lock."""
    if fcntl is None:  # pragma: no cover
        return False
    lock = journal.with_suffix(".lock")
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return False  # (a link at the lock's name is refused: never opened through)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # locked: its process is alive
    finally:
        os.close(fd)  # closing releases our probe lock
    return True
