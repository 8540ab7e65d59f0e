"""Pseudo-files read normally: /proc and /sys report a size of 0 or 4096 whatever they hold, and
/proc/sys refuses any single read of 4 MiB or more with ENOMEM, so the tools read in pieces until
end of file and never size a read by st_size."""

import errno
import io
import os
import sys

import pytest

from ds4agent.tools.regular import read_bounded

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


class PickyFile(io.RawIOBase):
    """A file that, like /proc/sys, refuses a read request of 4 MiB or more."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.largest = data, 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n=-1):
        if n < 0 or n >= 4 << 20:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        self.largest = max(self.largest, n)
        piece = self.data[self.pos:self.pos + n]
        self.pos += len(piece)
        return piece


def test_read_bounded_reads_in_pieces_up_to_the_limit():
    data = bytes(range(256)) * 1000  # 256000 bytes: several pieces
    f = PickyFile(data)
    assert read_bounded(f, 16 << 20) == data and f.largest <= 64 * 1024
    assert read_bounded(PickyFile(data), 1000) == data[:1000]  # never more than asked
    assert read_bounded(PickyFile(b""), 10) == b""


@linux_only
def test_proc_self_status_is_read(call):
    r = call("read", path="/proc/self/status")
    assert r.ok and "Name:" in r.text and f"Pid:\t{os.getpid()}" in r.text


@linux_only
@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/ostype"), reason="no /proc/sys")
def test_proc_sys_files_are_read_and_searched(call):
    r = call("read", path="/proc/sys/kernel/ostype")
    assert r.text == "/proc/sys/kernel/ostype: lines 1-1 of 1\n1 Linux\n"
    r = call("search", query="Linux", path="/proc/sys/kernel/ostype")
    assert r.ok and "  1 Linux\n" in r.text
