import os
import re
import time
from pathlib import Path

from ds4agent.tools import running_jobs_update

STATUS_DONE = re.compile(r"^bash job=(\d+) pid=(\d+) status=done elapsed_sec=\d+\.\d timed_out=([01])\nexit_status=(\d+)\n")
STATUS_RUNNING = re.compile(r"^bash job=(\d+) pid=(\d+) status=running elapsed_sec=\d+\.\d timeout_sec=(\d+)\n")


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_until(cond, limit=10.0):
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_finished_command_output_and_exit_status(call, ctx):
    r = call("bash", command="echo out; echo err >&2; printf 'no newline'; exit 3")
    m = STATUS_DONE.match(r.text)
    assert m, r.text
    assert m.group(1) == "1" and m.group(3) == "0" and m.group(4) == "3"
    assert r.text[m.end():] == "<output>\nout\nerr\nno newline\n</output>\n"
    assert not r.ok
    d = r.display
    assert (d.command, d.exit_status, d.output_kind, d.running) == (
        "echo out; echo err >&2; printf 'no newline'; exit 3", 3, "full", False)
    assert d.output == "out\nerr\nno newline\n"
    # Done jobs are dropped once observed; ids keep increasing.
    assert call("bash_status", job=1).text == "Tool error: bash job not found: job=1 pid=0\n"
    assert call("bash", command="true").text.startswith("bash job=2 ")


def test_no_output_runs_in_cwd_and_stdin_is_not_a_tty(call, ctx):
    r = call("bash", command="true")
    assert r.text.endswith("exit_status=0\n<output>\n</output>\n")
    r = call("bash", command="pwd; if [ -t 0 ]; then echo tty; else echo notty; fi; cat; echo after-cat")
    assert r.text.endswith(f"<output>\n{ctx.cwd}\nnotty\nafter-cat\n</output>\n")
    if os.path.exists("/proc/self/fd/0"):
        r = call("bash", command="readlink /proc/self/fd/0")
        assert "<output>\n/dev/null\n</output>\n" in r.text


def test_signal_exit_status_is_128_plus_signal(call):
    r = call("bash", command="kill -TERM $$")
    assert STATUS_DONE.match(r.text).group(4) == "143"


def test_large_output_head_then_file(call, ctx):
    r = call("bash", command="seq 1 5000")
    m = STATUS_DONE.match(r.text)
    path = r.display.output_path
    assert Path(path).parent == ctx.output_dir
    full = Path(path).read_bytes()
    assert full == "".join(f"{i}\n" for i in range(1, 5001)).encode()
    expect = (
        f"output_path={path} ({len(full)} bytes, 5000 lines)\n<head -100 {path}>\n"
        + "".join(f"{i}\n" for i in range(1, 101))
        + "</head>\n"
    )
    assert r.text[m.end():] == expect
    assert r.display.output_kind == "head" and r.display.total_lines == 5000


def test_head_is_capped_at_8_kib(call):
    r = call("bash", command="head -c 20000 /dev/zero | tr '\\0' x")
    body = r.text.split("</head>")[0].split(">\n", 1)[1]
    assert "(20000 bytes, 1 lines)" in r.text
    assert body == "x" * 8192 + "\n"


def test_background_job_status_tail_and_stop(call, ctx):
    flag = ctx.cwd / "flag"
    ctx.should_stop = flag.exists  # the wait ends once the output is complete, as on an interrupt
    r = call("bash", command=f"seq 1 3000; echo marker; touch {flag}; sleep 30")
    m = STATUS_RUNNING.match(r.text)
    assert m, r.text
    job, pid = m.group(1), int(m.group(2))
    assert m.group(3) == "3600"
    assert r.text.endswith(
        f"\nUse bash_status job={job} to get info before refresh time; use bash_stop job={job} to stop execution\n"
    )
    assert r.display.running and r.display.exit_status is None
    path = Path(ctx.jobs.find(int(job), None).output_path)
    # Running: the first observation is the head even though nothing was cut.
    assert f"output_path={path} (13900 bytes, 3001 lines)\n<head -100 {path}>\n1\n2\n" in r.text
    assert "\n100\n</head>\n\nUse bash_status" in r.text
    r = call("bash_status", job=job)
    assert STATUS_RUNNING.match(r.text)
    assert f"<tail -4 {path}>\n2998\n2999\n3000\nmarker\n</tail>\n" in r.text
    assert r.display.output_kind == "tail"
    # The pid finds the job when job is 0.
    assert call("bash_status", job=0, pid=pid).text.startswith(f"bash job={job} pid={pid} status=running")
    r = call("bash_stop", job=job)
    m = STATUS_DONE.match(r.text)
    assert m and m.group(3) == "0" and m.group(4) in ("143", "137")
    assert f"<tail -20 {path}>\n" in r.text and r.text.endswith("3000\nmarker\n</tail>\n")
    assert "Use bash_status" not in r.text
    assert not _alive(pid)
    assert call("bash_stop", job=job).text == f"Tool error: bash job not found: job={job} pid=0\n"


def test_first_observation_without_output(call, stop):
    stop.value = True
    r = call("bash", command="sleep 30")
    assert STATUS_RUNNING.match(r.text)
    assert "\n<output>\n</output>\n\nUse bash_status" in r.text
    job = STATUS_RUNNING.match(r.text).group(1)
    call("bash_stop", job=job)


def test_stop_kills_the_whole_process_group(call, ctx, stop):
    stop.value = True
    pidfile = ctx.cwd / "child.pid"
    r = call("bash", command=f"sleep 60 & echo $! > {pidfile}; wait")
    job = STATUS_RUNNING.match(r.text).group(1)
    assert _wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    child = int(pidfile.read_text())
    assert _alive(child)
    call("bash_stop", job=job)
    assert _wait_until(lambda: not _alive(child))


def test_timeout_kills_the_job(call):
    r = call("bash", command="echo started; sleep 30", timeout_sec="1", refresh_sec=20)
    m = STATUS_DONE.match(r.text)
    assert m, r.text
    assert m.group(3) == "1" and m.group(4) == "137"
    assert r.text.endswith("<output>\nstarted\n</output>\n")
    assert r.display.timed_out


def test_interrupt_cuts_the_wait_short(call, ctx, stop):
    marker = ctx.cwd / "go"
    # should_stop becomes true once the command has written its marker; the observation still comes.
    ctx.should_stop = lambda: marker.exists()
    r = call("bash", command=f"touch {marker}; sleep 30", refresh_sec=600)
    assert STATUS_RUNNING.match(r.text)
    assert len(ctx.jobs.running_jobs()) == 1
    update = running_jobs_update(ctx)
    assert update.startswith("Bash job update after context compaction.")
    assert "status=running" in update
    ctx.close()
    assert ctx.jobs.running_jobs() == []


def test_unicode_output_and_empty_command(call):
    r = call("bash", command="printf 'h\\303\\251llo \\346\\227\\245\\n'")
    assert r.text.endswith("<output>\nhéllo 日\n</output>\n")
    assert call("bash", command="  ").text == "Tool error: empty command\n"
    assert call("bash_status", job="x").text == "Tool error: bash job not found: job=0 pid=0\n"


def test_output_file_of_a_fully_shown_job_is_removed_at_once(call, ctx):
    r = call("bash", command="echo hi")
    assert r.text.endswith("<output>\nhi\n</output>\n")
    assert not os.path.exists(r.display.output_path)
    r = call("bash", command="true")
    assert r.display.output_kind == "none" and not os.path.exists(r.display.output_path)
    assert list(ctx.output_dir.iterdir()) == []


def test_output_files_named_to_the_model_are_kept_until_the_agent_exits(call, ctx):
    big = call("bash", command="seq 1 5000").display.output_path
    running = call("bash", command="echo started; exec sleep 60", refresh_sec=1).display.output_path
    assert os.path.exists(big) and os.path.exists(running)
    ctx.close()
    assert list(ctx.output_dir.iterdir()) == []


def test_escape_sequences_a_job_prints_are_shown_escaped_never_sent_to_a_terminal(call):
    """A job printing a screen clear, a window-title OSC, a bell, a lone CR, a C1 CSI and a bidi
    override: the observation and the UI's output hold their escapes; LF and tab stay."""
    r = call("bash", command=r"printf '\033[2J\033]0;pwned\007ok\r\n\tx\rover\302\2331m\342\200\256txt\n'")
    expect = "\\x1b[2J\\x1b]0;pwned\\x07ok\n\tx\\x0dover\\x9b1m\\u202etxt\n"
    assert r.display.output == expect
    assert "<output>\n" + expect + "</output>\n" in r.text
    assert not any(c in r.text + r.display.output for c in "\x1b\x07\r\x9b\u202e")


def test_the_rule_for_terminals_is_one_set_shared_by_job_output_titles_and_the_plain_ui():
    from ds4agent.sessions.titles import display_text
    from ds4agent.ui.fmt import terminal_safe

    hostile = "a\x1b[2J\x07\x9b\u202e\u2066b\tc"
    assert terminal_safe(hostile) == "a\u241b[2J\u2407\ufffd\ufffd\ufffdb\tc"
    assert display_text(hostile.encode()) == "a\ufffd[2J\ufffd\ufffd\ufffd\ufffdb\ufffdc"
