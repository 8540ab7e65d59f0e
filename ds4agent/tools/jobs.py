"""Background shell jobs: start, watch, wait, stop (the processes behind bash, bash_status, bash_stop).

Each job is a fresh `/bin/sh -c` in its own session/process group (so a stop or timeout kills the
whole pipeline, grandchildren included), stdin from /dev/null (never the terminal: a command that
reads stdin sees EOF instead of stealing the user's keystrokes), stdout+stderr merged into a temp
file. A watcher thread per job reaps the child and enforces the timeout even while nobody is
waiting on the job.

Output files stay in the table until remove_output/remove_outputs; tools/bash.py decides when
(see its docstring).

    Job, JobTable            one job; the agent's jobs by id
    wait_job(job, s, stop)   wait up to s seconds, ending early when stop() is true
    stop_job(job, refresh)   SIGTERM, a grace period, SIGKILL
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

POLL_SEC = 0.1
STOP_GRACE_SEC = 1.0
STOP_STEP_SEC = 0.02

# Pagers and credential prompts would wait forever on a stdin that is /dev/null; make them not ask.
_QUIET_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"}


@dataclass
class Job:
    id: int
    command: str
    proc: subprocess.Popen
    output_path: str
    timeout: float
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
        self.ended = time.monotonic()
        self.done_event.set()


class JobTable:
    """The agent's bash jobs by id (ids increase and are never reused within one agent)."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}
        self._next = 1
        self._outputs: set[str] = set()  # output files not removed yet (see the module docstring)
        self._lock = threading.Lock()

    def start(self, command: str, cwd: str, timeout: float, out_dir: str) -> Job:
        fd, path = tempfile.mkstemp(prefix="ds4agent-bash-", suffix=".log", dir=out_dir)
        try:
            env = {**os.environ, **_QUIET_ENV}
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        with self._lock:
            job = Job(id=self._next, command=command, proc=proc, output_path=path, timeout=timeout)
            self._next += 1
            self._jobs[job.id] = job
            self._outputs.add(path)
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
        for job in self.all_jobs():
            if job.running:
                stop_job(job, refresh=2.0)

    def remove_output(self, path: str) -> None:
        with self._lock:
            self._outputs.discard(path)
        try:
            os.unlink(path)
        except OSError:
            pass  # already gone (the user cleaned up): nothing to do

    def remove_outputs(self) -> None:
        """At exit, after stop_all: every output file still kept."""
        with self._lock:
            paths = sorted(self._outputs)
        for path in paths:
            self.remove_output(path)


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
