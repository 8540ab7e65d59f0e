"""A start that fails (not a GGUF, a context too small, ...) leaves an app the user can read and leave."""

from __future__ import annotations

import threading

from ds4agent.agent.facade import Agent
from ds4agent.agent.settings import AgentSettings
from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.widgets.conversation import Note
from tests.ui.conftest import send, wait_until

HINT = "the agent could not start (the reason is above): leave with /quit, Ctrl+D or Ctrl+C twice"


def _notes(app) -> list[str]:
    return [n.text for n in app.conversation.query(Note)]


def _failing_app(tmp_path, release: threading.Event | None = None):
    """The real Agent whose model loader fails the way a file that is not a GGUF does."""

    def loader(progress):
        if release is not None:
            release.wait(10)
        raise ValueError("/models/x.gguf: not a GGUF file (only 8 bytes)")

    settings = AgentSettings(ctx=4096, cwd=tmp_path, journal=False)
    agent = Agent(loader, None, [], settings)
    return Ds4App(lambda: agent, cwd=str(tmp_path), history=InputHistory(persist=False), animate=False,
                  typeahead_grace=0.0)


def _failed(app) -> bool:
    return app.startup_error is not None and HINT in _notes(app)


async def test_messages_typed_before_and_after_a_failed_start_are_answered_not_queued(tmp_path):
    release = threading.Event()
    app = _failing_app(tmp_path, release)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.agent is not None, what="agent built")
        await send(pilot, app, "hello while loading")
        await wait_until(pilot, lambda: app.chips.items == ("hello while loading",), what="queued chip")
        release.set()
        await wait_until(pilot, lambda: _failed(app), what="failed start")
        assert app.startup_error == "startup failed: /models/x.gguf: not a GGUF file (only 8 bytes)"
        assert app.chips.items == ()
        notes = _notes(app)
        assert "1 queued message not sent: the agent could not start" in notes
        await send(pilot, app, "are you there")
        await wait_until(pilot, lambda: _notes(app)[-1].startswith("not sent:"))
        assert _notes(app)[-1] == f"not sent: {HINT}"
        assert app.chips.items == () and not app.agent.busy and app.agent.queued() == ()
        await send(pilot, app, "/load abc")
        await wait_until(pilot, lambda: _notes(app)[-1].startswith("/load cannot run"))
        await send(pilot, app, "/quit")
        await wait_until(pilot, lambda: not app.is_running, what="exit on /quit")
    assert app.return_code == 1


async def test_ctrl_c_twice_leaves_after_a_failed_start(tmp_path):
    app = _failing_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: _failed(app), what="failed start")
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: "press Ctrl+C again or Ctrl+D to exit" in _notes(app))
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: not app.is_running, what="exit on Ctrl+C twice")
    assert app.return_code == 1


async def test_ctrl_d_leaves_after_a_failed_start(tmp_path):
    app = _failing_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: _failed(app), what="failed start")
        await pilot.press("ctrl+l")  # the picker has no sessions to offer: said, nothing opens
        await wait_until(pilot, lambda: _notes(app)[-1] == f"Ctrl+L cannot run: {HINT}")
        assert len(app.screen_stack) == 1
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: not app.is_running, what="exit on Ctrl+D")
    assert app.return_code == 1


def test_the_error_is_printed_after_the_full_screen_closes(tmp_path, monkeypatch, capsys):
    # ds4agent's own entry point with a file that is not a GGUF: the app is run headless and left
    # with Ctrl+D once the error is on screen; the error must then be on stderr too.
    from ds4agent import cli

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not gguf")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    original_run = Ds4App.run

    async def leave_when_failed(pilot) -> None:
        await wait_until(pilot, lambda: _failed(pilot.app), what="failed start")
        await pilot.press("ctrl+d")

    monkeypatch.setattr(Ds4App, "run", lambda self: original_run(self, headless=True, auto_pilot=leave_when_failed))
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    code = cli.main(["--model", str(bad), "--kv-dir", str(tmp_path / "kv")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("ds4agent: startup failed: ") and str(bad) in err
    assert err.count("\n") == 1
