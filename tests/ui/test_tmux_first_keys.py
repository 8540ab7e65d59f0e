"""The first keys a person types, in a real terminal (tmux, 80x24, the demo engine: no model):
keys typed before the first paint land in the editor, and a command typed after an unknown one
replaces it instead of being appended to it (the app and the plain mode)."""

from __future__ import annotations

import shutil
import sys
import time

import pytest

from tests.ui.test_tmux import READ_PAUSE_S, Tmux, _env

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")


def _start(tmp_path, flags: str) -> Tmux:
    env = _env(tmp_path)
    env["DS4AGENT_DEMO_DIR"] = str(tmp_path / "demo")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home/.config")
    tmux = Tmux(env)
    command = f"cd {tmp_path} && {sys.executable} -m ds4agent.cli --demo {flags}; echo EXITED-$?; sleep 30"
    tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "80", "-y", "24", command)
    tmux.run("resize-window", "-t", "app", "-x", "80", "-y", "24")
    return tmux


def _editor_line(screen: str) -> str:
    """The editor's (one) line: just above the status line."""
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    return lines[-2].strip()


def test_keys_before_the_first_paint_and_after_an_unknown_command(tmp_path):
    tmux = _start(tmp_path, "--permission auto")
    try:
        tmux.type("early bird")  # at once: Python is still importing, nothing is painted yet
        screen = tmux.wait_for(lambda s: "starts MCP servers" in s, "the MCP approval", timeout=30)
        time.sleep(READ_PAUSE_S)
        tmux.key("n")
        tmux.wait_for(lambda s: "starts MCP servers" not in s and _editor_line(s) == "early bird", "the typed keys")
        tmux.key("C-c")  # clears the editor
        tmux.wait_for(lambda s: "Ask ds4agent…" in s, "an empty editor")
        tmux.type("/lsit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "unknown command: /lsit" in s, "the unknown command's note")
        tmux.type("/list")
        screen = tmux.wait_for(lambda s: _editor_line(s) == "/list", "the new command replacing the old one")
        assert "/lsit/list" not in screen
    finally:
        tmux.kill()


def test_plain_mode_does_not_append_to_an_unknown_command(tmp_path):
    tmux = _start(tmp_path, "--plain --permission auto")
    try:
        tmux.wait_for(lambda s: "starts MCP servers" in s, "the MCP approval", timeout=30)
        tmux.type("n")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "ds4agent>" in s, "the prompt")
        tmux.type("/lsit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "unknown command: /lsit" in s and "Up brings it back" in s, "the note")
        tmux.type("/list")
        tmux.key("Enter")
        screen = tmux.wait_for(lambda s: "› /list" in s, "/list run")
        assert "/lsit/list" not in screen
    finally:
        tmux.kill()
