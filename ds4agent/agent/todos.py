"""The model's task list (tools/todo.py), as the agent publishes it.

The list has no state of its own outside the transcript: the last todo result in the transcript
is the current list. So a save carries it, a load and a rewind bring back the one of that point,
and a new session (or a compaction, whose summary replaces the results) starts without one.

    after_tool(worker, display)   a todo call just ran: publish its list
    publish(worker)               after a command (load, rewind, new, compaction, start): publish
                                  the transcript's list when it differs from the one shown
"""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.port import WorkerPort
from ds4agent.tools.todo import HEADER, TodoDisplay, TodoItem, items_from_result

_OPEN = b"<tool_result>"
_CLOSE = b"</tool_result>"
_KEY = _OPEN + HEADER.encode()


def from_transcript(text: bytes) -> tuple[TodoItem, ...]:
    """The last todo list among the tool results of a rendered transcript (() when none)."""
    end = len(text)
    while (at := text.rfind(_KEY, 0, end)) >= 0:
        stop = text.find(_CLOSE, at)
        body = text[at + len(_OPEN): stop if stop >= 0 else len(text)]
        items = items_from_result(body.decode("utf-8", "replace"))
        if items is not None:
            return items
        end = at
    return ()


def after_tool(worker: WorkerPort, display: object) -> None:
    if isinstance(display, TodoDisplay):
        worker.conv.show_todos(display.items)
        worker.io.emit(ev.TodoList(display.items))


def publish(worker: WorkerPort) -> None:
    t = worker.conv.transcript
    items = from_transcript(worker.tok.decode_bytes(t.ids[t.system_len:]))
    if worker.conv.show_todos(items):
        worker.io.emit(ev.TodoList(items))
