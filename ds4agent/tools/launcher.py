"""The job's side of the OS boundary: what runs in the job's own process, single-threaded, before it
execs the command (sandbox.py is the agent's side: what to ask for, and how to read refusals).

sandbox.py hands this module's text and seccomp.py's to a fresh interpreter (`python -I -S -c`),
read once when the agent starts, so the code that builds a job's boundary is never a file a job
could have rewritten since. Standard library only, for the same reason.

    main(argv)                 SPEC -- PROGRAM [ARGS...]: build the boundary SPEC describes, exec
    landlock_abi() -> int      the kernel's Landlock ABI (0: none)
    handled_rights(abi)        the Landlock rights, attr size and scopes asked of an ABI
    inside(path, root) -> bool

In order: the mount namespace when user namespaces are allowed (.git and the agent's code read-only,
every other mount read-only but the writable places, bound sockets hidden), else Landlock rules on
the tree's entries; Landlock; no_new_privs and every capability dropped; the seccomp filter
(seccomp.py), and without a mount namespace the supervisor of the metadata calls; then exec.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import signal
import stat
import sys

from ds4agent.tools import seccomp

LAUNCH_FAILED = 126  # the launcher could not build the boundary: nothing ran

# Landlock ABI (include/uapi/linux/landlock.h). Rights that change the file system; reading and
# executing are not handled, so they stay allowed everywhere.
_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2: renames and links across directories (unhandled in ABI 1: always EXDEV)
_FS_TRUNCATE = 1 << 14  # ABI 3: truncate(2) and O_TRUNC (before it, truncation was not controlled)
_FS_IOCTL_DEV = 1 << 15  # ABI 5: ioctl on devices; handled so TIOCSTI cannot type into a terminal
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6: no connecting to abstract sockets outside the sandbox
_SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the sandbox (the agent, the editor)
_FS_V1 = (_FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_CHAR | _FS_MAKE_DIR | _FS_MAKE_REG
          | _FS_MAKE_SOCK | _FS_MAKE_FIFO | _FS_MAKE_BLOCK | _FS_MAKE_SYM)
_FILE_RIGHTS = _FS_WRITE_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV  # the only rights a rule on a file may hold
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT (+ its lock) and SECBIT_NO_CAP_AMBIENT_RAISE (+ its lock): uid 0 gains nothing at exec.
_SECURE_NO_ROOT = 0x01 | 0x02 | 0x40 | 0x80
_CAPABILITY_VERSION_3 = 0x20080522
_CAP_LAST_POSSIBLE = 63  # the kernel's last_cap is lower; dropping an unknown number is EINVAL, ignored
# Creating device nodes is never a job's business, in the tree or anywhere (a char device node of
# the disk in the tree would read and write the whole file system past every rule).
_FS_DEVICES = _FS_MAKE_CHAR | _FS_MAKE_BLOCK
# The Landlock syscalls were added after the numbering was unified across architectures.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_NOATIME, _MS_NODIRATIME = 32, 4096, 1024, 2048
_MS_REC, _MS_PRIVATE, _MS_RELATIME = 16384, 1 << 18, 1 << 21
_ST_RELATIME = 4096

# Devices a job writes as usual (output to a terminal, discarding): write only, no ioctl.
# (/dev/stdout and /dev/fd/N reopen what the job already holds: a pipe needs no rule, and a file is
# judged by its own path.)
DEVICES = ("/dev/null", "/dev/tty", "/dev/pts")
SHARED = ("/dev/shm",)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (not Linux, not built, switched off)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def handled_rights(abi: int) -> tuple[int, int, int]:
    """(handled fs rights, ruleset attr size, scopes) for an ABI: each version adds fields the
    older kernels reject, so only what this kernel knows is asked for."""
    fs = _FS_V1
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    if abi >= 5:
        fs |= _FS_IOCTL_DEV
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    return fs, size, scoped


def _fail(what: str) -> None:
    os.write(2, f"ds4agent sandbox: {what}; the command was not run\n".encode())
    os._exit(LAUNCH_FAILED)


def _enter_mount_namespace(protected: list[str]) -> bool:
    """Bind the git metadata read-only over itself in a private mount namespace (False when user
    namespaces are not allowed here: the caller falls back to rules per entry)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        return False
    # Map only ourselves: the same uid and gid inside as outside.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        _fail(f"cannot make the mounts private: {os.strerror(ctypes.get_errno())}")
    for path in protected:
        p = path.encode()
        if mount(p, p, None, _MS_BIND | _MS_REC, None) != 0:
            _fail(f"cannot bind {path}: {os.strerror(ctypes.get_errno())}")
        # A remount must keep the flags the outer namespace locked (nosuid, nodev, atime...).
        f = os.statvfs(path).f_flag
        keep = f & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
        keep |= _MS_RELATIME if f & _ST_RELATIME else 0
        if mount(None, p, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep, None) != 0:
            _fail(f"cannot make {path} read-only: {os.strerror(ctypes.get_errno())}")
    return True


# File systems whose remount a user namespace may be refused and that hold no user files.
_PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs",
                        "tracefs", "pstore", "bpf", "configfs", "fusectl", "binfmt_misc", "hugetlbfs", "nsfs"})


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount in this namespace, from mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, fields[sep + 1]))
    return out


def _read_only_elsewhere(writable: list[str]) -> None:
    """Make every mount read-only in the job's namespace except the places a job may write (each
    bound over itself first, so it is a mount of its own that keeps its rights). Landlock has no
    right for chmod, chown, utimes or extended attributes: without this a job could set the setuid
    bit on, or back-date, any file outside the tree it owns. Refused, it gets EROFS ("Read-only
    file system"), which the refusal reader names like any other refusal."""
    libc = ctypes.CDLL(None, use_errno=True)
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    keep_open: list[str] = []
    for path in writable:
        try:
            real = os.path.realpath(path)
        except OSError:
            continue
        if not os.path.isdir(real) or any(inside(real, k) for k in keep_open):
            continue
        if mount(real.encode(), real.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            _fail(f"cannot bind {real}: {os.strerror(ctypes.get_errno())}")
        keep_open.append(real)
    for point, fstype in _mount_points():
        if any(inside(point, k) for k in keep_open):
            continue
        try:
            f = os.statvfs(point).f_flag
        except OSError:
            continue  # hidden under another mount: nothing reaches it
        if f & os.ST_RDONLY:
            continue
        keep = f & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
        keep |= _MS_RELATIME if f & _ST_RELATIME else 0
        if mount(None, point.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep, None) != 0:
            if fstype not in _PSEUDO_FS:
                _fail(f"cannot make {point} read-only: {os.strerror(ctypes.get_errno())}")
    # The working directory was entered before the binds: through the old (now read-only) mount.
    # Entered again by its name, it resolves through the bind.
    try:
        os.chdir(os.getcwd())
    except OSError:
        pass


def _private_shared() -> None:
    """A fresh tmpfs of the job's own on /dev/shm: its semaphores and shared memory work, and the
    machine's /dev/shm (its entries, and the directory's own mode and times, which a job running as
    root would own) stays out of reach. Where the kernel refuses the mount, the machine's /dev/shm
    stays writable as before."""
    libc = ctypes.CDLL(None, use_errno=True)
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    for path in SHARED:
        if os.path.isdir(path):
            mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777,size=50%")


def _unix_socket_paths() -> list[str]:
    """The paths of the Unix sockets bound on this machine (its network namespace), from
    /proc/net/unix (last column; abstract names start with '@' and are Landlock's to scope)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 22).splitlines()[1:]
    except OSError:
        return []
    paths = {parts[-1] for parts in (line.split() for line in lines) if len(parts) >= 8}
    return sorted(p for p in paths if p.startswith("/"))


def _mask_sockets(reachable: list[str], temp: str) -> None:
    """Hide, in the job's mount namespace, every bound Unix socket outside the tree, the job's temp
    dir and the user's allowed sockets: an empty file is bound over it, so connect() finds no
    socket there (ECONNREFUSED). A tmux, screen, docker, D-Bus or ssh-agent socket reached from a
    job would run commands or reach secrets outside the boundary. Sockets that appear after the
    job started are not hidden (a job cannot create one outside the tree itself)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    blank = os.path.join(temp, ".masked-socket")
    os.close(os.open(blank, os.O_CREAT | os.O_WRONLY, 0o400))
    for path in _unix_socket_paths():
        try:
            real = os.path.realpath(path)
            if any(inside(real, r) for r in reachable) or not stat.S_ISSOCK(os.lstat(real).st_mode):
                continue
        except OSError:
            continue  # gone, or in a directory this user cannot see into: unreachable anyway
        if mount(blank.encode(), real.encode(), None, _MS_BIND, None) != 0:
            _fail(f"cannot hide the socket {real}: {os.strerror(ctypes.get_errno())}")


def _apply_landlock(spec: dict) -> tuple[int, bool]:
    """Enter the job's Landlock domain (after the mount namespace, where there is one) and drop every
    capability. Returns the ruleset, still open (a supervised child enters it once more), and
    whether the mount namespace was entered."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = landlock_abi()
    if abi <= 0:
        _fail("Landlock is not available")
    fs, size, scoped = handled_rights(abi)
    grant = fs & ~_FS_DEVICES  # every handled right but making device nodes
    root = os.path.realpath(spec["root"])
    # The git metadata and the agent's own code as the agent found them (see git_paths and
    # agent_code): never read again here, where a job may have rewritten a `.git` file.
    git = [os.path.realpath(p) for p in spec["git"]]
    protected = [os.path.realpath(p) for p in spec["protected"]]
    allowed: list[tuple[str, int]] = [(os.path.realpath(spec["temp"]), grant)]
    if spec["git_writable"]:
        allowed += [(p, grant) for p in git if not inside(p, root)]
    else:
        protected += [p for p in git if inside(p, root)]
    reachable = [root, os.path.realpath(spec["temp"]), *spec.get("sockets", ())]
    namespaced = not spec["entries"] and _enter_mount_namespace(protected)
    if namespaced:
        allowed.append((root, grant))
        _private_shared()
        _read_only_elsewhere([path for path, _ in allowed if os.path.isdir(path)] + list(SHARED))
        _mask_sockets(reachable, os.path.realpath(spec["temp"]))
    else:
        # No mount namespace: rules on everything beside the protected places, one by one.
        allowed += _rules_around(root, protected, grant) if protected else [(root, grant)]
    for dev in DEVICES:
        allowed.append((dev, _FS_WRITE_FILE | (fs & _FS_TRUNCATE)))
    allowed += [(p, grant) for p in SHARED]

    attr = _RulesetAttr(fs, 0, scoped)
    ruleset = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        _fail(f"cannot create a Landlock ruleset: {os.strerror(ctypes.get_errno())}")
    for path, rights in allowed:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # absent here (no /dev/shm, no terminal): nothing to allow
        try:
            if not os.path.isdir(path):
                rights &= _FILE_RIGHTS
            rule = _PathBeneathAttr(rights & fs, fd)
            if libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                            ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                _fail(f"cannot add a Landlock rule for {path}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")
    _restrict_self(ruleset)
    _drop_capabilities(libc)
    return ruleset, namespaced


def _restrict_self(ruleset: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        _fail(f"cannot enter the Landlock domain: {os.strerror(ctypes.get_errno())}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc) -> None:
    """A job keeps no capability, even when the agent runs as root: with CAP_MKNOD, CAP_SYS_ADMIN,
    CAP_DAC_OVERRIDE and the like a process can make a device node of the disk, remount, or change
    files the rules do not name. Order matters: the bounding set first (needs CAP_SETPCAP, still
    held), so that exec cannot give uid 0 its full set back; securebits so that uid 0 is not
    special at exec; then ambient, and last the process's own sets. A process without the
    capability to drop them (not root) has nothing to drop: EPERM there is fine."""
    for cap in range(_CAP_LAST_POSSIBLE + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:  # past the kernel's last capability
                break
            if err != errno.EPERM:
                _fail(f"cannot drop capability {cap}: {os.strerror(err)}")
    libc.prctl(_PR_SET_SECUREBITS, _SECURE_NO_ROOT, 0, 0, 0)  # EPERM without CAP_SETPCAP: no caps to lose
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        _fail(f"cannot clear the capabilities: {os.strerror(ctypes.get_errno())}")


def _rules_around(root: str, protected: list[str], grant: int) -> list[tuple[str, int]]:
    """Rules for every entry beneath `root` except the protected places: an entry that holds one is
    walked into, every other gets one rule for all beneath it. Symlinks are skipped (a rule would
    follow them out of the tree; their targets inside have their own). Creating or removing an
    entry directly in a directory on the way to a protected place is then refused (and asked)."""
    out: list[tuple[str, int]] = []
    with os.scandir(root) as it:
        for entry in it:
            if entry.is_symlink() or entry.path in protected:
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and any(inside(p, entry.path) for p in protected):
                out += _rules_around(entry.path, protected, grant)
            else:
                out.append((entry.path, grant if is_dir else grant & _FILE_RIGHTS))
    return out


def main(argv: list[str]) -> None:
    if argv == ["--probe"]:
        os._exit(0 if _enter_mount_namespace([]) else 1)
    if len(argv) < 3 or argv[1] != "--":
        _fail("usage: launcher SPEC -- PROGRAM [ARGS...]")
    try:
        spec = json.loads(argv[0])
        ruleset, namespaced = _apply_landlock(spec)
        machine = os.uname().machine
        if machine not in seccomp.ARCHES:
            os.close(ruleset)  # no filter written for this architecture: the README names the limit
        elif namespaced:
            os.close(ruleset)
            seccomp.install(machine, refuse_sockets=False, supervise=False)
        else:
            _supervised(spec, ruleset, machine)  # returns in the child only
    except (OSError, ValueError, KeyError) as exc:
        _fail(f"cannot build the boundary: {exc}")
    try:
        os.execv(argv[2], argv[2:])
    except OSError as exc:
        _fail(f"cannot run {argv[2]}: {os.strerror(exc.errno or errno.ENOENT)}")


def _supervised(spec: dict, ruleset: int, machine: str) -> None:
    """Without a mount namespace nothing refuses chmod, chown, utimes or xattrs outside the tree: the
    job runs in a child under a filter that hands those calls to this process (seccomp.supervise).
    The child enters the Landlock domain once more, nested in this one, so it can neither trace nor
    signal its supervisor; the listener reaches the supervisor over a socket pair and is closed in
    the child before exec (a job holding it could answer its own calls)."""
    import socket

    mine, theirs = socket.socketpair()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        mine.close()
        # Whatever kills the supervisor (SIGKILL to its pid alone) kills the job too: a job left
        # running without it would get ENOSYS for its metadata calls and nobody to stop it.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(LAUNCH_FAILED)
        _restrict_self(ruleset)
        os.close(ruleset)
        listener = seccomp.install(machine, refuse_sockets=not spec.get("sockets"), supervise=True)
        socket.send_fds(theirs, [b"L"], [listener])
        os.close(listener)
        theirs.close()
        return
    theirs.close()
    os.close(ruleset)
    _, fds, _, _ = socket.recv_fds(mine, 1, 1)
    mine.close()
    if not fds:  # the child failed before its filter was in place (it said why): its status is ours
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    seccomp.supervise(fds[0], child, spec, machine)
