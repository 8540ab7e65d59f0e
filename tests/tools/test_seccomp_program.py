"""The seccomp filter's decisions, read by running its BPF program on made-up calls (pure: no
kernel involved, so both architectures' programs are checked on any machine)."""

from __future__ import annotations

import errno
import struct

import pytest

from ds4agent.tools import seccomp

ALLOW, NOTIFY, KILL = 0x7FFF0000, 0x7FC00000, 0x80000000


def _errno(e: int) -> int:
    return 0x00050000 | e


def run(prog, arch: int, nr: int, args=(0,) * 6) -> int:
    """Classic BPF as seccomp runs it, on struct seccomp_data (nr, arch, ip, args[6])."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x06:
            return k
        else:
            taken = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("supervise", [False, True])
@pytest.mark.parametrize("refuse_sockets", [False, True])
def test_x86_64(supervise, refuse_sockets):
    prog = seccomp.program("x86_64", refuse_sockets, supervise)
    native = 0xC000003E
    assert run(prog, native, 39) == ALLOW  # getpid
    assert run(prog, 0x40000003, 20) == KILL  # i386 through int 0x80
    assert run(prog, native, 0x40000000 | 39) == KILL  # x32
    assert [run(prog, native, nr) for nr in (425, 426, 427)] == [_errno(errno.EPERM)] * 3
    unix = run(prog, native, 41, (1, 1, 0, 0, 0, 0))
    assert unix == (_errno(errno.EACCES) if refuse_sockets else ALLOW)
    assert run(prog, native, 41, (2, 1, 0, 0, 0, 0)) == ALLOW  # AF_INET
    assert run(prog, native, 53, (1, 1, 0, 0, 0, 0)) == ALLOW  # socketpair
    meta = [90, 91, 268, 92, 93, 94, 260, 132, 235, 261, 280, 188, 189, 190, 197, 198, 199]
    assert [run(prog, native, nr) for nr in meta] == [NOTIFY if supervise else ALLOW] * len(meta)
    assert run(prog, native, 452) == (_errno(errno.ENOSYS) if supervise else ALLOW)  # fchmodat2
    assert run(prog, native, 16, (3, 0x40086602, 0, 0, 0, 0)) == (_errno(errno.EPERM) if supervise else ALLOW)
    assert run(prog, native, 16, (3, 0x5401, 0, 0, 0, 0)) == ALLOW  # TCGETS


def test_aarch64():
    prog = seccomp.program("aarch64", True, True)
    native = 0xC00000B7
    assert run(prog, native, 172) == ALLOW  # getpid
    assert run(prog, 0x40000028, 20) == KILL  # arm32
    assert run(prog, native, 425) == _errno(errno.EPERM)
    assert run(prog, native, 198, (1, 1, 0, 0, 0, 0)) == _errno(errno.EACCES)
    assert [run(prog, native, nr) for nr in (52, 53, 54, 55, 88, 5, 6, 7, 14, 15, 16)] == [NOTIFY] * 11
    assert run(prog, native, 29, (3, 0x401C6620, 0, 0, 0, 0)) == _errno(errno.EPERM)
