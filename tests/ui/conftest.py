"""Fixtures of the UI tests: apps over a fake agent or the real Agent on the scripted engine."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from tests.ui.fake_agent import FakeAgent


class StepClock:
    """A clock that only moves when a test says so (no wall time in what the UI shows)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_fake_app(agent: FakeAgent | None = None, **kw) -> tuple[Ds4App, FakeAgent]:
    agent = agent or FakeAgent()
    kw.setdefault("cwd", "/home/user/src/myrepo")
    kw.setdefault("history", InputHistory(persist=False))
    kw.setdefault("animate", False)
    kw.setdefault("clock", StepClock())
    kw.setdefault("now", lambda: 1_700_000_000.0)
    kw.setdefault("ctx", 16384)
    kw.setdefault("typeahead_grace", 0.0)  # tests press keys faster than a person; one test sets it
    return Ds4App(agent=agent, **kw), agent


def app_waiting_for_agent() -> tuple[Ds4App, FakeAgent, threading.Event]:
    """An app whose agent is still being built (the model loading) until the event is set."""
    release = threading.Event()
    agent = FakeAgent()

    def factory():
        release.wait(10)
        return agent

    return Ds4App(factory, cwd="/w", history=InputHistory(persist=False), animate=False), agent, release


def make_real_agent(tmp_path: Path, script, *, permission: str = "auto", ctx: int = 16384, on_step=None):
    """The real Agent facade over the scripted engine, with a store and a workspace under tmp_path."""
    from ds4agent.agent.facade import Agent
    from ds4agent.agent.settings import AgentSettings
    from ds4agent.sessions.store import SessionStore
    from tests.support.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(script, ctx=ctx)
    engine.on_step = on_step
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    settings = AgentSettings(ctx=ctx, cwd=work, permission=permission, kv_dir=tmp_path / "kv",
                             journal=False, journal_dir=tmp_path / "journal",
                             undo_dir=tmp_path / "checkpoints")
    agent = Agent(engine, SessionStore(tmp_path / "kv"), None, settings)
    return agent, engine


async def wait_until(pilot, cond, timeout: float = 15.0, what: str = "condition") -> None:
    """Let the app run until `cond()` holds (polling; the timeout only guards against a hang)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            # what a person would have seen, so a CI failure can be read without rerunning
            from tests.ui.screen_text import screen_text

            raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen_text(pilot.app)}")
        await pilot.pause(0.02)
    await pilot.pause(0.03)  # let what the condition saw reach the screen


async def send(pilot, app, text: str) -> None:
    """Put `text` in the editor and press Enter, as a paste followed by Enter would."""
    app.input.insert(text)
    await pilot.press("enter")


@pytest.fixture(autouse=True)
def _isolated_history(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4AGENT_HISTORY", str(tmp_path / "history.json"))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests of this package in a fresh event loop (no pytest-asyncio dependency)."""
    import asyncio
    import inspect

    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None
