"""`ds4agent --demo` as a newcomer runs it: a real terminal of 80x24 (tmux), the MCP approval, one
message, the permission questions answered by key (the outside write refused), the whole tour on
screen, then /quit."""

from __future__ import annotations

import shutil
import sys
import time

import pytest

from tests.ui.test_tmux import READ_PAUSE_S, Tmux, _env, _status_line


def _answer(tmux: Tmux, question: str, key: str) -> None:
    tmux.wait_for(lambda s: question in s, question)
    time.sleep(READ_PAUSE_S)  # a person reads the question: keys typed at once go to the editor
    tmux.key(key)
    tmux.wait_for(lambda s: question not in s, f"{question!r} answered")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_demo_tour_in_tmux_at_80x24(tmp_path):
    env = _env(tmp_path)
    env["DS4AGENT_DEMO_DIR"] = str(tmp_path / "demo")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "home/.config")
    tmux = Tmux(env)
    command = f"cd {tmp_path} && {sys.executable} -m ds4agent.cli --demo; echo EXITED-$?; sleep 30"
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "80", "-y", "24", command)
        tmux.run("resize-window", "-t", "app", "-x", "80", "-y", "24")
        # The whole question, not its first line: under load a capture can fall between the writes
        # of one frame, and the server's command line is drawn after the question's start.
        first = tmux.wait_for(lambda s: "starts MCP servers" in s and "demo_server.py" in s,
                              "the MCP approval naming the server's command", timeout=30)
        assert "ds4agent ─" in first
        _answer(tmux, "starts MCP servers", "y")
        screen = tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "the demo engine ready")
        assert "MCP servers: demo (1 tool)" in screen and "demo (a scripted engine, no model)" in screen
        tmux.type("show me around")
        tmux.key("Enter")
        _answer(tmux, "Edit greet.py?", "y")
        _answer(tmux, "Run this shell command?", "y")
        _answer(tmux, "(outside the working directory)?", "n")
        screen = tmux.wait_for(lambda s: "That was the tour" in s and _status_line(s).startswith("idle"),
                               "the end of the tour")
        assert "The MCP server answered with a tip." in screen
        assert "⏺ demo__tip" in screen and "Traceback" not in screen
        assert (tmp_path / "demo/project/greet.py").read_text().count('f"Hello, {name}!"') == 1
        assert not (tmp_path / "demo/outside.txt").exists()
        tmux.type("/quit")
        tmux.key("Enter")
        _answer(tmux, "Save current session?", "n")
        tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0")
    finally:
        tmux.kill()
