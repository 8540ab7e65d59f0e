"""Bash jobs on hostile input: the output file bounded on disk, counters instead of rescans,
processes that leave the group still stopped, the shell scan linear and interruptible."""

from __future__ import annotations

import os
import subprocess
import time

from ds4agent.tools import ToolContext, jobs, run_tool
from ds4agent.tools.jobs import DROPPED_NOTE, KEEP_HEAD, KEEP_TAIL, OutputFile, tagged_processes
from ds4agent.tools.permissions import MAX_SCANNED_COMMAND, PermissionPolicy
from ds4agent.tools.shellscan import scan


def test_output_file_keeps_head_and_tail_with_a_note(tmp_path):
    path = tmp_path / "out.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    out = OutputFile(fd)
    chunk = b"".join(b"%07d\n" % i for i in range(8192))  # 64 KiB, numbered lines
    n = (KEEP_HEAD + KEEP_TAIL) // len(chunk) + 40
    for _ in range(n):
        out.feed(chunk)
    out.feed(b"last line without newline")
    out.close()
    data = path.read_bytes()
    assert out.dropped and out.total == n * len(chunk) + 25
    assert out.lines == n * 8192 + 1
    assert len(data) == KEEP_HEAD + len(DROPPED_NOTE) + KEEP_TAIL
    assert data[:KEEP_HEAD] == (chunk * (KEEP_HEAD // len(chunk) + 1))[:KEEP_HEAD]
    assert data[KEEP_HEAD:KEEP_HEAD + len(DROPPED_NOTE)] == DROPPED_NOTE
    assert data.endswith(chunk * 3 + b"last line without newline")


def test_a_small_output_is_written_whole(tmp_path):
    path = tmp_path / "out.log"
    out = OutputFile(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    out.feed(b"a\nb")
    out.close()
    assert path.read_bytes() == b"a\nb" and out.lines == 2 and not out.dropped


def test_a_flood_of_output_stays_bounded_through_the_tool(tmp_path):
    ctx = ToolContext(cwd=tmp_path, output_dir=tmp_path)
    result = run_tool("bash", {"command": "head -c 20000000 /dev/zero | tr '\\0' 'x' | fold -w 99"}, ctx)
    assert "exit_status=0" in result.text
    assert "(20202020 bytes, 202021 lines; the file keeps the first and last 4 MiB)" in result.text
    assert result.display.total_bytes == 20202020  # fold added a newline per 99 bytes
    assert os.path.getsize(result.display.output_path) == KEEP_HEAD + len(DROPPED_NOTE) + KEEP_TAIL
    ctx.close()


def test_bash_status_does_not_rescan_the_file(tmp_path, monkeypatch):
    ctx = ToolContext(cwd=tmp_path, output_dir=tmp_path)
    first = run_tool("bash", {"command": "seq 1 50000; sleep 30", "refresh_sec": 1}, ctx)
    assert "status=running" in first.text
    reads = []
    real_open = open

    def counting_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        reads.append(path)
        return f

    monkeypatch.setattr("builtins.open", counting_open)
    status = run_tool("bash_status", {"job": first.display.job}, ctx)
    monkeypatch.undo()
    assert "(288894 bytes, 50000 lines)" in status.text and "50000\n" in status.text
    assert reads.count(first.display.output_path) <= 1  # one tail window, never a scan of it all
    run_tool("bash_stop", {"job": first.display.job}, ctx)
    ctx.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _wait_for(pred, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_setsid_processes_are_stopped_by_bash_stop_and_at_exit(tmp_path):
    ctx = ToolContext(cwd=tmp_path, output_dir=tmp_path)
    res = run_tool("bash", {"command": "setsid sleep 300 & echo started; sleep 300", "refresh_sec": 1}, ctx)
    job = ctx.jobs.find(res.display.job, None)
    assert _wait_for(lambda: len(tagged_processes(job.tag)) >= 3)  # the launcher's shell, sleep, setsid sleep
    escaped = [p for p in tagged_processes(job.tag) if os.getpgid(p) != job.pid]
    assert escaped  # it really left the group
    run_tool("bash_stop", {"job": res.display.job}, ctx)
    assert _wait_for(lambda: not any(_alive(p) for p in escaped))
    # A job that ended normally but left a setsid process behind: stopped at exit.
    res = run_tool("bash", {"command": "setsid sleep 300 > /dev/null 2>&1 & echo ok"}, ctx)
    assert "exit_status=0" in res.text
    leftovers = [p for t in ctx.jobs.tags() for p in tagged_processes(t)]
    assert leftovers
    ctx.close()
    assert _wait_for(lambda: not any(_alive(p) for p in leftovers))


def test_a_process_met_in_the_middle_of_an_exec_is_read_again(tmp_path, monkeypatch):
    """An exec leaves a process's environment empty for a moment; a scan that met it then still
    finds the process (a stop at that moment would otherwise miss it for good)."""
    ctx = ToolContext(cwd=tmp_path, output_dir=tmp_path)
    run_tool("bash", {"command": "setsid sleep 300 > /dev/null 2>&1 & echo ok"}, ctx)
    (tag,) = ctx.jobs.tags()
    assert _wait_for(lambda: len(tagged_processes(tag)) == 1)
    (pid,) = tagged_processes(tag)
    real = jobs._environ
    reads = []

    def mid_exec(p):
        if p == pid:
            reads.append(p)
            if len(reads) <= 2:
                return b""  # what /proc/<pid>/environ reads during an exec
        return real(p)

    monkeypatch.setattr(jobs, "_environ", mid_exec)
    assert tagged_processes(tag) == [pid] and len(reads) == 3
    monkeypatch.undo()
    ctx.close()
    assert _wait_for(lambda: not _alive(pid))


def test_no_tags_find_no_processes_without_scanning(monkeypatch):
    """The agent's exit asks for the processes of every job it ran; with none it must neither
    scan /proc nor match anything (an empty needle list would match nothing, but the scan of
    every process's environment would still cost a read per pid)."""
    def no_scan(path):
        raise AssertionError(f"scanned {path}")

    monkeypatch.setattr(jobs.os, "listdir", no_scan)
    assert tagged_processes() == []


def test_zombies_and_running_processes_are_told_apart(tmp_path):
    child = subprocess.Popen(["true"])
    assert _wait_for(lambda: jobs._never_has_environment(child.pid))  # exited, not yet reaped
    assert not jobs._never_has_environment(os.getpid())
    child.wait()


def test_setsid_process_stopped_at_timeout(tmp_path):
    ctx = ToolContext(cwd=tmp_path, output_dir=tmp_path)
    res = run_tool("bash", {"command": "setsid sleep 300 & sleep 300", "timeout_sec": 1, "refresh_sec": 20}, ctx)
    assert "timed_out=1" in res.text
    job_tags = list(ctx.jobs.tags())
    assert _wait_for(lambda: not any(tagged_processes(t) for t in job_tags))
    ctx.close()


def test_scan_never_recurses_on_deep_or_wide_input():
    """Thousands of brace groups or parentheses, a huge sed program: an answer, never a
    RecursionError (bench/shellscan.py measures that the work grows linearly)."""
    root = os.getcwd()
    braces = scan("echo " + "{a,b}" * 5000, root)
    assert braces is not None and braces.programs == ("echo",)
    assert scan("(" * 20000 + "echo" + ")" * 20000, root).programs == ("echo",)
    assert scan("sed '" + "w/" * 3000 + "' f", root) is None  # too long to read: opaque, so it asks
    assert scan("a;" * 30000, root).programs == ("a",)
    wide = scan("echo x > {" + ",".join(["ok"] * 200 + ["../out"]) + "}", root)
    assert wide is not None and wide.risky_writes[0].endswith("(too many brace alternatives to check)")
    deep = scan("echo x > " + "{a,b}" * 5000, root)
    assert deep is not None and deep.risky_writes[0].endswith("(too many brace alternatives to check)")
    assert scan("echo x > {a,../b}", root).risky_writes == ("{a,../b} (outside the working directory)",)


def test_scan_stops_when_interrupted():
    calls = []

    def stop() -> bool:
        calls.append(1)
        return True

    assert scan("echo a; " * 8000, os.getcwd(), stop) is None
    assert calls


def test_a_command_over_64_kib_is_asked_about_unread(tmp_path):
    policy = PermissionPolicy("ask", allowed_programs={"echo"})
    command = "echo " + "a" * MAX_SCANNED_COMMAND
    decision = policy.check("bash", {"command": command}, ToolContext(cwd=tmp_path))
    assert decision.kind == "ask" and decision.question.session_label is None
    assert "too long to read" in decision.question.title
    assert policy.check("bash", {"command": "echo a"}, ToolContext(cwd=tmp_path)).kind == "allow"
