"""Metadata outside the tree and in .git/ (modes, owners, times, extended attributes) through the
public tools API with the real sandbox, in both of its Linux modes: with a mount namespace (read-only
mounts refuse) and without one (DS4AGENT_SANDBOX=entries: the seccomp supervisor refuses). Each
variant must change nothing outside the tree or in .git/, while the same calls in the tree work.
Also: the seccomp filter both modes share (io_uring refused, foreign ABIs killed)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

from ds4agent.tools import ToolContext, run_tool, sandbox

pytestmark = pytest.mark.skipif(sandbox.availability().kind != "landlock", reason="Landlock (Linux) only")

MODES = ["namespace", "entries"]


def _meta(root: Path) -> dict[str, tuple]:
    """Every entry beneath root (root included): mode, owner, mtime, ctime, xattrs, content hash."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st = os.lstat(p)
        try:
            attrs = sorted((a, os.getxattr(p, a, follow_symlinks=False)) for a in os.listxattr(p, follow_symlinks=False))
        except OSError:
            attrs = []
        body = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns, attrs, body)
    return out


@pytest.fixture(params=MODES)
def place(request, tmp_path: Path, monkeypatch):
    if request.param == "entries":
        monkeypatch.setenv(sandbox.SWITCH, "entries")
    else:
        monkeypatch.delenv(sandbox.SWITCH, raising=False)
    sandbox.availability.cache_clear()
    sandbox.entries_only.cache_clear()
    work, outside = tmp_path / "tree", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "existing").write_text("keep me\n")
    os.setxattr(outside / "existing", "user.keep", b"1")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    os.setxattr(work / ".git" / "config", "user.keep", b"1")
    (work / "sub").mkdir()
    (work / "sub" / "mine").write_text("x\n")
    os.symlink("../../outside/existing", work / "sub" / "link")
    logs = tmp_path / "logs"
    logs.mkdir()
    ctx = ToolContext(cwd=work, output_dir=logs)
    before = _meta(outside), _meta(work / ".git")
    yield ctx, work, outside
    ctx.close()
    sandbox.availability.cache_clear()
    sandbox.entries_only.cache_clear()
    assert _meta(outside) == before[0], "metadata changed outside the tree"
    assert _meta(work / ".git") == before[1], "metadata changed in .git/"


def _bash(ctx: ToolContext, command: str) -> str:
    return run_tool("bash", {"command": command, "refresh_sec": 60}, ctx).text


def _py(code: str) -> str:
    return "python3 -c " + "'" + code.replace("'", "'\"'\"'") + "'"


OWN_LISTENER = """\
import ctypes, fcntl, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class I(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(I))]
code = [(0x20, 0, 0, 0), (0x15, 2, 0, 90), (0x15, 1, 0, 268), (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x7FC00000)]
prog = P(len(code), (I * len(code))(*(I(*c) for c in code)))
libc.prctl(38, 1, 0, 0, 0)
fd = libc.syscall(317, 1, 8, ctypes.byref(prog))
print("own listener", fd, ctypes.get_errno(), flush=True)
if fd < 0:
    sys.exit(0)
pid = os.fork()
if pid == 0:
    try:
        os.chmod(sys.argv[1], 0o777); print("chmod returned", flush=True)
    except OSError as e:
        print("chmod refused", e.errno, flush=True)
    os._exit(0)
buf = bytearray(80)
fcntl.ioctl(fd, 0xC0502100, buf, True)
nid = struct.unpack_from("=Q", buf)[0]
fcntl.ioctl(fd, 0xC0182101, bytearray(struct.pack("=QqiI", nid, 0, 0, 1)), True)  # CONTINUE
os.waitpid(pid, 0)
"""

# Each tries to change metadata outside the tree or in .git/; the fixture checks nothing changed.
VARIANTS = {
    "coreutils": "chmod 4777 ../outside/existing; chmod 700 ../outside; chgrp 0 ../outside/existing;"
                 " touch -d 2001-01-01 ../outside/existing; touch -m -d 2002-01-01 ../outside; touch -a ../outside/existing",
    "through-in-tree-symlink": "chmod 777 sub/link; touch -d 2001-01-01 sub/link; chmod 777 sub/link/",
    "symlink-itself-nofollow": "touch -h -d 2001-01-01 sub/link && chown -h 0:0 sub/link && echo inside-ok",
    "git-metadata": "chmod 777 .git .git/config .git/HEAD; touch -d 2001-01-01 .git/HEAD .git; chmod -R g+w .git",
    "python-os": _py("import os\n"
                     "for f in (lambda: os.chmod('../outside/existing', 0o4777), lambda: os.utime('../outside', (1, 1)),\n"
                     "          lambda: os.chmod('../outside/existing', 0o777, follow_symlinks=False),\n"
                     "          lambda: os.utime('../outside/existing', ns=(1, 1), follow_symlinks=False),\n"
                     "          lambda: os.chown('../outside/existing', os.getuid(), os.getgid()),\n"
                     "          lambda: os.setxattr('../outside/existing', 'user.new', b'1'),\n"
                     "          lambda: os.removexattr('../outside/existing', 'user.keep'),\n"
                     "          lambda: os.removexattr('.git/config', 'user.keep'),\n"
                     "          lambda: os.setxattr('sub/link', 'user.new', b'1')):\n"
                     "    try: f()\n"
                     "    except OSError as e: print('refused', e.errno)\n"),
    "descriptors-and-proc": _py("import os\n"
                                "fd = os.open('../outside/existing', os.O_RDONLY)\n"
                                "d = os.open('../outside', os.O_RDONLY)\n"
                                "g = os.open('.git/config', os.O_RDONLY)\n"
                                "for f in (lambda: os.fchmod(fd, 0o777), lambda: os.utime(fd, (1, 1)),\n"
                                "          lambda: os.fchown(fd, os.getuid(), os.getgid()), lambda: os.setxattr(fd, 'user.n', b'1'),\n"
                                "          lambda: os.removexattr(g, 'user.keep'), lambda: os.fchmod(g, 0o777),\n"
                                "          lambda: os.chmod('/proc/self/fd/%d' % fd, 0o777),\n"
                                "          lambda: os.chmod('/dev/fd/%d' % fd, 0o777),\n"
                                "          lambda: os.chmod('/proc/thread-self/fd/%d' % fd, 0o777),\n"
                                "          lambda: os.chmod('existing', 0o777, dir_fd=d),\n"
                                "          lambda: os.utime('existing', ns=(1, 1), dir_fd=d),\n"
                                "          lambda: os.chmod('/proc/%d/root%s' % (os.getpid(), os.path.realpath('../outside/existing')), 0o777)):\n"
                                "    try: f()\n"
                                "    except OSError as e: print('refused', e.errno)\n"),
    "links-and-exchange": ("ln ../outside/existing sub/hard && chmod 777 sub/hard; ln .git/config sub/cfg && chmod 777 sub/cfg; "
                           + _py("import ctypes, os\n"
                                 "libc = ctypes.CDLL(None, use_errno=True)\n"
                                 "print('exchange', libc.renameat2(-100, b'sub/mine', -100, b'../outside/existing', 2))\n"
                                 "print('exchange', libc.renameat2(-100, b'sub/mine', -100, b'.git/HEAD', 2))\n")
                           + "; chmod 777 sub/mine"),
    "chattr": "chattr +d ../outside/existing; chattr +A .git/config",
    "symlinks-into-git": ("ln -s ../.git/config sub/gl; ln -s ../.git sub/gd; chmod 777 sub/gl sub/gd; touch -d 2001-01-01"
                          " sub/gl sub/gd/HEAD; mv .git sub/moved; chmod 700 sub/gd/; "
                          + _py("import os\nos.setxattr('sub/gl', 'user.x', b'1')")),
    "threads-and-children": _py("import os, threading\n"
                                "def go():\n"
                                "    try: os.chmod('../outside/existing', 0o777)\n"
                                "    except OSError as e: print('refused', e.errno)\n"
                                "ts = [threading.Thread(target=go) for _ in range(4)]\n"
                                "[t.start() for t in ts]; [t.join() for t in ts]\n"
                                "if os.fork() == 0:\n"
                                "    go(); os._exit(0)\n"
                                "os.wait()\n"),
    # A listener of its own answering CONTINUE would take the notification before the supervisor's
    # (the newest filter's listener gets it): the kernel allows one listener per filter chain (EBUSY).
    "own-seccomp-listener": _py(OWN_LISTENER) + " ../outside/existing",
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_metadata_variants_change_nothing_outside_or_in_git(place, name):
    ctx, work, outside = place
    _bash(ctx, VARIANTS[name])


def test_the_same_calls_in_the_tree_work(place):
    ctx, work, outside = place
    text = _bash(ctx, "chmod +x sub/mine && chmod 700 sub && touch -d 2001-01-01 sub/mine && mkdir -p sub/a/b"
                      " && touch -h -d 2002-01-01 sub/link && chown -h $(id -u) sub/link && "
                      + _py("import os\n"
                            "os.setxattr('sub/mine', 'user.t', b'1'); os.removexattr('sub/mine', 'user.t')\n"
                            "fd = os.open('sub/mine', os.O_RDONLY); os.fchmod(fd, 0o751); os.utime(fd, (5, 5))\n"
                            "os.chmod('/proc/self/fd/%d' % fd, 0o755)\n"
                            "os.utime(os.environ['TMPDIR'], (7, 7)); print('ok')\n"))
    assert "ok" in text, text
    mine = (work / "sub" / "mine").stat()
    assert (mine.st_mode & 0o777, mine.st_mtime) == (0o755, 5)
    assert os.lstat(work / "sub" / "link").st_mtime < 10**9 + 10**8
    assert (work / "sub" / "a" / "b").is_dir()


def test_a_refused_metadata_call_is_named_to_the_model(place):
    ctx, work, outside = place
    text = _bash(ctx, "chmod 777 ../outside/existing")
    assert "Read-only file system" in text
    assert "sandbox: the OS sandbox refused writing to" in text and str(outside / "existing") in text


def test_io_uring_is_refused(place):
    ctx, work, outside = place
    text = _bash(ctx, _py("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(120)\n"
                          "for nr in (425, 426, 427):\n"
                          "    r = libc.syscall(nr, 8, buf, 0, 0, 0)\n"
                          "    print(nr, r, ctypes.get_errno())\n"))
    assert "425 -1 1\n426 -1 1\n427 -1 1\n" in text, text  # EPERM


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386 and x32 calls exist on x86_64 only")
@pytest.mark.parametrize("code", ["b8 14 00 00 00 cd 80 c3",  # mov eax, 20 (i386 getpid); int 0x80; ret
                                  "b8 27 00 00 40 0f 05 c3"])  # mov eax, 0x40000027 (x32 getpid); syscall; ret
def test_a_foreign_abi_kills_the_job(place, code):
    ctx, work, outside = place
    text = _bash(ctx, _py("import ctypes, mmap\n"
                          "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
                          f"m.write(bytes.fromhex('{code}'))\n"
                          "f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
                          "print('returned', f())\n") + "; echo status=$?")
    assert "status=159" in text and "returned" not in text, text  # 128 + SIGSYS


def test_a_read_refused_by_a_files_mode_or_proc_is_no_sandbox_refusal(place):
    """A read the file's own mode refuses, or a /proc/N/root path, is not the sandbox's doing: no
    refusal named, no question to run the command outside, no tool error."""
    ctx, work, outside = place
    secret = work.parent / "secrets" / "secret"
    secret.parent.mkdir()
    secret.write_text("s")
    secret.chmod(0)
    os.chown(secret, 65534, 65534)  # another user's file: unreadable without capabilities
    result = run_tool("bash", {"command": f"cat {secret}; ls /proc/1/root/ > /dev/null; cat /proc/1/root/etc/shadow;"
                                          " exit 1", "refresh_sec": 60}, ctx)
    assert "Permission denied" in result.text
    assert list(result.sandbox_refusals) == [], result.sandbox_refusals
    assert "Tool error" not in result.text and "sandbox:" not in result.text


def test_dev_shm_itself_keeps_its_metadata(place):
    """What is in /dev/shm is the job's to change, not the machine-wide directory itself: with a
    namespace the job gets a /dev/shm of its own, without one the supervisor refuses the directory."""
    ctx, work, outside = place
    before = os.stat("/dev/shm")
    text = _bash(ctx, "f=/dev/shm/ds4agent-test-$$; echo x > $f && chmod 600 $f && touch -d @978307200 $f"
                      " && stat -c %a:%Y $f; rm -f $f; touch -d @978307200 /dev/shm")
    after = os.stat("/dev/shm")  # its mtime moves as entries come and go, never to 2001
    assert after.st_mode == before.st_mode and after.st_mtime > 978307200 + 10**8
    assert "600:978307200" in text, text


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # dead, not yet reaped
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("place", ["entries"], indirect=True)
def test_a_job_dies_with_its_supervisor(place, tmp_path):
    """SIGKILL to the process the agent started (the supervisor, without a namespace) ends the job
    too: none is left running with nobody to answer its metadata calls or to stop it."""
    from tests.support.timeouts import within

    ctx, work, outside = place
    temp = tmp_path / "jobtemp"
    temp.mkdir()
    argv = sandbox.wrap(["/bin/sh", "-c", "echo $$ > sub/pid; exec sleep 60"], sandbox.Boundary(str(work), str(temp)))
    proc = subprocess.Popen(argv, cwd=work, start_new_session=True)
    with within(20):
        while not (work / "sub" / "pid").exists() or not (work / "sub" / "pid").read_text().strip():
            time.sleep(0.01)  # polling, bounded by within()
        job = int((work / "sub" / "pid").read_text())
        assert job != proc.pid  # the job is the supervisor's child
        os.kill(proc.pid, 9)
        proc.wait()
        while not _gone(job):
            time.sleep(0.01)
