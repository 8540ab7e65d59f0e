"""Acting on a file exactly where its path was resolved: no symlink is followed at the moment of
the act.

The file tools resolve a model's path once (realpath: the links that exist then are followed, and
the permission policy judges that real path, inside or outside the working tree). Every later
open walks that real path from `/` one component at a time, each directory opened with
O_NOFOLLOW|O_DIRECTORY relative to its parent's descriptor (openat), and the file itself opened or
replaced relative to its directory's descriptor. A real path has no symlink in it, so a link met
on the walk is one put there after the path was resolved (a directory swapped for a link to
outside the tree, between the question and the write): it is refused with a tool error, never
followed. The walk itself is fsutil.open_dir_beneath (the undo log restore files through
it too): the portable form of openat2's RESOLVE_NO_SYMLINKS, needing no kernel support beyond
openat, so it behaves the same on Linux and macOS.

Public API:
    FileState                            (dev, ino, size, mtime_ns) of what stood at a path
    open_dir(real, shown, *, create=False, listable=False) -> fd   the caller closes it
    open_file(real, shown, *, list_hint=True) -> (file, stat)   a regular file for reading, beneath
    state_at(real, shown) -> FileState | None      lstat of the entry (None: nothing there)
    replace_file(real, data, shown, *, make_parents, expect)   atomic, refuses a changed target
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import BinaryIO

from ds4agent import fsutil
from ds4agent.tools.regular import adopt_regular, refuse_unless_regular
from ds4agent.tools.results import ToolError

# O_NONBLOCK: a FIFO swapped in after the lstat does not block the open (the fstat refuses it).
_READ = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
         | getattr(os, "O_NOCTTY", 0))


@dataclass(frozen=True)
class FileState:
    """What stood at a path when a change was planned: a write is refused when this differs at the
    moment of the write (another program replaced or edited the file in between)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileState:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _changed(shown: str, component: str) -> ToolError:
    return ToolError(f"{shown} changed since its path was checked: {component} is no longer a "
                     "directory (a symbolic link took its place); nothing was done. "
                     "Check the path and try again")


def open_dir(real: str, shown: str, *, create: bool = False, listable: bool = False) -> int:
    """A descriptor of the directory `real` (absolute, resolved), reached from `/` without
    following any link (fsutil.open_dir_beneath); a link met on the way is a tool error.
    create: missing directories are made on the way (write's parents). listable: the last one is
    opened for reading its entries (else only for walking)."""
    if not os.path.isabs(real):
        raise ToolError(f"internal error: {real!r} is not an absolute path")
    try:
        return fsutil.open_dir_beneath(real, create=create, listable=listable)
    except fsutil.PathChanged as err:
        raise _changed(shown, err.component) from None


def _parent(real: str, shown: str, *, create: bool = False) -> tuple[int, str]:
    head, name = os.path.split(real)
    if not name:
        raise ToolError(f"{shown} is a directory")
    return open_dir(head, shown, create=create), name


_lstat_at = fsutil.lstat_at


def _refuse_link(st: os.stat_result | None, shown: str) -> None:
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise ToolError(f"{shown} changed since its path was checked: a symbolic link took the "
                        "file's place; nothing was done. Check the path and try again")


def state_at(real: str, shown: str) -> FileState | None:
    """The state of the entry at `real` (None: nothing there, its directory included)."""
    try:
        dfd, name = _parent(real, shown)
    except FileNotFoundError:
        return None
    try:
        st = _lstat_at(dfd, name)
    finally:
        os.close(dfd)
    _refuse_link(st, shown)
    return None if st is None else FileState.of(st)


def open_file(real: str, shown: str, *, list_hint: bool = True) -> tuple[BinaryIO, os.stat_result]:
    """Open the regular file `real` for reading, beneath: OSError for a missing or unreadable file
    (FileNotFoundError also when a directory on the way is missing), ToolError for a directory,
    a link that appeared, a FIFO or a device (refused by lstat before the open: some devices act on
    open; checked again on the descriptor)."""
    dfd, name = _parent(real, shown)
    try:
        st = _lstat_at(dfd, name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown)
        _refuse_link(st, shown)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{shown} is a directory" + ("; use the list tool to see its entries" if list_hint else ""))
        refuse_unless_regular(st.st_mode, shown)
        try:
            fd = os.open(name, _READ, dir_fd=dfd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                _refuse_link(os.stat(name, dir_fd=dfd, follow_symlinks=False), shown)
            raise
    finally:
        os.close(dfd)
    return adopt_regular(fd, shown)


_UNSET = object()


def replace_file(real: str, data: bytes, shown: str, *, make_parents: bool = False,
                 expect: FileState | None | object = _UNSET) -> None:
    """Replace the file `real` with `data` atomically (fsutil.atomic_entry_at), beneath. The
    file's permission bits are kept. expect: the state the change was planned against (None: no
    file then); a different state at the moment of the rename is refused and nothing is written.
    A link at the file's own name is refused too (the real path named the file, not a link)."""
    dfd, name = _parent(real, shown, create=make_parents)
    try:
        st = _lstat_at(dfd, name)
        _refuse_link(st, shown)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{shown} is a directory")
        if st is not None:
            refuse_unless_regular(st.st_mode, shown)
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~fsutil.current_umask()

        def unchanged() -> None:
            if expect is _UNSET:
                return
            now = _lstat_at(dfd, name)
            _refuse_link(now, shown)
            if (None if now is None else FileState.of(now)) != expect:
                raise ToolError(f"{shown} changed on disk since this change was planned (another "
                                "program wrote, replaced or removed it); nothing was written. "
                                "Read the file again and redo the change")

        unchanged()
        with fsutil.atomic_entry_at(dfd, name, mode=mode, before_replace=unchanged) as fh:
            fh.write(data)
    finally:
        os.close(dfd)
