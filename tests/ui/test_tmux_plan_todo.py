"""Plan approval and the task panel in a real 80x24 terminal (tmux), over the real Agent on the
scripted engine (tests/ui/scripted_app.py): what a person sees, and the keys they press."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.ui.test_tmux import READ_PAUSE_S, Tmux, _env, _status_line

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install -y tmux)")
ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, scenario: str) -> Tmux:
    tmux = Tmux(_env(tmp_path))
    tmux.env["PYTHONPATH"] = str(ROOT)
    command = (f"cd {ROOT} && {sys.executable} -m tests.ui.scripted_app {scenario} {tmp_path / 'run'}; "
               "echo EXITED-$?; sleep 30")
    tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "80", "-y", "24", command)
    tmux.run("resize-window", "-t", "app", "-x", "80", "-y", "24")
    # A bell from the app (ui/notify.py) leaves a file behind: tmux runs the hook on every BEL.
    tmux.run("set-option", "-g", "bell-action", "any")
    tmux.run("set-hook", "-g", "alert-bell", f"run-shell 'touch {tmp_path / 'bell'}'")
    tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "the agent ready and idle", timeout=60)
    return tmux


def _header(screen: str) -> str:
    """The header line: at 80 columns it holds the think and permission modes at its right."""
    return screen.split("\n")[0]


def _fits(screen: str) -> None:
    lines = screen.splitlines()
    assert len(lines) <= 24 and all(len(ln) <= 80 for ln in lines), screen


def _quit(tmux: Tmux) -> None:
    tmux.type("/quit\r")
    tmux.wait_for(lambda s: "Save current session?" in s or "EXITED-" in s, "quit")
    if "EXITED-" not in tmux.screen():
        time.sleep(READ_PAUSE_S)
        tmux.key("n")
    tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0")


def test_plan_approval_at_80x24(tmp_path):
    tmux = _start(tmp_path, "plan")
    try:
        assert _header(tmux.screen()).endswith("think · plan")
        tmux.type("accept size suffixes\r")
        assert not (tmp_path / "bell").exists()
        screen = tmux.wait_for(lambda s: "Approve this plan?" in s, "the plan approval")
        _fits(screen)
        # A question waits: the terminal was rung (BEL; tmux is no desktop-notification terminal).
        tmux.wait_for(lambda s: (tmp_path / "bell").exists(), "the bell", timeout=30)
        for part in ("Approve this plan?", "1. Read src/parser.py", "3. Add tests for each suffix",
                     "[y] approve: carry it out, asking before changes",
                     "[a] approve: carry it out without asking (auto)",
                     "[m] send it back with comments"):
            assert part in screen, screen
        time.sleep(READ_PAUSE_S)
        tmux.key("y")
        screen = tmux.wait_for(lambda s: "Done: suffixes accepted." in s and _status_line(s).startswith("idle"),
                               "the approved plan carried out")
        _fits(screen)
        assert _header(screen).endswith("think · ask")
        assert "The user approved the plan." in screen
        _quit(tmux)
    finally:
        tmux.kill()


def test_shift_tab_toggles_plan_mode_in_the_header(tmp_path):
    tmux = _start(tmp_path, "toggle")
    try:
        assert _header(tmux.screen()).endswith("think · ask")
        tmux.key("BTab")
        tmux.wait_for(lambda s: _header(s).endswith("think · plan"), "plan mode in the header", timeout=30)
        tmux.key("BTab")
        tmux.wait_for(lambda s: _header(s).endswith("think · ask"), "back to ask", timeout=30)
        _quit(tmux)
    finally:
        tmux.kill()


def test_task_panel_at_80x24_and_ctrl_g_folds_it(tmp_path):
    tmux = _start(tmp_path, "todo")
    try:
        tmux.type("add suffixes\r")
        screen = tmux.wait_for(lambda s: "Working through the list." in s and _status_line(s).startswith("idle"),
                               "the answer with the task panel")
        _fits(screen)
        assert "Tasks 2/10 done · now: accept the k/M/G suffixes" in screen
        assert "… 1 done above" in screen and "▶ accept the k/M/G suffixes" in screen
        assert "○ follow-up task number 3" in screen and "… 4 more" in screen
        assert "follow-up task number 4" not in screen.split("────")[-1]  # past the panel's 5 rows
        # The conversation keeps most of the screen: the panel takes at most 8 of the 24 rows.
        divider = next(n for n, ln in enumerate(screen.splitlines()) if ln.startswith("────"))
        assert divider >= 12, screen
        tmux.key("C-g")
        folded = tmux.wait_for(lambda s: "(ctrl+g: open)" in s, "the folded panel", timeout=30)
        assert "○ follow-up task number 1" not in folded and "… 4 more" not in folded
        assert "Tasks 2/10 done · now: accept the k/M/G suffixes (ctrl+g: open)" in folded
        _quit(tmux)
    finally:
        tmux.kill()
