"""What the session directory holds, as values: a scan-valid entry, a listed or unreadable
session, what a save wrote and a load read, a file's stamp; and the two things done to a file by
its path alone: where the directory is (default_kv_dir) and in-place hit accounting (touch).
The directory itself, its scans, saves and loads, is store.py (kvc-format.md §4, §8.1, §12).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import KVCIOError
from .kvc import HEADER_BYTES, HITS_SPAN, LAST_USED_SPAN, KVCHeader
from .payload import PayloadState
from .titles import clip_title, display_text

ENV_KV_DIR = "DS4AGENT_KV_DIR"


def default_kv_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--kv-dir > $DS4AGENT_KV_DIR > $HOME/.ds4/kvcache (./.ds4/kvcache without a HOME)."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_KV_DIR)
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HOME")
    return (Path(home) if home else Path(".")) / ".ds4" / "kvcache"


# ------------------------------------------------------------------------------------------------
# entries


@dataclass(frozen=True)
class StoreEntry:
    """A scan-valid file (§8.1): 40-hex name, valid header, long enough for text + payload."""

    path: Path
    id: str  # 40 lowercase hex
    header: KVCHeader
    file_size: int
    text_bytes: int

    @property
    def short_id(self) -> str:
        return self.id[:8]


@dataclass(frozen=True)
class StoredSession:
    """One /list line's worth of a reason-6 file."""

    entry: StoreEntry
    title: bytes  # trailer title, else derived from the text, else `(unreadable session)`
    legacy: bool  # no title trailer: re-saved under a new identity

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def tokens(self) -> int:
        return self.entry.header.tokens

    @property
    def last_used(self) -> int:
        return self.entry.header.last_used

    @property
    def display_title(self) -> str:
        return display_text(clip_title(self.title))


@dataclass(frozen=True)
class UnreadableSession:
    """A `<40 hex>.kv` file that may be a session but cannot be read (bad header, cut short,
    broken title trailer, no permission, not a regular file). Listed with the reason and
    deletable by id prefix, so a damaged session does not simply vanish."""

    path: Path
    id: str  # 40 lowercase hex, from the name
    reason: str  # the chain 8.3 error or the operating system's message
    file_size: int
    last_used: int  # header last_used when the header is readable, else the file's mtime

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @property
    def display_title(self) -> str:
        return f"(unreadable session: {display_text(self.reason.encode())})"


@dataclass(frozen=True)
class SavedSession:
    id: str
    path: Path
    title: bytes
    created_at: int
    n_tokens: int
    deleted: tuple[Path, ...]  # this session's own earlier file (legacy source, old title) removed
    stamp: FileStamp | None = None  # the file as written (see file_stamp)

    @property
    def message(self) -> str:
        return f"saved session {self.id[:8]} ({self.n_tokens} tokens)"


@dataclass(frozen=True)
class LoadedSession:
    id: str
    path: Path
    text: bytes
    payload: PayloadState | None  # None: stripped session, rebuild from text (§12.6)
    title: bytes
    created_at: int
    header: KVCHeader
    legacy: bool  # loaded from a file without a title trailer (delete it at the next save)
    stamp: FileStamp | None = None  # the file as loaded (see file_stamp)


# What identifies one version of a file: (device, inode, size, mtime in ns). Every save writes a
# new file and renames it into place (fsutil), so a save by anyone changes the inode.
FileStamp = tuple[int, int, int, int]


def file_stamp(path: str | os.PathLike[str]) -> FileStamp | None:
    """The stamp of the file at `path` now, None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def touch(path: str | Path, now: int | None = None) -> None:
    """In-place hit accounting (§7): rewrite only hits (12..15) and last_used (32..39), the two
    header fields the checksum trailer does not cover (kvc.summed_header).

    Every other byte is written back as read (reason > 6, reserved bytes and ext bits included);
    like ds4 this is neither atomic nor fsynced: losing a hit count is harmless.
    """
    now = int(time.time()) if now is None else int(now)
    try:
        # O_NOFOLLOW: a cache name that is a symlink would have this write land in whatever file
        # it points at (outside the directory); such a cache is read, never written.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        with open(fd, "r+b", buffering=0) as f:
            raw = bytearray(f.read(HEADER_BYTES))
            KVCHeader.unpack(bytes(raw))  # refuse to rewrite something that is not a valid header
            hits = struct.unpack_from("<I", raw, HITS_SPAN[0])[0]
            struct.pack_into("<I", raw, HITS_SPAN[0], min(hits + 1, 0xFFFFFFFF))
            struct.pack_into("<Q", raw, LAST_USED_SPAN[0], now)
            f.seek(0)
            f.write(raw)
    except OSError as err:
        raise KVCIOError(err.strerror or str(err), path=path) from None
