"""End to end as a person would: `ds4agent --model tiny.gguf` in a real terminal (tmux), a typed
prompt, the answer and the status bar, then /quit with the save question. Plus `ds4agent` with its
stdout piped, which must fall back to the plain line mode.

Needs the `tmux` binary for the first test (skipped with the reason when it is missing: CI images
install it, see the UI report); the model is the tiny random test model the engine room builds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

READ_PAUSE_S = 1.0  # longer than the app's typeahead grace: a key after it answers a question


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), TERM="xterm-256color", DS4AGENT_HISTORY=str(tmp_path / "history.json"),
               XDG_DATA_HOME=str(home / ".local/share"), XDG_STATE_HOME=str(home / ".local/state"))
    for name in ("DS4AGENT_MODEL", "COLUMNS", "LINES"):  # Textual would trust stale COLUMNS/LINES
        env.pop(name, None)
    env.pop("DS4AGENT_KV_DIR", None)
    return env


class Tmux:
    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"ds4ui-{uuid.uuid4().hex[:8]}"
        self.env = env

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, capture_output=True, text=True,
                              check=True).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "app")

    def wait_for(self, cond, what: str, timeout: float = 90.0) -> str:
        """The screen once `cond` holds on two captures in a row, the later one returned: tmux
        takes a frame from the app's terminal in pieces, and under load a capture can fall between
        them (a frame's first rows new, its last ones old), which the next capture completes."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                time.sleep(0.05)
                text = self.screen()
                if cond(text):
                    return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{text}")
            time.sleep(0.2)

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "app", "-l", text)

    def key(self, name: str) -> None:
        self.run("send-keys", "-t", "app", name)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True)


def _status_line(screen: str) -> str:
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_tui_in_tmux_prompt_answer_status_and_quit(tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    tmux = Tmux(_env(tmp_path))
    command = (f"cd {work} && {sys.executable} -m ds4agent.cli --model {tiny_model} --ctx 4096 --tokens 24 "
               f"--kv-dir {tmp_path / 'kv'} --seed 7; echo EXITED-$?; sleep 30")
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", command)
        # Some tmux versions size a detached session from `default-size` (80x24) regardless of -x/-y.
        tmux.run("resize-window", "-t", "app", "-x", "120", "-y", "30")
        # Both ends of the first frame: a capture can fall between the writes of one frame.
        tmux.wait_for(lambda s: "ds4agent ─" in s and "Ask ds4agent…" in s, "first paint", timeout=30)
        tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "model loaded and idle")
        tmux.type("say hi")
        tmux.wait_for(lambda s: "say hi" in s, "the typed prompt", timeout=30)
        tmux.key("Enter")
        screen = tmux.wait_for(lambda s: "› say hi" in s and _status_line(s).startswith("idle")
                               and "unsaved ●" in s, "the answer")
        # the random tiny model thinks until the 24-token cap: the block collapses with its count
        assert "Thought for" in screen or "token limit" in screen
        status = _status_line(screen)
        assert "ctx " in status and "/4.1k" in status and "unsaved ●" in status
        # the round's decode speed (absent only if the model stopped before its first token)
        assert "decode" in status or "generation stopped" in screen
        tmux.type("/quit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "Save current session?" in s, "save question")
        time.sleep(READ_PAUSE_S)  # a person reads the question: keys typed at once go to the editor
        tmux.key("n")
        tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0")
    finally:
        tmux.kill()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_lines_typed_on_after_a_command_that_asks_do_not_answer_the_question(tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    tmux = Tmux(_env(tmp_path))
    command = (f"cd {work} && {sys.executable} -m ds4agent.cli --model {tiny_model} --ctx 4096 --tokens 8 "
               f"--kv-dir {tmp_path / 'kv'} --seed 7 --nothink; echo EXITED-$?; sleep 30")
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", command)
        tmux.run("resize-window", "-t", "app", "-x", "120", "-y", "30")
        tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "model loaded and idle")
        tmux.type("say hi\r")
        tmux.wait_for(lambda s: "› say hi" in s and _status_line(s).startswith("idle")
                      and "unsaved ●" in _status_line(s), "the answer")
        tmux.type("/save\r")
        screen = tmux.wait_for(lambda s: "saved session " in s and "saved ✓" in _status_line(s), "saved")
        saved = re.search(r"saved session ([0-9a-f]{8})", screen).group(1)
        tmux.type("more\r")
        tmux.wait_for(lambda s: "› more" in s and _status_line(s).startswith("idle")
                      and "unsaved ●" in _status_line(s), "the second answer")
        # A typist who goes on: /load opens "Save current session? [y] [n] [c]" while the next
        # lines are still being typed (a key every 0.1 s); their n and c must not answer it.
        tmux.type(f"/load {saved}\r")
        for ch in "/list\rnice catch\r":
            tmux.type(ch)
            time.sleep(0.1)
        screen = tmux.wait_for(lambda s: "Save current session?" in s and "saved sessions in" in s,
                               "the question, and /list ran")
        time.sleep(READ_PAUSE_S)
        assert "Save current session?" in tmux.screen()  # not answered by the typing
        tmux.key("Escape")  # Esc = cancel: stay in this session
        screen = tmux.wait_for(lambda s: "› nice catch" in s and _status_line(s).startswith("idle"),
                               "the queued message ran after the question")
        assert "Save current session?" not in screen and "loaded session" not in screen
        assert "unsaved ●" in _status_line(screen)
    finally:
        tmux.kill()


def test_piped_stdout_runs_the_plain_mode(tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "ds4agent.cli", "--model", str(tiny_model), "--ctx", "4096", "--tokens", "8",
         "--kv-dir", str(tmp_path / "kv"), "--seed", "7", "--nothink"],
        input="say hi\n/bogus\n/list\n", capture_output=True, text=True, cwd=work, env=_env(tmp_path), timeout=180,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "› say hi" in out
    assert "unknown command: /bogus" in out
    assert f"saved sessions in {tmp_path / 'kv'}:" in out
    assert "Traceback" not in out + r.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_plain_mode_in_tmux_prompt_status_line_and_quit(tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    tmux = Tmux(_env(tmp_path))
    command = (f"cd {work} && {sys.executable} -m ds4agent.cli --plain --model {tiny_model} --ctx 4096 "
               f"--tokens 16 --kv-dir {tmp_path / 'kv'} --seed 7; echo EXITED-$?; sleep 30")
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", command)
        tmux.run("resize-window", "-t", "app", "-x", "120", "-y", "30")
        tmux.wait_for(lambda s: "ds4agent>" in s and _status_line(s).startswith("idle"), "prompt and idle status")
        tmux.type("say hi")
        tmux.key("Enter")
        screen = tmux.wait_for(lambda s: "› say hi" in s and _status_line(s).startswith("idle")
                               and "unsaved" in _status_line(s), "the answer")
        assert "ctx 2" in _status_line(screen)  # the system prompt alone is ~2k tokens
        assert screen.count("say hi") == 1  # echoed once (the prompt line is erased when sent)
        tmux.type("/save")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "saved session " in s and "saved ✓" in _status_line(s), "saved")
        # /load typed right after /new waits for the switch instead of being refused as busy.
        tmux.type("/new")
        tmux.key("Enter")
        tmux.type("/load")
        tmux.key("Enter")
        screen = tmux.wait_for(lambda s: "saved sessions in" in s, "the /load listing")
        assert "requires the model to be idle" not in screen
        assert "› /new\n" in screen and "› /load\n" in screen
        tmux.type("again")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "› again" in s and _status_line(s).startswith("idle")
                      and "unsaved" in _status_line(s), "the second answer")
        tmux.type("/quit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "Save current session?" in s, "save question")
        tmux.type("n")
        tmux.key("Enter")
        screen = tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0")
        assert "Save current session? (y = save, n = don't save, c = cancel) n\nnot saved\nEXITED-0" in screen
    finally:
        tmux.kill()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_subagent_card_runs_stops_on_ctrl_c_and_unfolds_at_80x24(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    tmux = Tmux({**_env(tmp_path), "PYTHONPATH": str(repo)})
    command = f"cd {repo} && {sys.executable} -m tests.ui.subagent_app {tmp_path}; echo EXITED-$?; sleep 30"
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "80", "-y", "24", command)
        tmux.run("resize-window", "-t", "app", "-x", "80", "-y", "24")
        tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "idle", timeout=60)
        tmux.type("survey it")
        tmux.key("Enter")
        # the card running, its live tail showing what the subagent writes
        tmux.wait_for(lambda s: "subagent · survey the parser module" in s and "running ·" in s
                      and any("│" in line and "working" in line for line in s.splitlines()),
                      "the subagent card running")
        tmux.key("C-c")
        stopped = tmux.wait_for(lambda s: "stopped ·" in s and _status_line(s).startswith("idle"),
                                "the subagent stopped by Ctrl+C")
        assert "Subagent interrupted" in stopped
        tmux.type("where is parse?")
        tmux.key("Enter")
        done = tmux.wait_for(lambda s: "It is in a.py." in s and _status_line(s).startswith("idle"), "the answer")
        assert "find where parse is defined" in done and "done ·" in done
        assert "parse is defined in a.py line 3." in done  # the folded card shows its summary
        assert all(len(line) <= 80 for line in done.splitlines())
        tmux.key("C-o")  # the last card: the subagent's, unfolded with its transcript
        unfolded = tmux.wait_for(lambda s: "⏺ read" in s and "▾" in s and "⎿ 1 import os" in s,
                                 "the unfolded transcript")
        assert _status_line(unfolded).startswith("idle")  # the status bar is still on screen
        # Saved with the session: after /new and /load the replayed turns show the card again.
        tmux.type("/save")
        tmux.key("Enter")
        saved = tmux.wait_for(lambda s: re.search(r"saved session ([0-9a-f]{8})", s) is not None, "saved")
        sid = re.search(r"saved session ([0-9a-f]{8})", saved).group(1)
        tmux.type("/new")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "find where parse is defined" not in s, "a new session")
        tmux.type(f"/load {sid}")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "⎇ subagent · find where parse is defined" in s and "done ·" in s
                      and "parse is defined in a.py line 3." in s, "the replayed card")
    finally:
        tmux.kill()
