"""Atomic file replacement, shared by every room that writes files (sessions, tools, journal, engine).

The ground floor: it imports only the standard library and ds4agent.utf8 (ground floor too), so
any room may use it without breaking the import arrows of architecture.md.

The one procedure (kvc-format.md §6.1, used for every file ds4agent writes): a temp file in the
target's own directory (so the rename cannot cross filesystems), data written and fsynced, the
temp renamed over the target, then the directory fsynced so the rename itself survives a power
cut. A crash at any moment leaves the old file or the new one, never a partial target; the temp
file is removed on any failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ds4agent import utf8

TEMP_SUFFIX = ".tmp"


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename durable. Some filesystems refuse to fsync a directory: that is not worth
    failing a save over (the file itself was already fsynced), so such errors are ignored."""
    _fsync_opened(lambda: os.open(directory, os.O_RDONLY))


def _fsync_opened(open_dir: Callable[[], int]) -> None:
    """fsync the directory `open_dir()` opens, ignoring what a filesystem refuses (see fsync_dir)."""
    try:
        fd = open_dir()
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file's data to disk by name (the writer may already have closed it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _default_mode(target: str) -> int:
    """Keep an existing file's permission bits; a new file gets what open() would give it."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def _temp_beside(final: str, prefix: str | None) -> tuple[int, str]:
    """A new temp file (O_CREAT|O_EXCL, mode 0600) in `final`'s directory, named `.<name>.*` + the
    temp suffix (stale ones are recognised by it): (descriptor, path)."""
    return tempfile.mkstemp(prefix=prefix if prefix is not None else "." + os.path.basename(final) + ".",
                            suffix=TEMP_SUFFIX, dir=os.path.dirname(final) or ".")


@contextlib.contextmanager
def _committed(finish: Callable[[], None], discard: Callable[[], None],
               after: Callable[[], None] | None) -> Iterator[None]:
    """The ending every atomic writer shares: when the body (which writes the temp file) ends
    cleanly, `finish()` puts the temp in place (the rename, with what must precede it); an
    exception from either removes the temp (`discard`) and propagates, leaving the target
    untouched; once it is in place, `after()` (the directory fsync) makes the rename durable."""
    try:
        yield
        finish()
    except BaseException:
        with contextlib.suppress(OSError):
            discard()
        raise
    if after is not None:
        after()


@contextlib.contextmanager
def _written(fd: int, *, mode: int, durable: bool) -> Iterator[BinaryIO]:
    """The temp file open at `fd` for the caller to write; on a clean exit its data is flushed,
    given `mode` and (durable) fsynced through the same descriptor, then closed."""
    with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
        yield fh
        fh.flush()
        os.fchmod(fh.fileno(), mode)
        if durable:
            os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, mode: int | None = None,
                prefix: str | None = None, make_parents: bool = False) -> Iterator[Path]:
    """Yield a fresh temp path beside `target`; the caller writes the complete file there (by name,
    for writers that open paths themselves). On a clean exit the temp is fsynced, given `mode`
    (default: the target's current bits, else the umask's), renamed over `target` and the
    directory fsynced; on any exception it is removed and the target is untouched.

    A symlinked target is replaced through its link (the link keeps pointing at the new file).
    """
    real = os.path.realpath(os.fspath(target))
    parent = os.path.dirname(real) or "."
    if make_parents:
        os.makedirs(parent, exist_ok=True)
    final_mode = _default_mode(real) if mode is None else mode
    fd, tmp = _temp_beside(real, prefix)
    os.close(fd)

    def finish() -> None:
        fsync_file(tmp)
        os.chmod(tmp, final_mode)
        os.replace(tmp, real)

    with _committed(finish, lambda: os.unlink(tmp), lambda: fsync_dir(parent)):
        yield Path(tmp)


@contextlib.contextmanager
def atomic_entry(target: str | os.PathLike[str], *, mode: int, prefix: str | None = None,
                 durable: bool = True) -> Iterator[BinaryIO]:
    """Replace the directory entry `target` itself, for files ds4agent owns in its own directories
    (session files and caches): yields the temp file opened for binary writing.

    durable=False leaves out the two fsyncs: the replacement is still atomic for every process
    (a reader sees the old file or the new one), but a power cut may lose it until the caller
    fsyncs the target and its directory itself (the crash journal does that off its hot path).

    Unlike atomic_path, a symlink at `target` is never followed: the rename replaces the link with
    the new regular file and whatever it pointed at stays untouched. A link planted in the KV
    directory (e.g. `sysprompt-<hex>.kv` -> /etc/passwd, rewritten at every start) must not turn a
    save into a write to an arbitrary file. The temp file is created with O_CREAT|O_EXCL|O_NOFOLLOW
    (mkstemp) and written, chmodded and fsynced through that descriptor, never reopened by name.
    """
    final = os.path.abspath(os.fspath(target))  # abspath, not realpath: the name, not its target
    parent = os.path.dirname(final)
    fd, tmp = _temp_beside(final, prefix)
    with (_committed(lambda: os.replace(tmp, final), lambda: os.unlink(tmp),
                     (lambda: fsync_dir(parent)) if durable else None),
          _written(fd, mode=mode, durable=durable) as fh):
        yield fh


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike[str], *, mode: int | None = None,
                prefix: str | None = None, make_parents: bool = False) -> Iterator[BinaryIO]:
    """Like atomic_path, but yield the temp file opened for binary writing (streamed writes)."""
    with atomic_path(target, mode=mode, prefix=prefix, make_parents=make_parents) as tmp, open(tmp, "wb") as fh:
        yield fh
        fh.flush()


def atomic_write(target: str | os.PathLike[str], data: bytes, *, mode: int | None = None,
                 make_parents: bool = False) -> None:
    """Replace `target` with `data` atomically (see atomic_path)."""
    with atomic_file(target, mode=mode, make_parents=make_parents) as fh:
        fh.write(data)


def short_name(name: str, limit: int = 150) -> str:
    """`name` cut to at most `limit` bytes of UTF-8 (whole characters), for temp names built from
    it: a file name may be 255 bytes long, its temp name must still fit."""
    return utf8.cut(name.encode("utf-8", "surrogateescape"), limit).decode("utf-8", "ignore")


@contextlib.contextmanager
def atomic_entry_at(dir_fd: int, name: str, *, mode: int, prefix: str | None = None,
                    before_replace: Callable[[], None] | None = None) -> Iterator[BinaryIO]:
    """atomic_entry for the entry `name` of the directory open at `dir_fd` (a descriptor the caller
    reached without following links): the temp file is made in that very directory
    (O_CREAT|O_EXCL|O_NOFOLLOW), written, chmodded and fsynced through its descriptor, then
    renamed over `name` relative to the same descriptor, so no path is looked up again by name
    from the root. `before_replace` runs after the data is durable and just before the rename; an
    exception from it (the caller found the target changed) removes the temp file and leaves the
    target untouched. prefix: the temp file's name before its random part (default `.<name>.`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = f"{prefix if prefix is not None else '.' + short_name(name) + '.'}{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue

    def finish() -> None:
        if before_replace is not None:
            before_replace()
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    with (_committed(finish, lambda: os.unlink(tmp, dir_fd=dir_fd), lambda: fsync_dir_at(dir_fd)),
          _written(fd, mode=mode, durable=True) as fh):
        yield fh


def fsync_dir_at(dir_fd: int) -> None:
    """fsync_dir for a directory open at `dir_fd` (which may be an O_PATH descriptor: fsync needs
    a real one, so "." is opened relative to it)."""
    _fsync_opened(lambda: os.open(".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0), dir_fd=dir_fd))


# O_PATH (Linux) opens a directory only to walk it: no read permission needed, nothing read.
_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class PathChanged(OSError):
    """open_dir_beneath met a symbolic link where the resolved path had a directory."""

    def __init__(self, component: str) -> None:
        super().__init__(f"{component} is a symbolic link, not a directory")
        self.component = component


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry `name` of the directory open at `dir_fd`, links not followed; None: no entry."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir_beneath(real: str, *, create: bool = False, listable: bool = False) -> int:
    """A descriptor of the directory at the absolute, already resolved path `real`, opened from `/`
    one component at a time with O_NOFOLLOW|O_DIRECTORY relative to the parent's descriptor
    (openat): a resolved path has no link in it, so a link met here was put there after the path
    was resolved, and is refused (PathChanged) instead of followed. This is openat2's
    RESOLVE_NO_SYMLINKS by hand, the same on every kernel and on macOS.

    create: missing directories are made on the way. listable: the last one is opened for reading
    its entries (else O_PATH where there is one: walking needs no read permission). Other errors
    are the OSError of the failing open (FileNotFoundError, NotADirectoryError for a file)."""
    parts = [p for p in real.split(os.sep) if p]
    fd = os.open("/", _LIST if listable and not parts else _WALK)
    try:
        done = "/"
        for i, part in enumerate(parts):
            flags = _LIST if listable and i == len(parts) - 1 else _WALK
            try:
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                    nxt = os.open(part, flags, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    st = lstat_at(fd, part)
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        raise PathChanged(os.path.join(done, part)) from None
                raise
            os.close(fd)
            fd = nxt
            done = os.path.join(done, part)
        return fd
    except BaseException:
        os.close(fd)
        raise
