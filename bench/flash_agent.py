"""The interactive agent at the real DS4 Flash shape, end to end as a user runs it.

    .venv/bin/python bench/flash_agent.py [--model FILE]

Too slow for CI on a 2-core CPU (each Flash-shape token costs seconds, each start loads ~9 GiB), so
this script runs, one process at a time and at ctx 32768:

1. plain mode: a turn, /save (then `kv verify` on the file), /new, /load with no prefill, a second
   turn, then kill -9 mid-session;
2. the next start offers the crash journal; "y" resumes it (the turns before the crash replayed);
3. the TUI in tmux: the model's load progress, then idle, then /quit.

The system prompt's KV comes from the cache, as on a user's second start (tests/flash/stage.py:
prefilling its ~2,160 tokens at this shape takes minutes here, over an hour on the exact path).
Without --model it writes the Flash-shape test file to a temporary directory and removes it
afterwards. Prints each step with its time; exits 1 on the first failure.
"""

from __future__ import annotations

import argparse
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.flash.conftest import DS4AGENT, flash_env  # noqa: E402
from tests.flash.stage import seed_sysprompt_cache  # noqa: E402

CTX = "32768"
T0 = time.monotonic()


def step(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {text}", flush=True)


class Lines:
    """A child process's stdout, read line by line on a thread (so waits can time out)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.q.put(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            for line in self.seen:
                m = rx.search(line)
                if m:
                    self.seen.remove(line)
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r}; got:\n{''.join(self.seen)}")
            try:
                self.seen.append(self.q.get(timeout=left))
            except queue.Empty:
                continue

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()


def agent_args(model: Path, kv: Path, trace: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--ctx", CTX, "--kv-dir", str(kv), "--nothink", "--tokens", "1",
            "--seed", "3", "--trace", str(trace), *extra]


def prefills(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"prefill (\d+) tokens", text)]


def plain_save_load_crash_resume(model: Path, tmp: Path) -> None:
    work, kv, trace = tmp / "work", tmp / "kv", tmp / "trace.txt"
    work.mkdir()
    args = agent_args(model, kv, trace, "--plain")
    seed_sysprompt_cache(args, work, kv)
    env = flash_env(tmp)
    proc = subprocess.Popen([*DS4AGENT, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=work, env=env)
    out = Lines(proc)
    try:
        out.send("hi")
        out.wait_for(r"token limit|token cap|generation stopped", timeout=1800)
        step("plain: first turn answered")
        out.send("/save")
        sid = out.wait_for(r"saved session ([0-9a-f]{8})", timeout=900).group(1)
        verify = subprocess.run([*DS4AGENT, "kv", "verify", "--kv-dir", str(kv)], capture_output=True, text=True,
                                timeout=600)
        assert verify.returncode == 0 and sid in verify.stdout, verify.stdout + verify.stderr
        step(f"plain: /save wrote {sid}; kv verify accepts it")
        out.send("/new")
        out.wait_for(r"new session|started a new|new conversation", timeout=600)
        mark = len(trace.read_text())
        out.send(f"/load {sid}")
        out.wait_for(rf"switched to session {sid}", timeout=600)
        assert not prefills(trace.read_text()[mark:]), "a /load computed tokens"
        step("plain: /new, then /load with 0 tokens prefilled")
        out.send("and now?")
        out.wait_for(r"token limit|token cap|generation stopped", timeout=1800)
        assert max(prefills(trace.read_text()[mark:])) < 20
        step("plain: second turn answered after the load (only its own tokens prefilled)")
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash after the second turn: the journal must keep it
        proc.wait(timeout=60)
    step("plain: killed with SIGKILL")
    resumed = subprocess.run([*DS4AGENT, *args], input="y\n/quit\nn\n", capture_output=True, text=True,
                             cwd=work, env=env, timeout=3600)
    assert "Traceback" not in resumed.stdout + resumed.stderr, resumed.stderr
    m = re.search(r"resumed the unsaved session \((\d+) tokens, (\d+) prefilled\)", resumed.stdout)
    assert m, resumed.stdout + resumed.stderr
    assert "and now?" in resumed.stdout  # the replayed turns include the one before the crash
    step(f"crash resume: {m.group(1)} tokens restored, {m.group(2)} prefilled")


def tui_load_progress(model: Path, tmp: Path) -> None:
    from tests.ui.test_tmux import Tmux, _status_line

    work, kv = tmp / "tui", tmp / "kv-tui"
    work.mkdir()
    args = agent_args(model, kv, tmp / "trace-tui.txt")
    seed_sysprompt_cache(args, work, kv)
    tmux = Tmux(flash_env(tmp))
    cmd = " ".join([f"cd {work} &&", *DS4AGENT, *args, "; echo EXITED-$?; sleep 30"])
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", cmd)
        tmux.run("resize-window", "-t", "app", "-x", "120", "-y", "30")
        seen = tmux.wait_for(lambda s: re.search(r"loading model… ?\d+%", s) is not None, "load progress",
                             timeout=600)
        step("TUI: load progress shown: " + _status_line(seen))
        tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "model loaded and idle", timeout=1800)
        step("TUI: idle")
        tmux.type("/quit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0", timeout=300)
        step("TUI: /quit, exit 0")
    finally:
        tmux.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ds4flash-agent-"))
    try:
        model = args.model
        if model is None:
            model = tmp / "flash-q2.gguf"
            subprocess.run([*DS4AGENT, "make-test-model", str(model), "--config", "flash"], check=True,
                           stdout=subprocess.DEVNULL)
            step("wrote the Flash-shape test file")
        plain_save_load_crash_resume(model, tmp)
        if shutil.which("tmux"):
            tui_load_progress(model, tmp)
        else:
            step("TUI: skipped, tmux is not installed")
    except AssertionError as err:
        step(f"FAILED: {err}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    step("all steps passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
