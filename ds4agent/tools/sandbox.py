"""The OS boundary every bash job runs inside: what a command can write, whatever its text says.

The permission policy decides what to ask; this module decides what can happen. A job may write
only beneath the working tree (never into its `.git/`, unless the user allowed git to write its
metadata for the session), in its own temporary directory (TMPDIR), in /dev/shm (POSIX semaphores
and shared memory: Python's multiprocessing needs it, it holds no user files), /dev/null and the
terminal devices. Reads stay open everywhere.

Public API:
    Boundary(root, temp, git_writable)   what one job may write
    Grants                               what the user allowed beyond it (ToolContext.sandbox)
    availability() -> Availability       is there an OS sandbox here, and which (cached per process)
    wrap(argv, boundary) -> list[str]    the argv that runs `argv` inside the boundary
    seatbelt_profile(boundary) -> str    the macOS profile text (sandbox-exec -p)
    refusals(output, cwd, boundary) -> list[Refusal]   paths the output says were refused, that
                                         the boundary forbids (the sandbox's doing, not the file's)
    mentions_refusal(output) -> bool     whether it reports any refusal (for a note without a path)
    handled_rights(abi)                  the Landlock rights, attr size and scopes asked of an ABI
    git_paths(root) -> tuple[str, ...]   the tree's git metadata: its .git and where it points

Linux: Landlock through a small ctypes layer of our own (three syscalls and one prctl). The bindings
on the package index (`landlock` 1.0.0.dev5, `py-landlock` 0.1, `landlockpy` 0.2) are pre-1.0 or
development releases, and what this needs is tiny: ABI detection and path-beneath rules. The rules
are applied by a launcher (this file run as a script with `python -I -S`, so it imports nothing but
the standard library) that execs the shell: the agent's process is multi-threaded, and Python code
between fork and exec (preexec_fn) in a threaded process can deadlock. Landlock's restriction is
inherited by every descendant and cannot be lifted.

Landlock only grants (rights given on a directory hold for everything beneath it), so `.git/`
cannot be carved out of a writable tree by a rule. The launcher therefore first enters a new user
and mount namespace (unprivileged) and bind-mounts the tree's `.git` read-only over itself; Landlock
then forbids the sandboxed processes to mount or unmount anything, so they cannot undo it. Where
user namespaces are not allowed (some distributions switch them off), the tree's top-level entries
other than `.git` get rules one by one instead: everything still works beneath them, but creating
or removing an entry directly in the tree's top directory is then refused (and asked about).
A nested repository's `.git` deeper in the tree is not protected (finding them would mean walking
the tree before every command).

Each job is its own Landlock domain, scoped (ABI 6) so that it cannot signal processes outside it
(the agent, the user's editor, an earlier job: bash_stop stops those) nor reach abstract Unix
sockets. Network access and Unix sockets on the file system (a docker or ssh-agent socket) stay
open: the boundary is about files.

macOS: a Seatbelt profile with the same rules, run through /usr/bin/sandbox-exec.

Diagnostic switch: DS4AGENT_SANDBOX=off makes availability() report no sandbox (tests of the
no-sandbox path); DS4AGENT_SANDBOX=entries skips the mount namespace (tests of the fallback).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import stat
import sys
from dataclasses import dataclass
from functools import cache

SWITCH = "DS4AGENT_SANDBOX"
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
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
_DEVICES = ("/dev/null", "/dev/tty", "/dev/pts")
_SHARED = ("/dev/shm",)


@dataclass(frozen=True)
class Boundary:
    """What one job may write: beneath `root` (but its git metadata only when `git_writable`), and
    beneath `temp`; the Unix sockets it may connect to besides those there (`sockets`, the user's
    allow-list)."""

    root: str
    temp: str
    git_writable: bool = False
    sockets: tuple[str, ...] = ()


@dataclass
class Grants:
    """What the user allowed beyond the boundary, per agent: git metadata for the session, or one
    job outside the sandbox (taken by the next job that starts)."""

    git_writable: bool = False
    git_once: bool = False
    outside_once: bool = False

    def take_outside_once(self) -> bool:
        once, self.outside_once = self.outside_once, False
        return once

    def take_git(self) -> bool:
        """Whether the next job may write git metadata (a one-time grant is used up)."""
        once, self.git_once = self.git_once, False
        return self.git_writable or once


@dataclass(frozen=True)
class Availability:
    available: bool
    kind: str  # "landlock", "seatbelt" or "" (none)
    detail: str  # what it is, or why there is none

    def describe(self) -> str:
        return f"sandbox: {self.detail}"


@dataclass(frozen=True)
class Refusal:
    path: str
    in_git: bool  # the path is git metadata (the user can allow that for the session)


# --------------------------------------------------------------------------------------------------
# Availability and the argv


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (not Linux, not built, switched off)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(abi))


@cache
def availability() -> Availability:
    switch = os.environ.get(SWITCH, "")
    if switch == "off":
        return Availability(False, "", f"none (switched off by {SWITCH}=off)")
    if sys.platform == "darwin":
        if os.access(SANDBOX_EXEC, os.X_OK):
            return Availability(True, "seatbelt", "Seatbelt (sandbox-exec)")
        return Availability(False, "", f"none ({SANDBOX_EXEC} not found)")
    abi = landlock_abi()
    if abi <= 0:
        return Availability(False, "", f"none (no Landlock in this kernel, {os.uname().release})")
    if entries_only():
        how = ".git read-only by rules on the tree's entries; creating entries in the tree's top directory asks"
    else:
        how = ".git read-only through a mount namespace"
    return Availability(True, "landlock", f"Landlock ABI {abi} ({how})")


@cache
def entries_only() -> bool:
    """Whether the tree gets rules per top-level entry (no user namespaces here, or switched so)."""
    if os.environ.get(SWITCH) == "entries":
        return True
    import subprocess

    try:
        probe = subprocess.run([*_launcher(), "--probe"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return probe.returncode != 0


def wrap(argv: list[str], boundary: Boundary) -> list[str]:
    """The argv that runs `argv` inside the boundary (unchanged when there is no sandbox: the
    policy then asks about every command)."""
    avail = availability()
    if avail.kind == "seatbelt":
        return [SANDBOX_EXEC, "-p", seatbelt_profile(boundary), *argv]
    if avail.kind == "landlock":
        root = os.path.realpath(boundary.root)
        spec = {"root": root, "temp": boundary.temp, "git_writable": boundary.git_writable,
                "entries": entries_only(), "git": list(git_paths(root)), "protected": list(agent_code_in(root)),
                "sockets": [os.path.realpath(p) for p in boundary.sockets]}
        return [*_launcher(), json.dumps(spec), "--", *argv]
    return list(argv)


def _own_source() -> str:
    with open(__file__, encoding="utf-8") as f:
        return f.read()


# What runs the launcher, fixed when the agent imports this module, before any job can run: the
# real interpreter (a venv's python is a link to it) and the launcher's text, handed over with -c.
# Run as a file instead, a job that rewrote this file (someone working on a checkout of ds4agent)
# would have the next job start unconfined.
_INTERPRETER, _SOURCE = (os.path.realpath(sys.executable), _own_source()) if __name__ != "__main__" else ("", "")


def _launcher() -> list[str]:
    return [_INTERPRETER, "-I", "-S", "-c", _SOURCE]


@cache
def agent_code() -> tuple[str, ...]:
    """Where the code the agent itself runs outside the sandbox lives: this package, the Python
    environment it was imported from (its site-packages, the `rg` the ripgrep wheel put in its
    bin/) and the interpreter. Where one of them lies inside a working tree (a checkout of
    ds4agent, a project venv holding it), jobs get it read-only like `.git`: otherwise a job could
    rewrite code that the agent runs next, unconfined."""
    import site
    import sysconfig

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sys.prefix, sys.exec_prefix,
             os.path.dirname(_INTERPRETER), sysconfig.get_path("scripts"), *site.getsitepackages()]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if p))


def agent_code_in(root: str) -> tuple[str, ...]:
    """The places of agent_code() that lie inside the tree at `root` (usually none)."""
    root = os.path.realpath(root)
    inside = [p for p in agent_code() if _inside(p, root)]
    # A place inside another is covered by it.
    return tuple(p for p in inside if not any(q != p and _inside(p, q) for q in inside))


def git_paths(root: str) -> tuple[str, ...]:
    """The tree's git metadata: the `.git` of the tree or of the nearest directory above it (a
    directory, or in a linked worktree a file), and for a `.git` file the git directory it names
    and that one's common directory (objects, refs, hooks).

    Read once per tree, the first time a job is about to start there, so before any job could
    change it, and kept: a job that wrote a `.git` file saying `gitdir: /` must not turn the next
    "allow git to write its metadata" into a grant of the whole file system."""
    return _git_paths_of(os.path.realpath(root))


@cache
def _git_paths_of(here: str) -> tuple[str, ...]:
    while True:
        dot_git = os.path.join(here, ".git")
        if os.path.lexists(dot_git):
            break
        parent = os.path.dirname(here)
        if parent == here:
            return ()
        here = parent
    out = [dot_git]
    if os.path.isfile(dot_git) and not os.path.islink(dot_git):
        try:
            with open(dot_git, encoding="utf-8", errors="replace") as f:
                line = f.read(4096).strip()
        except OSError:
            line = ""
        if line.startswith("gitdir:"):
            gitdir = os.path.realpath(os.path.join(here, line[len("gitdir:"):].strip()))
            out.append(gitdir)
            try:
                with open(os.path.join(gitdir, "commondir"), encoding="utf-8", errors="replace") as f:
                    out.append(os.path.realpath(os.path.join(gitdir, f.read(4096).strip())))
            except OSError:
                pass
    return tuple(dict.fromkeys(out))


def _quote_sbpl(path: str) -> str:
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seatbelt_profile(boundary: Boundary) -> str:
    """Everything allowed but writes; writes beneath the tree and the temp dir, minus git metadata.
    Seatbelt sees resolved paths (/private/var/...), so every path is resolved first; a later rule
    wins over an earlier one, so the git denial comes after the tree's allowance."""
    root, temp = os.path.realpath(boundary.root), os.path.realpath(boundary.temp)
    lines = [
        "(version 1)",
        "(allow default)",
        "(deny file-write*)",
        "(allow file-write*",
        f"  (subpath {_quote_sbpl(root)})",
        f"  (subpath {_quote_sbpl(temp)})",
        '  (literal "/dev/null") (literal "/dev/tty") (regex #"^/dev/ttys[0-9]+$") (regex #"^/dev/fd/"))',
    ]
    git = [os.path.realpath(p) for p in git_paths(root)]
    if boundary.git_writable:
        outside = [p for p in git if not _inside(p, root)]
        if outside:
            lines.append("(allow file-write* " + " ".join(f"(subpath {_quote_sbpl(p)})" for p in outside) + ")")
    elif git:
        lines.append("(deny file-write* " + " ".join(f"(subpath {_quote_sbpl(p)})" for p in git) + ")")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Refusals read from a job's output

# "PATH: Permission denied", "cannot create PATH: Permission denied", git's "Unable to create
# 'PATH': ...", Python's "PermissionError: [Errno 13] Permission denied: 'PATH'". Landlock refuses
# with EACCES (EXDEV for a rename it forbids), the read-only .git mount with EROFS.
_QUOTED = re.compile(r"'([^'\n]+)'|\"([^\"\n]+)\"|‘([^’\n]+)’|`([^'`\n]+)'")
_REASONS = r"(?:Permission denied|Operation not permitted|Read-only file system|Invalid cross-device link)"
_DENIED = re.compile(_REASONS)
_WRITE_REFUSED = re.compile(r"(?:Read-only file system|Invalid cross-device link)")
# An unquoted path is taken only right before the reason ("cannot create ../x: Permission denied").
_BARE = re.compile(r"(?:^|\s)([^\s:'\"‘’`]+): " + _REASONS)
_MAX_LINES = 2000


def mentions_refusal(output: str) -> bool:
    """Whether the output reports a refused operation at all (named path or not)."""
    return bool(_DENIED.search(output))


def refusals(output: str, cwd: str, boundary: Boundary) -> list[Refusal]:
    """The paths the output reports refused that the boundary forbids writing (so the sandbox, not
    the file's own permissions, said no). Read from the text: the kernel leaves no other trace an
    unprivileged process can read. A path the boundary allows is never reported.

    With a mount namespace every refused write says "Read-only file system" (or "Invalid
    cross-device link" for a rename), since everything a job may not write is mounted read-only:
    "Permission denied" there is a read the file's own permissions refused, not the sandbox, and
    asking to run the command outside the sandbox would not help."""
    found: dict[str, Refusal] = {}
    root = os.path.realpath(boundary.root)
    git = [os.path.realpath(p) for p in git_paths(root)] if not boundary.git_writable else []
    reasons = _DENIED if entries_only() else _WRITE_REFUSED
    for n, line in enumerate(output.splitlines()):
        if n >= _MAX_LINES:
            break
        if not reasons.search(line):
            continue
        candidates = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(line)]
        # A bare word at the very start of the line is the program reporting ("sh: x: ...").
        candidates += [m.group(1) for m in _BARE.finditer(line) if m.start(1) > 0]
        for text in candidates:
            if text.startswith("[Errno"):
                continue
            try:
                path = os.path.normpath(os.path.join(cwd, os.path.expanduser(text)))
                resolved = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            except (OSError, ValueError):
                continue  # a path this process may not resolve (/proc/N/root of another user's process)
            in_git = any(_inside(resolved, g) or _inside(path, g) for g in git)
            if in_git or not _writable(resolved, boundary, root):
                found.setdefault(path, Refusal(path, in_git))
    return list(found.values())


def _writable(path: str, boundary: Boundary, root: str) -> bool:
    if _inside(path, root):
        # Without a mount namespace, the tree's top directory itself holds no rights.
        return not (entries_only() and os.path.dirname(path) == root)
    if _inside(path, os.path.realpath(boundary.temp)):
        return True
    return any(_inside(path, d) for d in (*_DEVICES, *_SHARED))


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------------
# The launcher (runs in the job's process, single-threaded, before exec)


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
        if not os.path.isdir(real) or any(_inside(real, k) for k in keep_open):
            continue
        if mount(real.encode(), real.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            _fail(f"cannot bind {real}: {os.strerror(ctypes.get_errno())}")
        keep_open.append(real)
    for point, fstype in _mount_points():
        if any(_inside(point, k) for k in keep_open):
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
            if any(_inside(real, r) for r in reachable) or not stat.S_ISSOCK(os.lstat(real).st_mode):
                continue
        except OSError:
            continue  # gone, or in a directory this user cannot see into: unreachable anyway
        if mount(blank.encode(), real.encode(), None, _MS_BIND, None) != 0:
            _fail(f"cannot hide the socket {real}: {os.strerror(ctypes.get_errno())}")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# seccomp: (audit arch, socket's syscall number there); i386 reaches sockets through socketcall.
_SECCOMP_ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
_AUDIT_ARCH_I386, _NR_SOCKETCALL_I386 = 0x40000003, 102
_X32_BIT = 0x40000000
_AF_UNIX = 1


def _refuse_unix_sockets() -> None:
    """Without a mount namespace sockets cannot be hidden one by one: creating a Unix socket is
    refused altogether (EACCES) by a seccomp filter, unless the user allowed sockets (then all stay
    open, as the README says). socketpair() (anonymous, in-process pairs) stays allowed."""
    arch = _SECCOMP_ARCHES.get(os.uname().machine)
    if arch is None:
        return  # no filter written for this architecture: the README names the limit
    audit, nr_socket = arch
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES
    prog = [
        (ld_abs, 0, 0, 4),  # arch
        (jeq, 2, 0, _AUDIT_ARCH_I386),
        (jeq, 3, 0, audit),
        (ret, 0, 0, allow),
        (ld_abs, 0, 0, 0),  # i386: no socketcall at all
        (jeq, 6, 5, _NR_SOCKETCALL_I386),
        (ld_abs, 0, 0, 0),  # native: socket(AF_UNIX, ...) (x32 numbers too)
        (jeq, 1, 0, nr_socket),
        (jeq, 0, 2, nr_socket | _X32_BIT),
        (ld_abs, 0, 0, 16),  # args[0], low word
        (jeq, 1, 0, _AF_UNIX),
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
    ]
    filters = (_SockFilter * len(prog))(*(_SockFilter(*f) for f in prog))
    fprog = _SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        _fail(f"cannot install the socket filter: {os.strerror(ctypes.get_errno())}")


def _apply_landlock(spec: dict) -> None:
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
        allowed += [(p, grant) for p in git if not _inside(p, root)]
    else:
        protected += [p for p in git if _inside(p, root)]
    reachable = [root, os.path.realpath(spec["temp"]), *spec.get("sockets", ())]
    if not spec["entries"] and _enter_mount_namespace(protected):
        allowed.append((root, grant))
        _read_only_elsewhere([path for path, _ in allowed if os.path.isdir(path)] + list(_SHARED))
        _mask_sockets(reachable, os.path.realpath(spec["temp"]))
    else:
        # No mount namespace: rules on everything beside the protected places, one by one.
        allowed += _rules_around(root, protected, grant) if protected else [(root, grant)]
        if not spec.get("sockets"):
            _refuse_unix_sockets()
    for dev in _DEVICES:
        allowed.append((dev, _FS_WRITE_FILE | (fs & _FS_TRUNCATE)))
    allowed += [(p, grant) for p in _SHARED]

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
    if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        _fail(f"cannot enter the Landlock domain: {os.strerror(ctypes.get_errno())}")
    os.close(ruleset)
    _drop_capabilities(libc)


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
            if is_dir and any(_inside(p, entry.path) for p in protected):
                out += _rules_around(entry.path, protected, grant)
            else:
                out.append((entry.path, grant if is_dir else grant & _FILE_RIGHTS))
    return out


def _launch(argv: list[str]) -> None:
    if argv == ["--probe"]:
        os._exit(0 if _enter_mount_namespace([]) else 1)
    if len(argv) < 3 or argv[1] != "--":
        _fail("usage: sandbox.py SPEC -- PROGRAM [ARGS...]")
    try:
        _apply_landlock(json.loads(argv[0]))
    except (OSError, ValueError, KeyError) as exc:
        _fail(f"cannot build the boundary: {exc}")
    try:
        os.execv(argv[2], argv[2:])
    except OSError as exc:
        _fail(f"cannot run {argv[2]}: {os.strerror(exc.errno or errno.ENOENT)}")


if __name__ == "__main__":
    _launch(sys.argv[1:])
