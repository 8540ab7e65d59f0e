"""Opening the files the tools read: regular files only, and never an open that can block.

A FIFO opened for reading waits until some process opens it for writing (forever, in practice),
and a device such as /dev/zero or /dev/urandom never ends. The file tools (read, more, edit, search,
write's preview) therefore refuse anything that is not a regular file, at once, with a tool error.

Public API:
    describe(mode) -> str                 what a non-regular file is, in words ("a FIFO (named pipe)")
    refuse_unless_regular(mode, shown)    ToolError unless `mode` is a regular file's
    open_regular(full, shown) -> (file, st)  opened for binary reading, with its fstat
    read_bounded(f, limit) -> bytes       at most `limit` bytes, read in modest pieces
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from ds4agent.tools.results import ToolError

# O_NONBLOCK: should a FIFO take the place of the checked name between the stat and the open, the
# open returns at once instead of waiting for a writer (and the fstat below then refuses it).
# O_NOCTTY: opening a terminal device never makes it our controlling terminal.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refuse_unless_regular(mode: int, shown: str) -> None:
    if stat.S_ISREG(mode):
        return
    what = describe(mode)
    raise ToolError(f"{shown} is {what}{', not a regular file' if what != 'not a regular file' else ''}; "
                    "the file tools open only regular files (inspect it with bash if needed)")


def open_regular(full: str | os.PathLike[str], shown: str) -> tuple[BinaryIO, os.stat_result]:
    """Open `full` for reading if it is a regular file (symlinks followed); OSError for a missing or
    unreadable file, ToolError for anything else. The type is checked by stat before the open, so
    a device is never opened at all (some devices act on open), and again on the opened descriptor,
    so a name swapped in between cannot slip through."""
    refuse_unless_regular(os.stat(full).st_mode, shown)
    return adopt_regular(os.open(full, _OPEN_FLAGS), shown)


def adopt_regular(fd: int, shown: str) -> tuple[BinaryIO, os.stat_result]:
    """A file object for the descriptor `fd` just opened, if it is (still) a regular file: the
    type checked before the open is checked again on what was opened. `fd` is closed on refusal."""
    try:
        st = os.fstat(fd)
        refuse_unless_regular(st.st_mode, shown)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


# Why pieces: a read asks the kernel for as many bytes as requested, and some pseudo-files refuse
# a large request outright: /proc/sys/* answers ENOMEM ("Cannot allocate memory") to any read of
# KMALLOC_MAX_SIZE or more (4 MiB here), whatever the file holds. Their st_size (0, or 4096 in
# /sys) says nothing either, so the size is never taken from stat: read until end of file.
_READ_PIECE = 64 * 1024


def read_bounded(f: BinaryIO, limit: int) -> bytes:
    """At most `limit` bytes of `f` from its position, in pieces of 64 KiB (a caller that wants
    to know whether a file exceeds N bytes asks for N + 1)."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        piece = f.read(min(_READ_PIECE, limit - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)
