"""The model's task list as lines of text (the TUI's panel, plain mode's and headless's echo).

    summary(items) -> str                 "Tasks 1/3 done · now: fix the parser"
    lines(items, width, max_rows) -> list[tuple[str, str]]   (style, text) rows, header first

Pure text, no Textual: the panel widget (ui/widgets/todos.py) and plain mode both draw from it.
At 80x24 the panel must leave the conversation most of the screen, so a long list shows a window
of max_rows tasks around the first one not done, with a "… N more" row for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ds4agent.ui.fmt import fit

MARKS = {"done": "✔", "in_progress": "▶", "pending": "○"}
STYLES = {"done": "done", "in_progress": "active", "pending": "pending"}
MAX_ROWS = 5  # task rows the open panel shows at most (the header and a "more" row come on top)


def summary(items: Sequence[Any]) -> str:
    if not items:
        return "Tasks: none"
    done = sum(1 for i in items if i.status == "done")
    now = next((i for i in items if i.status == "in_progress"), None)
    head = f"Tasks {done}/{len(items)} done"
    if now is not None:
        return f"{head} · now: {now.text}"
    return head + (" · all done" if done == len(items) else "")


def _window(items: Sequence[Any], max_rows: int) -> tuple[int, int]:
    """[start, end) of the rows shown: from just before the first task not done."""
    if len(items) <= max_rows:
        return 0, len(items)
    first = next((n for n, i in enumerate(items) if i.status != "done"), len(items) - 1)
    start = max(0, min(first - 1, len(items) - max_rows))
    return start, start + max_rows


def lines(items: Sequence[Any], width: int, max_rows: int = MAX_ROWS, *, collapsed: bool = False
          ) -> list[tuple[str, str]]:
    """(style, text) rows of at most `width` cells: the summary, then (open) the tasks shown."""
    out = [("header", fit(summary(items), width))]
    if collapsed or not items:
        return out
    start, end = _window(items, max_rows)
    if start:
        out.append(("more", "  " + fit(f"… {start} done above", width - 2)))
    for item in items[start:end]:
        row = fit(f"{MARKS.get(item.status, '○')} {item.text}", width - 2)
        out.append((STYLES.get(item.status, "pending"), "  " + row))
    if end < len(items):
        out.append(("more", "  " + fit(f"… {len(items) - end} more", width - 2)))
    return out
