"""The task list the model keeps for a longer job: the `todo` tool.

    TodoItem(text, status)         one task; status: pending | in_progress | done
    TodoDisplay(items)             the display payload of a todo result (UIs draw the list from it)
    TodoTool                       `todo items=...`: replaces the whole list, answers with it
    render(items) -> str           the result text (what the model sees, and what is saved)
    items_from_result(text)        the inverse of render(): the list a todo result holds, or None

Each call sends the whole list (no ids to keep in step), one task per line with a checkbox:
`[ ]` pending, `[>]` in progress, `[x]` done; a JSON array of {"text"|"content", "status"}
objects is read too. The list lives in the transcript: the last todo result in it is the current
list, so saving, loading and rewinding a session carry it with no state of its own
(agent/todos.py reads it back). Changing the list touches nothing in the workspace, so the tool
does not mutate: it runs in every permission mode, plan mode included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ds4agent.tools.context import ToolContext
from ds4agent.tools.results import Observation, ToolError

STATUSES = ("pending", "in_progress", "done")
_MARK = {"pending": "[ ]", "in_progress": "[>]", "done": "[x]"}
_STATUS_OF_MARK = {"[ ]": "pending", "[>]": "in_progress", "[x]": "done", "[X]": "done", "[~]": "in_progress"}
_STATUS_WORDS = {"pending": "pending", "todo": "pending", "in_progress": "in_progress",
                 "in progress": "in_progress", "doing": "in_progress", "done": "done",
                 "completed": "done", "complete": "done"}
MAX_ITEMS = 50
MAX_TEXT = 200  # characters of one task; a longer one is cut with "…"
# The first line of every todo result: how agent/todos.py finds the current list in a transcript.
HEADER = "Todo list"


@dataclass(frozen=True)
class TodoItem:
    text: str
    status: str  # one of STATUSES


@dataclass(frozen=True)
class TodoDisplay:
    """The list as the todo call left it (UIs draw the panel from it)."""

    items: tuple[TodoItem, ...]


def render(items: tuple[TodoItem, ...]) -> str:
    """`Todo list (1/3 done):` then one checkbox line per task; `Todo list: empty` for none."""
    if not items:
        return f"{HEADER}: empty\n"
    done = sum(1 for i in items if i.status == "done")
    lines = [f"{HEADER} ({done}/{len(items)} done):"]
    lines += [f"{_MARK[i.status]} {i.text}" for i in items]
    return "\n".join(lines) + "\n"


def items_from_result(text: str) -> tuple[TodoItem, ...] | None:
    """The list a todo result text holds (render's output), or None when `text` is not one."""
    first, _, rest = text.partition("\n")
    if first == f"{HEADER}: empty":
        return ()
    if not (first.startswith(f"{HEADER} (") and first.endswith(" done):")):
        return None
    items = []
    for line in rest.split("\n"):
        status = _STATUS_OF_MARK.get(line[:3])
        if status is None or line[3:4] != " ":
            break
        items.append(TodoItem(line[4:], status))
    return tuple(items)


def _clean(text: str) -> str:
    """One line of at most MAX_TEXT characters (a task shows on one row of the panel)."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _from_lines(value: str) -> list[TodoItem]:
    items = []
    for n, raw in enumerate(value.split("\n"), 1):
        line = raw.strip().removeprefix("- ").removeprefix("* ").strip()
        if not line:
            continue
        status = _STATUS_OF_MARK.get(line[:3])
        if status is None:
            raise ToolError(f"todo line {n} has no checkbox: start each task with [ ] (pending), "
                            f"[>] (in progress) or [x] (done); got {_clean(line)[:60]!r}")
        text = _clean(line[3:])
        if not text:
            raise ToolError(f"todo line {n} has a checkbox but no task text")
        items.append(TodoItem(text, status))
    return items


def _from_json(value: list[Any]) -> list[TodoItem]:
    items = []
    for n, entry in enumerate(value, 1):
        if not isinstance(entry, Mapping):
            raise ToolError(f"todo item {n} is not an object with text and status")
        text = entry.get("text", entry.get("content"))
        status = _STATUS_WORDS.get(str(entry.get("status", "pending")).strip().lower())
        if not isinstance(text, str) or not _clean(text):
            raise ToolError(f"todo item {n} has no text")
        if status is None:
            raise ToolError(f"todo item {n} has an unknown status {entry.get('status')!r} "
                            f"(use {', '.join(STATUSES)})")
        items.append(TodoItem(_clean(text), status))
    return items


def parse_items(value: Any) -> tuple[TodoItem, ...]:
    """The list a call's `items` argument gives; ToolError (readable) for anything malformed."""
    if value is None:
        raise ToolError("todo requires items: one task per line, each starting with [ ], [>] or [x] "
                        "(items=\"\" clears the list)")
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        if isinstance(decoded, list):
            value = decoded
    if isinstance(value, list):
        items = _from_json(value)
    elif isinstance(value, str):
        items = _from_lines(value)
    else:
        raise ToolError("todo items must be text: one task per line, each starting with [ ], [>] or [x]")
    if len(items) > MAX_ITEMS:
        raise ToolError(f"todo takes at most {MAX_ITEMS} tasks (got {len(items)}); group the small ones")
    return tuple(items)


class TodoTool:
    name = "todo"
    description = (
        "Set the task list shown to the user: the whole list, one task per line, [ ] pending, "
        "[>] in progress, [x] done. Update it as you start and finish tasks."
    )
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "string", "description": "e.g. \"[x] read the parser\\n[>] fix the bug\""},
        },
        "required": ["items"],
    }
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        items = parse_items(args.get("items"))
        return Observation(render(items), display=TodoDisplay(items))
