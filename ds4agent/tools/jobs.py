"""Background shell jobs: start, watch, wait, stop (the processes behind bash, bash_status, bash_stop).

Each job is a fresh `/bin/sh -c` inside the OS sandbox (tools/sandbox.py) in its own
session/process group, stdin from /dev/null (never the terminal: a command that reads stdin sees
EOF instead of stealing the user's keystrokes), stdout+stderr merged into a pipe that a copier
thread writes to a temp file, bounded on disk: past 8 MiB the file keeps the first and the last
4 MiB with a note where the middle was dropped; the copier counts bytes and lines as they pass, so
an observation never rescans the file. A watcher thread per job reaps the child and enforces the
timeout even while nobody is waiting on the job. Each job has its own temp directory (TMPDIR).

Stopping reaches processes that left the group (setsid, double fork): every job's environment
carries a tag (DS4AGENT_JOB) that its descendants inherit, and a stop, a timeout and the agent's
exit signal every process whose environment holds it, besides the group. (A cgroup would be exact,
but an unprivileged process can create one only under a delegated cgroup v2 tree, which most
machines, this one included, do not give it.) A process that drops its environment (env -i) and
leaves the group escapes this; the sandbox still bounds what it can write.

Output files stay in the table until remove_output/remove_outputs; tools/bash.py decides when
(see its docstring).

    Job, JobTable            one job; the agent's jobs by id
    wait_job(job, s, stop)   wait up to s seconds, ending early when stop() is true
    stop_job(job, refresh)   SIGTERM, a grace period, SIGKILL
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ds4agent.tools.sandbox import Boundary, Grants, availability, wrap
from ds4agent.tools.sandbox_settings import job_environment

POLL_SEC = 0.1
STOP_GRACE_SEC = 1.0
STOP_STEP_SEC = 0.02
KEEP_HEAD = 4 << 20  # an output file keeps its first and last 4 MiB
KEEP_TAIL = 4 << 20
TAIL_FLUSH_SEC = 0.2  # a dropped-middle file's tail is rewritten at most this often while running
DRAIN_SEC = 1.0  # after the shell exits, how long to wait for output still in the pipe
JOB_TAG = "DS4AGENT_JOB"
DROPPED_NOTE = (b"\n[ds4agent: the output passed 8 MiB; its middle was dropped here, "
                b"the last 4 MiB follow]\n")

# Pagers and credential prompts would wait forever on a stdin that is /dev/null; make them not ask.
_QUIET_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"}


class OutputFile:
    """A job's output file, bounded: the first KEEP_HEAD bytes, then (once the output passes
    KEEP_HEAD + KEEP_TAIL) DROPPED_NOTE and the last KEEP_TAIL bytes. Counts every byte and line."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._tail = bytearray()  # the last KEEP_TAIL bytes, once the middle is being dropped
        self._written = 0  # bytes in the file before any drop
        self._flushed_at = 0.0
        self._dirty = False
        self.total = 0
        self.newlines = 0
        self.last_byte = b"\n"
        self.dropped = False
        self.failed = False  # a write failed (disk full): the file keeps what it had

    @property
    def lines(self) -> int:
        """Lines so far (a last line without LF counts)."""
        return self.newlines + (0 if self.last_byte == b"\n" else 1)

    def feed(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            self.newlines += data.count(b"\n")
            self.last_byte = data[-1:]
            if self.failed:
                return  # the disk refused earlier: keep counting, keep the job's pipe flowing
            try:
                self._store(data)
            except OSError:
                self.failed = True

    def _store(self, data: bytes) -> None:
        if not self.dropped:
            if self._written + len(data) <= KEEP_HEAD + KEEP_TAIL:
                _write_all(self._fd, data)
                self._written += len(data)
                return
            # Past the bound: keep the head in place, move what followed it into the tail.
            self._tail = bytearray(os.pread(self._fd, self._written - KEEP_HEAD, KEEP_HEAD))
            self.dropped = True
        self._tail += data
        if len(self._tail) > KEEP_TAIL:
            del self._tail[: len(self._tail) - KEEP_TAIL]
        self._dirty = True
        if time.monotonic() - self._flushed_at >= TAIL_FLUSH_SEC:
            self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._dirty or self.failed:
            return
        os.ftruncate(self._fd, KEEP_HEAD)
        os.lseek(self._fd, KEEP_HEAD, os.SEEK_SET)
        _write_all(self._fd, DROPPED_NOTE + bytes(self._tail))
        self._dirty = False
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        with self._lock:
            self._flush()
            os.close(self._fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy(read_fd: int, out: OutputFile) -> None:
    try:
        while chunk := os.read(read_fd, 1 << 16):
            out.feed(chunk)
    finally:
        os.close(read_fd)
        try:
            out.close()
        except OSError:
            pass  # the last flush failed (disk full): the file keeps what it has


# A process in the middle of an exec reads as an empty environment for a moment (the kernel has
# installed its new memory but not yet copied the environment into it: `setsid sleep` does this
# twice). A scan that met such a pid reads it again after a pause, or a stop at that moment would
# miss the process for good. Kernel threads and zombies, always empty, are not read again.
EXEC_REREADS = 5
EXEC_REREAD_PAUSE_SEC = 0.004
_KERNEL_THREAD_FLAG = 0x00200000  # PF_KTHREAD in /proc/<pid>/stat's flags


def _environ(pid: int) -> bytes | None:
    """The environment block of `pid`, None when it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _never_has_environment(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError):
        return True  # gone
    return fields[0] == b"Z" or int(fields[6]) & _KERNEL_THREAD_FLAG != 0


def tagged_processes(*tags: str) -> list[int]:
    """Pids whose environment carries JOB_TAG=<one of tags> (readable ones: our own uid's)."""
    needles = [f"\0{JOB_TAG}={tag}\0".encode() for tag in tags]
    pids: list[int] = []
    if not needles:
        return pids  # no job ran: nothing to look for
    try:
        names = os.listdir("/proc")
    except OSError:
        return []

    def holds_tag(data: bytes) -> bool:
        block = b"\0" + data + b"\0"
        return any(needle in block for needle in needles)

    execing = []
    for name in names:
        if not name.isdigit():
            continue
        data = _environ(int(name))
        if data == b"":
            execing.append(int(name))
        elif data is not None and holds_tag(data):
            pids.append(int(name))
    execing = [pid for pid in execing if not _never_has_environment(pid)]
    for _ in range(EXEC_REREADS):
        if not execing:
            break
        time.sleep(EXEC_REREAD_PAUSE_SEC)
        still = []
        for pid in execing:
            data = _environ(pid)
            if data == b"":
                still.append(pid)
            elif data is not None and holds_tag(data):
                pids.append(pid)
        execing = still
    return pids


def signal_tagged(tags: list[str], sig: int) -> None:
    """`sig` to every process that carries one of `tags`, found in one scan."""
    for pid in tagged_processes(*tags):
        if pid != os.getpid():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


@dataclass
class Job:
    id: int
    command: str
    proc: subprocess.Popen
    output_path: str
    timeout: float
    output: OutputFile
    tag: str
    temp: str
    cwd: str
    boundary: Boundary | None  # None: it ran outside the sandbox (no sandbox here, or allowed once)
    copier: threading.Thread | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    exit_status: int | None = None
    timed_out: bool = False
    head_shown: bool = False
    path_shown: bool = False  # an observation named output_path to the model
    done_event: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return not self.done_event.is_set()

    def elapsed(self) -> float:
        end = self.ended if self.ended is not None else time.monotonic()
        return max(0.0, end - self.started)

    def kill_group(self, sig: int) -> None:
        # The child is a session leader: its pgid is its pid. Killing the group reaches the whole
        # pipeline; the pid itself is signalled too in case it left the group.
        for target in (lambda: os.killpg(self.pid, sig), lambda: os.kill(self.pid, sig)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        signal_tagged([self.tag], sig)  # the ones that left the group

    def _on_timeout(self) -> None:
        if self.running:
            self.timed_out = True
            self.kill_group(signal.SIGKILL)

    def watch(self) -> None:
        # A blocking wait (no polling) reaps the child; a timer enforces the timeout meanwhile, so
        # it holds even while nobody is observing the job.
        timer = threading.Timer(self.timeout, self._on_timeout)
        timer.daemon = True
        timer.start()
        try:
            code = self.proc.wait()
        finally:
            timer.cancel()
        # Shell convention: a child killed by signal N reports 128+N.
        self.exit_status = 128 - code if code < 0 else code
        if self.copier is not None:
            # Output still in the pipe; a background process that kept the pipe open would hold
            # it for ever, so the wait is bounded.
            self.copier.join(DRAIN_SEC)
        self.output.flush()
        self.ended = time.monotonic()
        self.done_event.set()


class JobTable:
    """The agent's bash jobs by id (ids increase and are never reused within one agent)."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}
        self._next = 1
        self._outputs: set[str] = set()  # output files not removed yet (see the module docstring)
        self._tags: list[str] = []  # every job's tag: stragglers are stopped at exit
        self._temps: set[str] = set()
        self._lock = threading.Lock()

    def start(self, command: str, cwd: str, timeout: float, out_dir: str, root: str,
              grants: Grants | None = None, sockets: tuple[str, ...] = ()) -> Job:
        """Start `command` in `cwd` inside the sandbox around `root` (outside it only when the
        grants hold a one-time permission for it); `sockets`: the Unix sockets outside the tree
        the user allowed jobs to reach."""
        grants = grants if grants is not None else Grants()
        fd, path = tempfile.mkstemp(prefix="ds4agent-bash-", suffix=".log", dir=out_dir)
        temp = tempfile.mkdtemp(prefix="ds4agent-job-", dir=out_dir)
        tag = secrets.token_hex(8)
        argv = ["/bin/sh", "-c", command]
        boundary = None
        git = grants.take_git()
        if availability().available and not grants.take_outside_once():
            boundary = Boundary(os.path.realpath(root), temp, git, sockets)
            argv = wrap(argv, boundary)
        read_fd, write_fd = os.pipe()
        try:
            env = {**job_environment(os.environ, sockets), **_QUIET_ENV, "TMPDIR": temp, JOB_TAG: tag}
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            for f in (fd, read_fd):
                os.close(f)
            os.unlink(path)
            shutil.rmtree(temp, ignore_errors=True)
            raise
        finally:
            os.close(write_fd)
        output = OutputFile(fd)
        with self._lock:
            job = Job(id=self._next, command=command, proc=proc, output_path=path, timeout=timeout,
                      output=output, tag=tag, temp=temp, cwd=cwd, boundary=boundary)
            self._next += 1
            self._jobs[job.id] = job
            self._outputs.add(path)
            self._tags.append(tag)
            self._temps.add(temp)
        job.copier = threading.Thread(target=_copy, args=(read_fd, output), name=f"bash-out-{job.id}",
                                      daemon=True)
        job.copier.start()
        threading.Thread(target=job.watch, name=f"bash-job-{job.id}", daemon=True).start()
        return job

    def find(self, job_id: int | None, pid: int | None) -> Job | None:
        with self._lock:
            if job_id is not None and job_id > 0:
                return self._jobs.get(job_id)
            if pid is not None and pid > 0:
                return next((j for j in self._jobs.values() if j.pid == pid), None)
        return None

    def drop(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)

    def running_jobs(self) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if j.running]

    def all_jobs(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def stop_all(self) -> None:
        """At exit: every running job, then whatever any job left running in the background."""
        for job in self.all_jobs():
            if job.running:
                stop_job(job, refresh=2.0)
        with self._lock:
            tags = list(self._tags)
        signal_tagged(tags, signal.SIGKILL)

    def remove_output(self, path: str) -> None:
        with self._lock:
            self._outputs.discard(path)
        try:
            os.unlink(path)
        except OSError:
            pass  # already gone (the user cleaned up): nothing to do

    def tags(self) -> list[str]:
        """Every job's environment tag, finished jobs included."""
        with self._lock:
            return list(self._tags)

    def remove_temp(self, job: Job) -> None:
        """After a job's final observation: its temp directory (a background process it left
        running loses it: TMPDIR belongs to the job)."""
        with self._lock:
            self._temps.discard(job.temp)
        shutil.rmtree(job.temp, ignore_errors=True)

    def remove_outputs(self) -> None:
        """At exit, after stop_all: every output file still kept."""
        with self._lock:
            paths = sorted(self._outputs)
            temps, self._temps = sorted(self._temps), set()
        for path in paths:
            self.remove_output(path)
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)


def wait_job(job: Job, seconds: float, should_stop: Callable[[], bool]) -> None:
    """Wait up to `seconds` for the job, polling every 100 ms so an interrupt ends the wait promptly."""
    deadline = time.monotonic() + seconds
    while job.running and not should_stop():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        job.done_event.wait(min(POLL_SEC, left))


def stop_job(job: Job, refresh: float) -> None:
    """SIGTERM the group, up to 1 s of grace in 20 ms steps, then SIGKILL; wait up to `refresh` to reap."""
    if not job.running:
        return
    job.kill_group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SEC
    while job.running and time.monotonic() < deadline:
        job.done_event.wait(STOP_STEP_SEC)
    if job.running:
        job.kill_group(signal.SIGKILL)
        job.done_event.wait(refresh)
