"""One table: agent event type -> handler. The mechanism the three front ends share.

    table = EventTable({ev.Status: on_status, ev.TextDelta: on_text, ...})
    table.dispatch(event, n)   # the handler's result; None for a type the table does not handle

Each front end (app.py, plain.py, headless.py) supplies its own handlers, one per event type it
shows; an event it has no handler for is simply not shown. A handler is called as
handler(event, n), n being how many raw events the (coalesced, bridge.py) event stands for. The
TUI's handlers are coroutines: dispatch returns the coroutine and the app awaits it.

Lookup is by the event's exact type, then its base classes (so a handler for a base class also
serves subclasses); the answer is cached per type. Pure Python: no Textual or prompt_toolkit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ds4agent.agent import events as ev

R = TypeVar("R")
# A handler takes the event (of the type it is registered for) and the count it stands for.
Handler = Callable[..., R]


class EventTable(Generic[R]):
    __slots__ = ("_handlers", "_resolved")

    def __init__(self, handlers: Mapping[type[ev.Event], Handler[R]]) -> None:
        for kind in handlers:
            if not (isinstance(kind, type) and issubclass(kind, ev.Event)):
                raise TypeError(f"not an agent event type: {kind!r}")
        self._handlers = dict(handlers)
        self._resolved: dict[type, Handler[R] | None] = {}

    def handler(self, kind: type) -> Handler[R] | None:
        """The handler for events of `kind` (or of its nearest base class in the table)."""
        try:
            return self._resolved[kind]
        except KeyError:
            found = next((self._handlers[k] for k in kind.__mro__ if k in self._handlers), None)
            self._resolved[kind] = found
            return found

    def dispatch(self, event: ev.Event, n: int = 1) -> R | None:
        handler = self.handler(type(event))
        return None if handler is None else handler(event, n)

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, type) and self.handler(kind) is not None
