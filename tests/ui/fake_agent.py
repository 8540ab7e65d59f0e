"""A stand-in for the Agent facade that records commands and publishes events a test hands it.

The functional tests that need a real loop use the real Agent over the scripted engine; this one is
for precise UI states (a permission question, a long diff, a saved-session list) without a model.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from ds4agent.agent import events as ev


def status(state: str = "idle", **kw) -> ev.Status:
    base = dict(state=ev.State(state), ctx_used=1200, ctx_total=16384, compact_at=13926)
    base.update(kw)
    return ev.Status(**base)


class FakeAgent:
    def __init__(self, *, busy: bool = False) -> None:
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self.calls: list[tuple] = []
        self.busy = busy
        self.running = False
        self.queue: list[str] = []
        self.answers: list[tuple[str, str, str]] = []
        self.replies: dict[str, list[ev.Event]] = {}   # submit text -> events to publish
        self.deleted: list[str] = []
        self._lock = threading.Lock()

    # lifecycle
    def start(self) -> None:
        self.running = True

    def shutdown(self, timeout: float | None = None) -> None:
        self.running = False

    # commands
    def emit(self, *events: ev.Event) -> None:
        for e in events:
            self.events.put(e)

    def feed(self, events: Iterable[ev.Event]) -> None:
        self.emit(*events)

    def submit(self, text: str) -> bool:
        self.calls.append(("submit", text))
        if self.busy:
            self.queue.append(text.strip())
            self.emit(ev.QueueChanged(tuple(self.queue)))
            return True
        self.emit(ev.UserTurn(text.strip()))
        self.emit(*self.replies.get(text.strip(), ()))
        return True

    def pull_queued(self) -> str | None:
        self.calls.append(("pull_queued",))
        if not self.queue:
            return None
        text = self.queue.pop()
        self.emit(ev.QueueChanged(tuple(self.queue)))
        return text

    def interrupt(self) -> None:
        self.calls.append(("interrupt",))

    def answer_permission(self, id: str, answer: str, message: str = "") -> bool:
        self.answers.append((id, answer, message))
        return True

    def save(self, title: str | None = None) -> None:
        self.calls.append(("save",) if title is None else ("save", title))

    def load(self, prefix: str) -> None:
        self.calls.append(("load", prefix))

    def new(self) -> None:
        self.calls.append(("new",))

    def compact(self) -> None:
        self.calls.append(("compact",))

    def list_sessions(self) -> None:
        self.calls.append(("list_sessions",))
        self.emit(ev.SessionList("/tmp/kv", tuple(self.sessions)))

    sessions: list[ev.SessionInfo] = []

    def delete_session(self, session_id: str) -> None:
        self.deleted.append(session_id)

    def history(self, n: int = 3) -> None:
        self.calls.append(("history", n))

    def set_think_mode(self, mode: str) -> None:
        self.calls.append(("think", mode))

    def set_permission_mode(self, mode: str) -> None:
        self.calls.append(("permissions", mode))

    def set_power(self, percent: int | None = None) -> None:
        self.calls.append(("power", percent))

    def custom_commands(self, reserved=frozenset()):
        return [], []

    def run_command(self, name: str, args: str = "") -> bool:
        self.calls.append(("run_command", name, args))
        return True

    def steer(self, text: str) -> bool:
        self.calls.append(("steer", text))
        return True

    def quit(self) -> None:
        self.calls.append(("quit",))
        self.emit(ev.Exited(0))

    def poll_events(self, max_events: int | None = None) -> list[ev.Event]:
        out = []
        while max_events is None or len(out) < max_events:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        return out
