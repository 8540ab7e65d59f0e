"""The model's task list above the input: a summary line, and the tasks when open.

Hidden while there is no list. Ctrl+G (or a click) folds it to its summary line. Its height is
bounded (todo_panel.MAX_ROWS tasks, a header and "more" rows) so that at 80x24 the conversation
keeps most of the screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.content import Content
from textual.reactive import var
from textual.widgets import Static

from ds4agent.ui import todo_panel

_STYLE = {"header": "bold", "done": "$text-muted strike", "active": "bold $accent", "pending": "",
          "more": "$text-muted"}


class TodoPanel(Static):
    # The panel's own state (Textual vars): the app assigns `items`, Ctrl+G or a click flips
    # `collapsed`, and the panel repaints itself.
    items: var[tuple[Any, ...]] = var((), init=False)
    collapsed = var(False, init=False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False

    def set_items(self, items: Sequence[Any]) -> None:
        self.items = tuple(items)

    def watch_items(self) -> None:
        self.display = bool(self.items)
        self.refresh_lines()

    def watch_collapsed(self) -> None:
        self.refresh_lines()

    def toggle(self) -> None:
        self.collapsed = not self.collapsed

    def on_click(self) -> None:
        self.toggle()

    def on_resize(self) -> None:
        self.refresh_lines()

    def refresh_lines(self) -> None:
        width = max(20, (self.size.width or 78) - 2)
        rows = todo_panel.lines(self.items, width, collapsed=self.collapsed)
        hint = " (ctrl+g: open)" if self.collapsed else ""
        contents = [Content.styled(text + (hint if style == "header" else ""), _STYLE.get(style, ""))
                    for style, text in rows]
        self.update(Content("\n").join(contents))
