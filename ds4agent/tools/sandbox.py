"""The OS boundary every bash job runs inside: what a command can write, whatever its text says.

The permission policy decides what to ask; this module decides what can happen. A job may write
only beneath the working tree (never into its `.git/`, unless the user allowed git to write its
metadata for the session), in its own temporary directory (TMPDIR), in /dev/shm (POSIX semaphores
and shared memory: Python's multiprocessing needs it, it holds no user files; with a mount namespace
a private tmpfs per job), /dev/null and the terminal devices. Reads stay open everywhere.

Public API:
    Boundary(root, temp, git_writable)   what one job may write
    Grants                               what the user allowed beyond it (ToolContext.sandbox)
    availability() -> Availability       is there an OS sandbox here, and which (cached per process)
    wrap(argv, boundary) -> list[str]    the argv that runs `argv` inside the boundary
    seatbelt_profile(boundary) -> str    the macOS profile text (sandbox-exec -p)
    refusals(output, cwd, boundary) -> list[Refusal]   paths the output says were refused, that
                                         the boundary forbids (the sandbox's doing, not the file's)
    mentions_refusal(output) -> bool     whether it reports a refusal naming no path (for a note)
    handled_rights(abi)                  the Landlock rights, attr size and scopes asked of an ABI
    git_paths(root) -> tuple[str, ...]   the tree's git metadata: its .git and where it points

Linux: Landlock through a small ctypes layer of our own (three syscalls and one prctl). The bindings
on the package index (`landlock` 1.0.0.dev5, `py-landlock` 0.1, `landlockpy` 0.2) are pre-1.0 or
development releases, and what this needs is tiny: ABI detection and path-beneath rules. The rules
are applied by a launcher (launcher.py and seccomp.py, their text read when this module is imported
and run with `python -I -S -c`, so it imports nothing but the standard library) that execs the
shell: the agent's process is multi-threaded, and Python code between fork and exec (preexec_fn)
in a threaded process can deadlock. Landlock's restriction is inherited by every descendant and
cannot be lifted. Landlock has no right for metadata (chmod, chown, utimes, xattrs): in the mount
namespace every mount but the writable places is read-only, and without one a seccomp supervisor
answers those calls (seccomp.py). Both modes run under the seccomp filter (io_uring refused,
foreign ABIs killed).

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
sockets. Bound Unix sockets outside the tree are hidden in the mount namespace (without one,
creating Unix sockets is refused by the seccomp filter) unless the user allowed them; the network
stays open: the boundary is about files.

macOS: a Seatbelt profile with the same rules, run through /usr/bin/sandbox-exec.

Diagnostic switch: DS4AGENT_SANDBOX=off makes availability() report no sandbox (tests of the
no-sandbox path); DS4AGENT_SANDBOX=entries skips the mount namespace (tests of the fallback).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from functools import cache

from ds4agent.tools.launcher import DEVICES, LAUNCH_FAILED, SHARED, handled_rights, inside, landlock_abi

__all__ = ["LAUNCH_FAILED", "Availability", "Boundary", "Grants", "Refusal", "agent_code", "agent_code_in",
           "availability", "entries_only", "git_paths", "handled_rights", "landlock_abi", "mentions_refusal",
           "refusals", "seatbelt_profile", "wrap"]

SWITCH = "DS4AGENT_SANDBOX"
SANDBOX_EXEC = "/usr/bin/sandbox-exec"


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


def _launcher_source() -> str:
    """The launcher as one script for `python -c`: seccomp.py and launcher.py (read from beside this
    file) made modules under their own names, then launcher.main(argv)."""
    here = os.path.dirname(os.path.abspath(__file__))
    texts = []
    for name in ("seccomp", "launcher"):
        with open(os.path.join(here, f"{name}.py"), encoding="utf-8") as f:
            texts.append((f"ds4agent.tools.{name}", f.read()))
    return ("import sys, types\n"
            "for p in ('ds4agent', 'ds4agent.tools'):\n"
            "    sys.modules[p] = types.ModuleType(p)\n"
            "def load(name, text):\n"
            "    m = sys.modules[name] = types.ModuleType(name)\n"
            "    exec(compile(text, name, 'exec'), m.__dict__)\n"
            "    setattr(sys.modules['ds4agent.tools'], name.rpartition('.')[2], m)\n"
            "    return m\n"
            + "".join(f"m = load({name!r}, {text!r})\n" for name, text in texts)
            + "m.main(sys.argv[1:])\n")


# What runs the launcher, fixed when the agent imports this module, before any job can run: the
# real interpreter (a venv's python is a link to it) and the launcher's text, handed over with -c.
# Run as files instead, a job that rewrote them (someone working on a checkout of ds4agent) would
# have the next job start unconfined.
_INTERPRETER, _SOURCE = os.path.realpath(sys.executable), _launcher_source()


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
    found = [p for p in agent_code() if inside(p, root)]
    # A place inside another is covered by it.
    return tuple(p for p in found if not any(q != p and inside(p, q) for q in found))


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
        outside = [p for p in git if not inside(p, root)]
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
    """Whether the output reports an operation the sandbox may have refused without naming a path
    (a note then says what the boundary is): with a mount namespace only EROFS and EXDEV can be its
    doing (see refusals); a line that names its path is refusals()' to judge."""
    reasons = _DENIED if entries_only() else _WRITE_REFUSED
    return any(reasons.search(line) and not _candidates(line) for line in output.splitlines()[:_MAX_LINES])


def _candidates(line: str) -> list[str]:
    """The paths a refusal line names: quoted, or bare right before the reason."""
    found = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(line)]
    # A bare word at the very start of the line is the program reporting ("sh: x: ...").
    found += [m.group(1) for m in _BARE.finditer(line) if m.start(1) > 0]
    return [text for text in found if not text.startswith("[Errno")]


def refusals(output: str, cwd: str, boundary: Boundary) -> list[Refusal]:
    """The paths the output reports refused that the boundary forbids writing (so the sandbox, not
    the file's own permissions, said no). Read from the text: the kernel leaves no other trace an
    unprivileged process can read. A path the boundary allows is never reported.

    With a mount namespace every refused write says "Read-only file system" (or "Invalid
    cross-device link" for a rename), since everything a job may not write is mounted read-only:
    "Permission denied" there is a read the file's own permissions refused, not the sandbox, and
    asking to run the command outside the sandbox would not help. Without one, Landlock's EACCES
    reads like a read the file's mode refused: such a line counts only where the file's own mode
    would have let this user write it (so the sandbox is what said no), and never under /proc."""
    found: dict[str, Refusal] = {}
    root = os.path.realpath(boundary.root)
    git = [os.path.realpath(p) for p in git_paths(root)] if not boundary.git_writable else []
    reasons = _DENIED if entries_only() else _WRITE_REFUSED
    for n, line in enumerate(output.splitlines()):
        if n >= _MAX_LINES:
            break
        if not reasons.search(line):
            continue
        for text in _candidates(line):
            try:
                path = os.path.normpath(os.path.join(cwd, os.path.expanduser(text)))
                resolved = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            except (OSError, ValueError):
                continue  # a path this process may not resolve (/proc/N/root of another user's process)
            in_git = any(inside(resolved, g) or inside(path, g) for g in git)
            if not in_git and (_writable(resolved, boundary, root) or reasons is _DENIED
                               and not _WRITE_REFUSED.search(line) and not _mode_allows_write(resolved)):
                continue
            found.setdefault(path, Refusal(path, in_git))
    return list(found.values())


def _mode_allows_write(path: str) -> bool:
    """Whether the file's own mode lets this user write it (create it, when it is absent), leaving
    capabilities aside as a job has none. /proc is never the user's files."""
    if inside(path, "/proc"):
        return False
    need = 0o2
    try:
        st = os.stat(path)
    except FileNotFoundError:
        need = 0o3
        try:
            st = os.stat(os.path.dirname(path))
        except OSError:
            return False
    except OSError:
        return False
    if st.st_uid == os.geteuid():
        bits = st.st_mode >> 6
    elif st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & need == need


def _writable(path: str, boundary: Boundary, root: str) -> bool:
    if inside(path, root):
        # Without a mount namespace, the tree's top directory itself holds no rights.
        return not (entries_only() and os.path.dirname(path) == root)
    if inside(path, os.path.realpath(boundary.temp)):
        return True
    return any(inside(path, d) for d in (*DEVICES, *SHARED))
