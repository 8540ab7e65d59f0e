"""bash, bash_status, bash_stop: shell commands as background jobs (agent-reference.md §5.1-5.3).

Each call starts a background job (tools/jobs.py: inside the OS sandbox, its own process group,
stdin from /dev/null, stdout+stderr merged into a temp file bounded to its first and last 4 MiB, a
watcher thread enforcing the timeout); this module turns jobs into observations. A finished job's
observation ends with a `sandbox:` line when its output reports writes the sandbox refused (the
paths, in Observation.sandbox_refusals, are what the permission layer asks about).

Output files: an observation that cuts the output names its file (output_path) so the model can read
the rest; such a file is kept until the agent exits (the model may come back to it at any time in
the session, and nothing can tell when it is done with it), then removed with the others. A file
whose whole output was shown (or that stayed empty) was never named to the model: it is removed as
soon as its job's final observation is made. Nothing is left behind in the temp directory.

Observation format (exact, every line ends with "\\n"): a status line (+ exit_status when done),
one body (no output / full output / head / tail), and, while running, a note on bash_status and
bash_stop. The first observation that has output is head-biased (first 100 lines, at most 8 KiB);
later ones are tail-biased (the last 4 lines while running, 20 when done, of the last 32 KiB).
A job is dropped from the table once an observation reported it done.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ds4agent import utf8
from ds4agent.textsafe import escape_controls
from ds4agent.tools.args import arg_float, arg_int, arg_str
from ds4agent.tools.context import ToolContext, temp_dir
from ds4agent.tools.jobs import KEEP_HEAD, Job, JobTable, stop_job, wait_job
from ds4agent.tools.results import BashDisplay, Observation, ToolError
from ds4agent.tools.sandbox import Refusal, mentions_refusal, refusals

HEAD_LINES = 100
HEAD_BYTES = 8 * 1024
TAIL_WINDOW = 32 * 1024
TAIL_LINES_RUNNING = 4
TAIL_LINES_DONE = 20
DEFAULT_TIMEOUT = 3600.0
DEFAULT_REFRESH = 60.0
SCAN_BYTES = 64 * 1024  # how much of each end of a finished job's output is read for refusals

# --------------------------------------------------------------------------------------------------
# Observation text


def _head(path: str) -> tuple[bytes, bool]:
    """First 100 lines, at most 8 KiB; returns (bytes, cut)."""
    with open(path, "rb") as f:
        data = f.read(HEAD_BYTES + 1)
    lines = data.split(b"\n")
    if len(lines) > HEAD_LINES + 1 or (len(lines) == HEAD_LINES + 1 and lines[-1] != b""):
        picked = b"\n".join(lines[:HEAD_LINES]) + b"\n"
        return utf8.cut(picked, HEAD_BYTES), True
    if len(data) > HEAD_BYTES:
        return utf8.cut(data, HEAD_BYTES), True
    return data, False


def _tail(path: str, size: int, n: int) -> bytes:
    with open(path, "rb") as f:
        start = max(0, size - TAIL_WINDOW)
        f.seek(start)
        data = f.read(TAIL_WINDOW)
    if start > 0:
        # The window's first line is partial; drop it (there is a whole line after it, or nothing).
        nl = data.find(b"\n")
        if nl >= 0 and nl + 1 < len(data):
            data = data[nl + 1 :]
    lines = data.split(b"\n")
    trailing_nl = data.endswith(b"\n")
    if trailing_nl:
        lines = lines[:-1]
    picked = lines[-n:]
    out = b"\n".join(picked)
    return out + b"\n" if trailing_nl and picked else out


def _out(data: bytes) -> str:
    # What a job prints reaches terminals (the UI, headless stderr) as well as the model: its control
    # characters (escape sequences, a lone CR overwriting a line, C1, bidi controls) are shown as
    # their escapes, `\x1b[2J`, never acted on (textsafe.py holds the rule).
    text = escape_controls(data.decode("utf-8", errors="replace"))
    return text if text.endswith("\n") or not text else text + "\n"


def observe(job: Job, table: JobTable) -> Observation:
    """The next observation of a job; drops it from the table when it reports the job done."""
    running = job.running
    elapsed = job.elapsed()
    if running:
        status = (
            f"bash job={job.id} pid={job.pid} status=running elapsed_sec={elapsed:.1f} "
            f"timeout_sec={job.timeout:.0f}\n"
        )
    else:
        status = (
            f"bash job={job.id} pid={job.pid} status=done elapsed_sec={elapsed:.1f} "
            f"timed_out={1 if job.timed_out else 0}\nexit_status={job.exit_status}\n"
        )
    job.output.flush()
    size, total_lines = job.output.total, job.output.lines
    if size == 0:
        body, shown, kind = "<output>\n</output>\n", "", "none"
    else:
        kept = f"; the file keeps the first and last {KEEP_HEAD >> 20} MiB" if job.output.dropped else ""
        where = f"output_path={job.output_path} ({size} bytes, {total_lines} lines{kept})\n"
        if not job.head_shown:
            job.head_shown = True
            data, cut = _head(job.output_path)
            shown = _out(data)
            if not running and not cut:
                body, kind = "<output>\n" + shown + "</output>\n", "full"
            else:
                body, kind = where + f"<head -{HEAD_LINES} {job.output_path}>\n" + shown + "</head>\n", "head"
                job.path_shown = True
        else:
            n = TAIL_LINES_RUNNING if running else TAIL_LINES_DONE
            shown = _out(_tail(job.output_path, _file_size(job.output_path), n))
            body, kind = where + f"<tail -{n} {job.output_path}>\n" + shown + "</tail>\n", "tail"
            job.path_shown = True
    note = ""
    refused: tuple[Refusal, ...] = ()
    if running:
        note = (
            f"\nUse bash_status job={job.id} to get info before refresh time; "
            f"use bash_stop job={job.id} to stop execution\n"
        )
    else:
        note, refused = _sandbox_note(job)
        table.drop(job)
        table.remove_temp(job)
        if not job.path_shown:
            table.remove_output(job.output_path)  # all of it was shown; the model never saw its name
    display = BashDisplay(
        command=job.command,
        job=job.id,
        pid=job.pid,
        running=running,
        exit_status=job.exit_status,
        timed_out=job.timed_out,
        output=shown,
        output_kind=kind,
        output_path=job.output_path,
        total_bytes=size,
        total_lines=total_lines,
        duration=elapsed,
    )
    ok = running or (job.exit_status == 0 and not job.timed_out)
    return Observation(status + body + note, ok=ok, display=display, sandbox_refusals=refused)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _sandbox_note(job: Job) -> tuple[str, tuple[Refusal, ...]]:
    """What the sandbox refused, read from the start and the end of the output (the paths it names
    that the boundary forbids), and the note saying so."""
    if job.boundary is None:
        return "", ()
    size = _file_size(job.output_path)
    try:
        with open(job.output_path, "rb") as f:
            text = f.read(SCAN_BYTES)
            if size > 2 * SCAN_BYTES:
                f.seek(size - SCAN_BYTES)
                text += b"\n" + f.read(SCAN_BYTES)
            elif size > SCAN_BYTES:
                text += f.read()
    except OSError:
        return "", ()
    output = text.decode("utf-8", errors="replace")
    found = tuple(refusals(output, job.cwd, job.boundary))
    if not found:
        if job.exit_status and mentions_refusal(output):
            # A refusal whose path the output does not name (or names relative to a directory the
            # command moved to): say what the boundary is, without claiming it was the cause.
            return ("sandbox: commands run in an OS sandbox that lets them write only inside the working "
                    "directory (not .git/) and their temp directory (TMPDIR); a refusal above may come "
                    "from it\n"), ()
        return "", ()
    shown = ", ".join(escape_controls(r.path) for r in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    why = ("git metadata (.git/) is read-only for commands unless the user allows it"
           if all(r.in_git for r in found) else
           "commands may write only inside the working directory and their temp directory (TMPDIR)")
    return f"sandbox: the OS sandbox refused writing to {shown}: {why}\n", found


# --------------------------------------------------------------------------------------------------
# Tools


def _job_args(args: Mapping[str, Any]) -> tuple[int, int]:
    return arg_int(args, "job", 0) or 0, arg_int(args, "pid", 0) or 0


def _find(args: Mapping[str, Any], ctx: ToolContext) -> Job:
    job_id, pid = _job_args(args)
    job = ctx.jobs.find(job_id if job_id > 0 else None, pid if job_id <= 0 else None)
    if job is None:
        raise ToolError(f"bash job not found: job={job_id} pid={pid}")
    return job


# bash_status and bash_stop name a job the same way (job, or pid when job is 0).
_JOB_SCHEMA = {
    "type": "object",
    "properties": {
        "job": {"type": "integer", "description": "job number from the bash result"},
        "pid": {"type": "integer", "description": "process id, used only when job is 0"},
    },
    "required": ["job"],
}


class BashTool:
    name = "bash"
    description = (
        "Run a shell command with /bin/sh in the working directory (stdin is empty, stdout and stderr "
        "are merged). Waits up to refresh_sec; a command still running then keeps going in the "
        "background as a job you can check with bash_status or end with bash_stop. Long output is "
        "shown as head or tail lines; the full output stays in the file named by output_path."
    )
    schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "shell command line"},
            "timeout_sec": {"type": "number", "description": "kill the command after this many seconds (default 3600)"},
            "refresh_sec": {"type": "number", "description": "seconds to wait before returning (default 60)"},
        },
        "required": ["command"],
    }
    mutates = True

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        command = arg_str(args, "command", required=True) or ""
        if not command.strip():
            raise ToolError("empty command")
        timeout = arg_float(args, "timeout_sec", DEFAULT_TIMEOUT, 1.0, 86400.0)
        refresh = arg_float(args, "refresh_sec", DEFAULT_REFRESH, 1.0, 3600.0)
        job = ctx.jobs.start(command, str(ctx.cwd), timeout, temp_dir(ctx), str(ctx.cwd), ctx.sandbox, ctx.sockets)
        wait_job(job, refresh, ctx.should_stop)
        return observe(job, ctx.jobs)


class BashStatusTool:
    name = "bash_status"
    description = (
        "Report on a background bash job right away (no waiting): status, exit status when done, and "
        "the latest output lines."
    )
    schema = _JOB_SCHEMA
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        return observe(_find(args, ctx), ctx.jobs)


class BashStopTool:
    name = "bash_stop"
    description = (
        "Stop a background bash job and everything it started (SIGTERM, then SIGKILL after 1 s) "
        "and return its final output."
    )
    schema = _JOB_SCHEMA
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        job = _find(args, ctx)
        refresh = arg_float(args, "refresh_sec", DEFAULT_REFRESH, 1.0, 3600.0)
        stop_job(job, refresh)
        result = observe(job, ctx.jobs)
        ctx.jobs.drop(job)
        return result


def running_jobs_update(ctx: ToolContext) -> str | None:
    """After compaction: one text re-announcing every running job (None when there is none)."""
    jobs = ctx.jobs.running_jobs()
    if not jobs:
        return None
    parts = ["Bash job update after context compaction. These jobs are still running:\n"]
    for job in jobs:
        parts.append("\n" + observe(job, ctx.jobs).text)
    return "".join(parts)
