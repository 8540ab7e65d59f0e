"""SVG snapshots of the main states (pytest-textual-snapshot). Deterministic: a fixed clock, a fixed
`now`, a fixed working directory, no spinner animation and no cursor blink.

Update after an intended visual change: pytest tests/ui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

from ds4agent.agent import events as ev
from ds4agent.tools import BashDisplay, DiffDisplay, DiffLine, TextDisplay
from tests.ui.conftest import make_fake_app
from tests.ui.fake_agent import status

SIZE = (110, 40)
SMALL = (80, 24)  # every screen must read well in the classic terminal size
# The main states at both sizes: one test each, its snapshots named test_x[110x40] / test_x[80x24].
SIZES = pytest.mark.parametrize("size", [SIZE, SMALL], ids=["110x40", "80x24"])


async def _settle(pilot, app, cond=lambda: True) -> None:
    for _ in range(200):
        if cond() and not app.draining and app.agent is not None and app.agent.events.empty():
            break
        await pilot.pause(0.02)
    await pilot.pause(0.15)


def _turn_events(clock) -> list[ev.Event]:
    diff_lines = (
        DiffLine("hunk", None, None, "@@ -86,3 +86,4 @@"),
        DiffLine("context", 86, 86, "def _backoff(self, attempt):"),
        DiffLine("context", 87, 87, "    base = self.base_delay"),
        DiffLine("remove", 88, None, "    return base * attempt"),
        DiffLine("add", None, 88, "    delay = base * (2 ** attempt)"),
        DiffLine("add", None, 89, "    return min(delay, self.max_delay)"),
    )
    bash = BashDisplay(command="pytest -q tests/test_client.py", job=1, pid=10, running=False, exit_status=0,
                       timed_out=False, output="....................\n20 passed in 2.84s\n", output_kind="full",
                       output_path="/tmp/out", total_bytes=40, total_lines=2, duration=3.1)
    return [
        ev.UserTurn("Fix the flaky retry test in tests/test_client.py"),
        # speeds reach the status line from a real prefill and from decoding, not from idle Status
        ev.PrefillProgress(2048, 2048, 412.0),
        status("generating", generated=1, decode_tps=23.1),
        *[ev.ThinkingDelta(w) for w in "The retry delay looks linear; read the client first.".split(" ")],
        ev.ToolCallStart(0, "read"), ev.ToolCallEnd(0, "read", {"path": "src/client.py"}),
        ev.ToolResult(0, "read", True, "1: x", TextDisplay("212 lines", "1: x")),
        ev.ToolCallStart(1, "edit"), ev.ToolCallEnd(1, "edit", {"path": "src/client.py", "start": "88", "end": "89"}),
        ev.ToolResult(1, "edit", True, "ok", DiffDisplay("src/client.py", False, "", diff_lines, 2, 1)),
        ev.ToolCallStart(2, "bash"), ev.ToolCallEnd(2, "bash", {"command": "pytest -q tests/test_client.py"}),
        ev.ToolResult(2, "bash", True, "exit status 0", bash, 3.1),
        ev.TextDelta("The retry delay grew **linearly**, so the 50 ms budget was hit on slow machines. "
                     "It is now exponential and capped:\n\n"),
        ev.TextDelta("```python\ndelay = min(base * (2 ** attempt), self.max_delay)\n```\n\n"
                     "- 20 tests pass\n- no new dependencies\n"),
        ev.TurnEnded("done", rounds=2, generated=300),
        status("idle", ctx_used=14200, ctx_total=100_000, compact_at=85_000, decode_tps=23.1, prefill_tps=412.0,
               unsaved=False, session_id="3f2a9c1e", title="Fix the flaky retry test"),
    ]


@SIZES
def test_snapshot_conversation(snap_compare, size):
    _conversation(snap_compare, size)


def _conversation(snap_compare, size):
    app, agent = make_fake_app()

    async def run_before(pilot):
        events = _turn_events(app.clock)
        n_think = 3 + 9  # the user turn, a prefill, a status, nine thinking deltas
        agent.emit(*events[:n_think])
        await _settle(pilot, app, lambda: app.conversation.thinking is not None)
        app.clock.t += 4.2
        agent.emit(*events[n_think:])
        await _settle(pilot, app, lambda: app.conversation.last_answer_text != "")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@SIZES
def test_snapshot_loading_with_queued_message(snap_compare, size):
    _loading_with_queued_message(snap_compare, size)


def _loading_with_queued_message(snap_compare, size):
    app, agent = make_fake_app()
    agent.busy = True

    async def run_before(pilot):
        agent.emit(status("loading", progress=0.37, ctx_used=0))
        app.input.insert("Explain the build")
        await pilot.press("enter")
        app.input.insert("and then the tests")
        await _settle(pilot, app, lambda: app.chips.items != ())

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@SIZES
def test_snapshot_permission_modal(snap_compare, size):
    _permission_modal(snap_compare, size)


def _permission_modal(snap_compare, size):
    app, agent = make_fake_app()
    diff = "--- a/src/client.py\n+++ b/src/client.py\n@@ -88 +88,2 @@\n-    return base * attempt\n" \
           "+    delay = base * (2 ** attempt)\n+    return min(delay, self.max_delay)\n"

    async def run_before(pilot):
        agent.emit(status("tool", detail="edit"),
                   ev.PermissionRequest("p1", "edit", "Allow edit to src/client.py?", diff,
                                        (("y", "allow once"), ("s", "allow edits for this session"), ("n", "deny"))))
        await _settle(pilot, app, lambda: len(app.screen_stack) > 1)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@SIZES
def test_snapshot_session_picker(snap_compare, size):
    _session_picker(snap_compare, size)


def _session_picker(snap_compare, size):
    app, agent = make_fake_app()
    now = 1_700_000_000
    agent.sessions = [
        ev.SessionInfo("3f2a9c1e" + "0" * 32, "3f2a9c1e", "Fix the flaky retry test", 14200, 9 << 20,
                       now - 300, 0, "/kv/a"),
        ev.SessionInfo("8b01d2aa" + "0" * 32, "8b01d2aa", "Port the parser to the new DSML syntax", 52000,
                       31 << 20, now - 7200, 0, "/kv/b"),
        ev.SessionInfo("c0ffee00" + "0" * 32, "c0ffee00", "", 2100, 1 << 20, now - 5 * 86400, 0, "/kv/c"),
    ]

    async def run_before(pilot):
        agent.emit(status("idle"))
        await pilot.press("ctrl+l")
        await _settle(pilot, app, lambda: len(app.screen_stack) > 1)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@SIZES
def test_snapshot_prefill_with_failed_bash_and_invalid_call(snap_compare, size):
    _prefill_with_failed_bash_and_invalid_call(snap_compare, size)


def _prefill_with_failed_bash_and_invalid_call(snap_compare, size):
    app, agent = make_fake_app()
    bash = BashDisplay(command="make test", job=1, pid=10, running=False, exit_status=2, timed_out=False,
                       output="cc -o app main.c\nmain.c:3: error: expected ';'\nmake: *** [app] Error 1\n",
                       output_kind="full", output_path="/tmp/out", total_bytes=80, total_lines=3, duration=0.4)

    async def run_before(pilot):
        agent.emit(
            ev.UserTurn("build it"),
            ev.ToolCallStart(0, "bash"), ev.ToolCallEnd(0, "bash", {"command": "make test"}),
            ev.ToolResult(0, "bash", False, "exit status 2", bash, 0.4),
            ev.ToolCallInvalid("unknown parameter: colour", '<｜DSML｜invoke name="list">', "error"),
            ev.PrefillProgress(768, 2048, 812.0),
        )
        await _settle(pilot, app, lambda: app.status_model.prefill_total == 2048)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_snapshot_help_80x24(snap_compare):
    # Each meaning wraps inside its own column, never back to the line's start.
    app, agent = make_fake_app()

    async def run_before(pilot):
        agent.emit(status("idle"))
        await pilot.press("f1")
        await _settle(pilot, app, lambda: len(app.screen_stack) > 1)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


LONG_TITLE = "Investigate why the integration tests for the payment gateway fail on Tuesdays only"


def test_snapshot_long_title_header_and_picker_80x24(snap_compare):
    # The header cuts a long title at a word with an ellipsis and keeps the modes on the right;
    # the picker's title column leaves room for age, tokens and size.
    app, agent = make_fake_app()
    now = 1_700_000_000
    agent.sessions = [
        ev.SessionInfo("5a761e70" + "0" * 32, "5a761e70", LONG_TITLE, 123_400, 96 << 20, now - 300, 0, "/kv/a"),
        ev.SessionInfo("8b01d2aa" + "0" * 32, "8b01d2aa", "Port the parser to the new DSML syntax", 52000,
                       31 << 20, now - 7200, 0, "/kv/b"),
    ]

    async def run_before(pilot):
        agent.emit(status("idle", session_id="5a761e70", title=LONG_TITLE, unsaved=False))
        await pilot.press("ctrl+l")
        await _settle(pilot, app, lambda: len(app.screen_stack) > 1)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


def test_snapshot_failed_start_80x24(snap_compare):
    app, agent = make_fake_app()

    async def run_before(pilot):
        agent.emit(ev.Error("startup failed: /models/x.gguf: not a GGUF file (only 8 bytes)", fatal=True),
                   status("error", detail="startup failed: /models/x.gguf: not a GGUF file (only 8 bytes)"),
                   ev.Exited(1))
        await _settle(pilot, app, lambda: app.startup_error is not None)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


def test_snapshot_slash_menu_80x24(snap_compare):
    app, agent = make_fake_app()

    async def run_before(pilot):
        agent.emit(status("idle"))
        await pilot.press("/")
        await _settle(pilot, app)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


def test_snapshot_rewind_list_80x24(snap_compare):
    from ds4agent.ui.screens.rewind import RewindScreen

    app, agent = make_fake_app()
    now = 1_700_000_000.0
    points = tuple(ev.RewindPoint(n, now - 600 * (5 - n), text, 1000 * n) for n, text in enumerate(
        ("Fix the flaky retry test in tests/test_client.py", "Now make the backoff cap configurable "
         "from the settings file and document it in the README", "Run the whole suite"), start=1))

    async def run_before(pilot):
        agent.emit(status("idle"))
        app.push_screen(RewindScreen(points, "changes made through bash are not undone", now=lambda: now))
        await _settle(pilot, app, lambda: len(app.screen_stack) > 1)

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)
