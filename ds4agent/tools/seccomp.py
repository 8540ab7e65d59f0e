"""The seccomp side of a job's boundary: the filter every sandboxed job runs under on Linux, and the
supervisor that answers its metadata calls where there is no mount namespace. Part of the
launcher's script (see launcher.py): standard library only.

    install(machine, refuse_sockets, supervise) -> listener fd or -1
    supervise(listener, child, spec) -> never returns: serves the child's metadata calls until it
                                       exits, then exits as it did

The filter, in both modes:
* a foreign ABI (i386 through int 0x80 on x86_64, x32 numbers, arm32 on aarch64) kills the process:
  its calls have other numbers, which the rules below would not see;
* io_uring (setup, enter, register) is refused with EPERM, as Docker's default profile does: its
  operations (socket, setxattr, ...) run without passing through this filter;
* without a mount namespace and unless the user allowed sockets, socket(AF_UNIX) is refused (EACCES):
  bound sockets cannot be hidden one by one there (socketpair stays allowed);
* without a mount namespace, the calls that change metadata (chmod, chown, utime and xattr families)
  go to the supervisor, and the newer variants (fchmodat2, setxattrat, removexattrat, file_setattr)
  answer ENOSYS so that the C library falls back to the supervised ones; FS_IOC_SETFLAGS and
  FS_IOC_FSSETXATTR (chattr) are refused with EPERM. Landlock has no right for any of these, and with
  a mount namespace the read-only mounts refuse them (EROFS).

The supervisor (the launcher's process, in the job's Landlock domain; the job runs in a domain nested
inside it, so it can neither trace nor signal it) does each call itself, on what the job's call
names as the job would find it (its working directory, its descriptors), and only when the file it
opened lies where a job may write: beneath the tree (not .git/ unless granted, not the agent's own
code), the job's temp dir or /dev/shm. Anything else answers EROFS, "Read-only file system", what the
mount namespace answers. It reads the call's arguments once and acts on the file it opened itself:
a job that changes the path in memory or swaps a symlink meanwhile cannot redirect it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import stat
import struct

# Classic BPF, as seccomp runs it.
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _NOTIFY, _KILL, _ERRNO = 0x7FFF0000, 0x7FC00000, 0x80000000, 0x00050000
_SET_MODE_FILTER, _NEW_LISTENER = 1, 1 << 3
_X32_BIT = 0x40000000
_AF_UNIX = 1
_IO_URING = (425, 426, 427)  # setup, enter, register: one numbering on every architecture
_NEWER_METADATA = (452, 463, 466, 469)  # fchmodat2, setxattrat, removexattrat, file_setattr
_SETFLAGS_IOCTLS = (0x40086602, 0x40046602, 0x401C6620)  # FS_IOC_SETFLAGS, its 32-bit form, FS_IOC_FSSETXATTR

# What each metadata call is: (operation, how it names its file, index of its flags or -1).
# "path" follows a final symlink, "lpath" does not, "fd" is a descriptor, "at" a dirfd and a path.
_X86_64_META = {
    90: ("chmod", "path", -1), 91: ("chmod", "fd", -1), 268: ("chmod", "at", -1),
    92: ("chown", "path", -1), 93: ("chown", "fd", -1), 94: ("chown", "lpath", -1), 260: ("chown", "at", 4),
    132: ("utime", "path", -1), 235: ("utimes", "path", -1), 261: ("utimes", "at", -1),
    280: ("utimensat", "at", 3),
    188: ("setxattr", "path", -1), 189: ("setxattr", "lpath", -1), 190: ("setxattr", "fd", -1),
    197: ("removexattr", "path", -1), 198: ("removexattr", "lpath", -1), 199: ("removexattr", "fd", -1),
}
_AARCH64_META = {
    52: ("chmod", "fd", -1), 53: ("chmod", "at", -1), 54: ("chown", "at", 4), 55: ("chown", "fd", -1),
    88: ("utimensat", "at", 3),
    5: ("setxattr", "path", -1), 6: ("setxattr", "lpath", -1), 7: ("setxattr", "fd", -1),
    14: ("removexattr", "path", -1), 15: ("removexattr", "lpath", -1), 16: ("removexattr", "fd", -1),
}
# machine -> (audit arch, socket, ioctl, seccomp, metadata calls, x32 numbers exist)
ARCHES = {
    "x86_64": (0xC000003E, 41, 16, 317, _X86_64_META, True),
    "aarch64": (0xC00000B7, 198, 29, 277, _AARCH64_META, False),
}

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW, _AT_EMPTY_PATH = 0x100, 0x1000
_PATH_MAX = 4096
_XATTR_NAME_MAX, _XATTR_SIZE_MAX = 255, 65536
_PR_SET_DUMPABLE = 4
# SECCOMP_IOCTL_NOTIF_RECV / _SEND / _ID_VALID (struct seccomp_notif is 80 bytes, the response 24).
_NOTIF_RECV, _NOTIF_SEND, _NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
_NOTIF = struct.Struct("=QIIiIQ6Q")  # id, pid, flags, nr, arch, ip, args[6]
_RESP = struct.Struct("=QqiI")  # id, val, error, flags


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def program(machine: str, refuse_sockets: bool, supervise: bool) -> list[tuple[int, int, int, int]]:
    """The filter's instructions (code, jt, jf, k). Written with labels, resolved here: a jump
    names the return it goes to ("kill", "eperm", ...); returns come last."""
    audit, nr_socket, nr_ioctl, _, meta, has_x32 = ARCHES[machine]
    code: list[tuple] = [("ld", 4), ("jeq", audit, None, "kill"), ("ld", 0)]
    if has_x32:
        code.append(("jge", _X32_BIT, "kill", None))
    code += [("jeq", nr, "eperm", None) for nr in _IO_URING]
    if supervise:
        code += [("jeq", nr, "notify", None) for nr in sorted(meta)]
        code += [("jeq", nr, "enosys", None) for nr in _NEWER_METADATA]
    if refuse_sockets:
        # args[0], the domain, low word; past the label the accumulator still holds the number.
        code += [("jeq", nr_socket, None, "skip_socket"), ("ld", 16), ("jeq", _AF_UNIX, "eacces", "allow"),
                 ("label", "skip_socket")]
    if supervise:
        code += [("jeq", nr_ioctl, None, "allow"), ("ld", 24)]  # args[1], the request, low word
        code += [("jeq", req, "eperm", None) for req in _SETFLAGS_IOCTLS]
    code += [("ret", "allow", _ALLOW), ("ret", "kill", _KILL), ("ret", "eperm", _ERRNO | errno.EPERM),
             ("ret", "eacces", _ERRNO | errno.EACCES), ("ret", "enosys", _ERRNO | errno.ENOSYS),
             ("ret", "notify", _NOTIFY)]
    where: dict[str, int] = {}
    n = 0
    for item in code:
        if item[0] == "label":
            where[item[1]] = n
        else:
            if item[0] == "ret":
                where[item[1]] = n
            n += 1
    out: list[tuple[int, int, int, int]] = []
    for item in code:
        if item[0] == "label":
            continue
        at = len(out)
        if item[0] == "ld":
            out.append((_LD, 0, 0, item[1]))
        elif item[0] == "ret":
            out.append((_RET, 0, 0, item[2]))
        else:
            jt, jf = (0 if t is None else where[t] - at - 1 for t in item[2:4])
            out.append((_JEQ if item[0] == "jeq" else _JGE, jt, jf, item[1]))
    return out


def install(machine: str, refuse_sockets: bool, supervise: bool) -> int:
    """Install the filter on this process (no_new_privs already set); the listener's descriptor
    when `supervise`, else -1. OSError when the kernel refuses it."""
    code = program(machine, refuse_sockets, supervise)
    insns = (_Insn * len(code))(*(_Insn(*c) for c in code))
    prog = _Prog(len(code), insns)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    flags = _NEW_LISTENER if supervise else 0
    fd = libc.syscall(ctypes.c_long(ARCHES[machine][3]), ctypes.c_uint(_SET_MODE_FILTER), ctypes.c_uint(flags),
                      ctypes.byref(prog))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd) if supervise else -1


# --------------------------------------------------------------------------------------------------
# The supervisor


def supervise(listener: int, child: int, spec: dict, machine: str) -> None:
    """Serve the child's metadata calls until it exits, then exit with its status (or its signal)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no process of the same user reads or traces this one
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda s, _f: _forward(child, s))
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    meta = ARCHES[machine][4]
    places = _Places(spec)
    while True:
        ready = dict(poller.poll())
        if listener in ready and ready[listener] & select.POLLIN:
            _serve_one(listener, meta, places)
        if pidfd in ready:
            break
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        died_of = os.WTERMSIG(status)
        signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _forward(child: int, sig: int) -> None:
    try:
        os.kill(child, sig)
    except OSError:
        pass


class _Places:
    """Where a job may change metadata: what Landlock lets it write (see launcher._apply_landlock)."""

    def __init__(self, spec: dict) -> None:
        real = os.path.realpath
        self.root = real(spec["root"])
        self.open = [real(spec["temp"])]
        git = [real(p) for p in spec["git"]]
        self.closed = [real(p) for p in spec["protected"]]
        if spec["git_writable"]:
            self.open += git
        else:
            self.closed += git

    def allow(self, path: str) -> bool:
        if not path.startswith("/") or path.endswith(" (deleted)"):
            return False
        # /dev/shm is shared with the whole machine: what is in it, not the directory itself.
        if any(_beneath(path, p) for p in self.open) or path.startswith("/dev/shm/"):
            return True
        return _beneath(path, self.root) and not any(_beneath(path, p) for p in self.closed)


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _serve_one(listener: int, meta: dict, places: _Places) -> None:
    buf = bytearray(_NOTIF.size)
    try:
        fcntl.ioctl(listener, _NOTIF_RECV, buf, True)
    except OSError:
        return  # the caller died before it was read (ENOENT), or an interrupted wait
    nid, tid, _, nr, _, _, *args = _NOTIF.unpack(buf)
    try:
        error = _handle(listener, nid, tid, meta[nr], args, places)
    except OSError as exc:
        error = exc.errno or errno.EPERM
    except Exception:  # whatever the call held, the supervisor keeps serving: the job is refused
        error = errno.EINVAL
    try:
        fcntl.ioctl(listener, _NOTIF_SEND, bytearray(_RESP.pack(nid, 0, -error, 0)), True)
    except OSError:
        pass  # the caller is gone


def _int(value: int) -> int:
    """A syscall argument as the C int the kernel reads (dirfds, AT_FDCWD)."""
    return ctypes.c_int(value & 0xFFFFFFFF).value


def _handle(listener: int, nid: int, tid: int, call: tuple[str, str, int], args: list[int], places: _Places) -> int:
    op, how, flags_at = call
    flags = args[flags_at] & 0xFFFFFFFF if flags_at >= 0 else 0
    if flags & ~(_AT_SYMLINK_NOFOLLOW | _AT_EMPTY_PATH):
        return errno.EINVAL
    dfd = _int(args[0]) if how in ("fd", "at") else _AT_FDCWD
    address = None if how == "fd" else args[1] if how == "at" else args[0]
    rest = args[2:] if how == "at" else args[1:]
    valid = bytearray(struct.pack("=Q", nid))
    fds = [os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)]
    try:
        # What was opened belongs to the caller only if the notification is still live afterwards.
        fcntl.ioctl(listener, _NOTIF_ID_VALID, valid, True)
        mem = fds[0]
        if address == 0:  # a NULL path: the descriptor itself, for the two time calls that allow it
            if how != "at" or op not in ("utimensat", "utimes") or dfd == _AT_FDCWD:
                return errno.EFAULT
            address = None
        name = None if address is None else _string(mem, address, _PATH_MAX)
        if name == b"":
            if not flags & _AT_EMPTY_PATH:
                return errno.ENOENT
            name = None
        start = f"/proc/{tid}/cwd" if dfd == _AT_FDCWD else f"/proc/{tid}/fd/{dfd}"
        if name is None:
            target = _open(fds, start, os.O_PATH)
        else:
            nofollow = os.O_NOFOLLOW if how == "lpath" or flags & _AT_SYMLINK_NOFOLLOW else 0
            base = None if name.startswith(b"/") else _open(fds, start, os.O_PATH | os.O_DIRECTORY)
            target = _open(fds, _callers_view(name, tid), os.O_PATH | nofollow, base)
        fcntl.ioctl(listener, _NOTIF_ID_VALID, valid, True)
        if not places.allow(os.readlink(f"/proc/self/fd/{target}")):
            return errno.EROFS
        _act(op, target, rest, mem)
        return 0
    finally:
        for fd in fds:
            os.close(fd)


def _open(fds: list[int], path: str | bytes, flags: int, base: int | None = None) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC, dir_fd=base)
    fds.append(fd)
    return fd


def _callers_view(name: bytes, tid: int) -> bytes:
    """/proc/self, /proc/thread-self and /dev/fd as the caller means them (this process sees its own)."""
    mine = f"/proc/{tid}".encode()
    for prefix, theirs in ((b"/proc/self", mine), (b"/proc/thread-self", mine), (b"/dev/fd", mine + b"/fd")):
        if name == prefix or name.startswith(prefix + b"/"):
            return theirs + name[len(prefix):]
    for n, std in enumerate((b"/dev/stdin", b"/dev/stdout", b"/dev/stderr")):
        if name == std:
            return mine + b"/fd/%d" % n
    return name


def _string(mem: int, address: int, limit: int) -> bytes:
    out = b""
    while len(out) <= limit:
        chunk = _read(mem, address + len(out), 4096 - (address + len(out)) % 4096)
        end = chunk.find(b"\0")
        if end >= 0:
            return out + chunk[:end]
        out += chunk
    raise OSError(errno.ENAMETOOLONG, "name too long")


def _read(mem: int, address: int, size: int) -> bytes:
    try:
        data = os.pread(mem, size, address)
    except (OSError, OverflowError):
        data = b""
    if len(data) != size:
        raise OSError(errno.EFAULT, "bad address")
    return data


def _act(op: str, target: int, rest: list[int], mem: int) -> None:
    """Do the call on the file opened as `target` (O_PATH), with this process's credentials, which
    are the job's: the file's owner and mode decide as they would have. A symlink is acted on
    through its descriptor only: its /proc/self/fd link must never be followed on to where it points."""
    link = stat.S_ISLNK(os.fstat(target).st_mode)
    path = f"/proc/self/fd/{target}"
    if op == "chmod":
        if link:
            raise OSError(errno.EOPNOTSUPP, "symlinks have no mode")
        os.chmod(path, rest[0] & 0o7777)
    elif op == "chown":
        _libc_call("fchownat", target, b"", ctypes.c_uint(rest[0] & 0xFFFFFFFF), ctypes.c_uint(rest[1] & 0xFFFFFFFF),
                   _AT_EMPTY_PATH)
    elif op in ("setxattr", "removexattr"):
        if link:
            raise OSError(errno.EPERM, "no extended attributes on symlinks here")
        name = _string(mem, rest[0], _XATTR_NAME_MAX)
        if op == "removexattr":
            os.removexattr(path, name)
            return
        if rest[2] > _XATTR_SIZE_MAX:
            raise OSError(errno.E2BIG, "value too large")
        os.setxattr(path, name, _read(mem, rest[1], rest[2]) if rest[2] else b"", _int(rest[3]))
    elif link:
        _libc_call("utimensat", target, b"", _times(op, rest[0], mem), _AT_EMPTY_PATH)
    else:
        _libc_call("utimensat", _AT_FDCWD, path.encode(), _times(op, rest[0], mem), 0)


def _libc_call(name: str, *args) -> None:
    if getattr(ctypes.CDLL(None, use_errno=True), name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _times(op: str, address: int, mem: int):
    """The call's times as utimensat takes them (None: now)."""
    if not address:
        return None
    if op == "utime":  # struct utimbuf: two time_t
        a, m = struct.unpack("=qq", _read(mem, address, 16))
        times = struct.pack("=qqqq", a, 0, m, 0)
    elif op == "utimes":  # two struct timeval
        a, au, m, mu = struct.unpack("=qqqq", _read(mem, address, 32))
        if not (0 <= au < 1_000_000 and 0 <= mu < 1_000_000):
            raise OSError(errno.EINVAL, "bad time")
        times = struct.pack("=qqqq", a, au * 1000, m, mu * 1000)
    else:  # two struct timespec, passed on as they are (UTIME_NOW and UTIME_OMIT included)
        times = _read(mem, address, 32)
    return ctypes.create_string_buffer(times, 32)
