"""Driving a real Agent (worker thread and all) from a test: build, submit, answer questions, collect.

    h = AgentHarness.build(tmp_path, [reply("hi", think="t")])
    evs = h.turn("hello")                  # submit and collect events until the worker is idle
    h.text()                               # rendered transcript bytes
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ds4agent.agent import Agent, AgentSettings
from ds4agent.agent import events as ev
from ds4agent.protocol.template import session_date_line
from ds4agent.protocol.tokenizer import Tokenizer
from tests.support.scripted_engine import ScriptedEngine

Answerer = Callable[[ev.Event], tuple[str, str] | str | None]


# A guard against a hung worker, not a timing check: generous, because the device sampler costs
# milliseconds per sampled token on a loaded CPU and the longest scripted turns are thousands of
# tokens (compaction tests), with the suite running two workers on two cores.
GUARD_S = 180.0
# The local time every harness session starts at: the first user turn's date line is fixed, so
# tests can state exact transcripts (DATE_LINE is what that turn's text opens with).
FIXED_NOW = datetime(2026, 3, 14, 9, 26, tzinfo=timezone(timedelta(hours=1)))
DATE_LINE = session_date_line(FIXED_NOW)

def answer_all(key: str) -> Answerer:
    return lambda e: key


@dataclass
class AgentHarness:
    agent: Agent
    engine: Any
    store: Any
    root: Path
    answer: Answerer = field(default=lambda e: None)
    events: list[ev.Event] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        root: Path,
        script: Iterable[Any] = (),
        *,
        engine: Any = None,
        tools: Sequence[Any] | None = None,
        store: Any = "default",
        answer: Answerer | None = None,
        start: bool = True,
        mcp: Any = None,
        **settings: Any,
    ) -> AgentHarness:
        from ds4agent.sessions.store import SessionStore

        root = Path(root)
        (root / "work").mkdir(parents=True, exist_ok=True)
        if engine is None:
            engine = ScriptedEngine(script, ctx=settings.pop("ctx", 16384))
            ctx = engine.ctx
        elif hasattr(engine, "new_session"):
            settings.pop("ctx", None)
            ctx = engine.ctx
        else:
            # A loader run on the worker thread (MLX arrays belong to the thread that made them).
            ctx = settings.pop("ctx")
        if store == "default":
            store = SessionStore(root / "kv")
        opts = dict(ctx=ctx, cwd=root / "work", journal_dir=root / "journal", permission="auto",
                    seed=1, undo_dir=root / "checkpoints")
        opts.update(settings)
        agent = Agent(engine, store, list(tools) if tools is not None else None, AgentSettings(**opts), mcp=mcp)
        h = cls(agent, engine, store, root, answer or (lambda e: None))
        h.worker.local_now = lambda: FIXED_NOW
        if start:
            h.start()
        return h

    # ------------------------------------------------------------------ running
    def start(self, timeout: float = GUARD_S) -> list[ev.Event]:
        self.agent.start()
        return self.until(lambda e: isinstance(e, (ev.Ready, ev.Exited)), timeout=timeout) + self.settle()

    def until(self, pred: Callable[[ev.Event], bool], timeout: float = GUARD_S) -> list[ev.Event]:
        """Collect events (answering questions) until one satisfies pred; returns those collected."""
        got: list[ev.Event] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                e = self.agent.events.get(timeout=0.05)
            except Exception:  # queue.Empty
                continue
            got.append(e)
            self.events.append(e)
            self._maybe_answer(e)
            if pred(e):
                return got
        raise AssertionError(f"timed out waiting; last events: {got[-5:]}")

    def _maybe_answer(self, e: ev.Event) -> None:
        if isinstance(e, (ev.PermissionRequest, ev.Question)):
            a = self.answer(e)
            if a is None:
                return
            key, msg = (a, "") if isinstance(a, str) else a
            self.agent.answer_permission(e.id, key, msg)

    def settle(self, timeout: float = GUARD_S) -> list[ev.Event]:
        """Collect until the worker is idle with nothing queued and the event queue is drained."""
        got: list[ev.Event] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = self.agent.poll_events()
            for e in batch:
                got.append(e)
                self.events.append(e)
                self._maybe_answer(e)
            if not batch:
                if not self.agent.busy and self.agent._commands.empty() and self.agent.events.empty():
                    return got
                time.sleep(0.002)
        raise AssertionError(f"agent did not settle; last events: {got[-5:]}")

    def turn(self, text: str, timeout: float = GUARD_S) -> list[ev.Event]:
        assert self.agent.submit(text)
        return self.settle(timeout)

    def command(self, fn: Callable[[], Any], timeout: float = GUARD_S) -> list[ev.Event]:
        fn()
        return self.settle(timeout)

    def at_step(self, pos: int, action: Callable[[], Any]) -> None:
        """Do `action` once, on the worker thread, when the scripted engine has decoded `pos`
        tokens of a response (the user acting mid-answer: interrupt, queue a message, save)."""
        fired: list[int] = []

        def hook(session: Any, at: int) -> None:
            if at == pos and not fired:
                fired.append(1)
                action()

        self.engine.on_step = hook

    def stop(self) -> None:
        self.agent.shutdown()

    # ------------------------------------------------------------------ inspection
    @property
    def worker(self) -> Any:
        """The worker; after start, `.engine` is the loaded engine."""
        return self.agent._worker

    @property
    def ids(self) -> list[int]:
        return list(self.worker.conv.transcript.ids)

    def text(self, start: int = 0) -> bytes:
        return Tokenizer.load().decode_bytes(self.ids[start:])

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(self.worker.session.tokens)


def of(events: Iterable[ev.Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]
