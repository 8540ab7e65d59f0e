"""Rewind (/rewind, Esc Esc on an empty prompt): pick a user turn, then what to restore.

Step one lists the session's user turns (age, first line), the latest highlighted; Enter picks.
Step two offers the actions, restore code and conversation first (the default, Enter), and says
that changes made through bash are not undone. Esc goes back a step, then closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ds4agent.ui.fmt import rewind_point_line
from ds4agent.ui.screens import MODALS_TCSS

ACTIONS: tuple[tuple[str, str], ...] = (
    ("both", "Restore code and conversation"),
    ("chat", "Restore conversation"),
    ("code", "Restore code"),
    ("fork", "Fork the conversation from here (a new saved session)"),
)


class HistoryList(OptionList):
    """An option list that stops at its ends: Down on the last turn stays there (a history, not a
    ring: wrapping to the first turn would put the oldest point under a hurried Enter)."""

    def action_cursor_down(self) -> None:
        if self.highlighted is None or self.highlighted < self.option_count - 1:
            super().action_cursor_down()

    def action_cursor_up(self) -> None:
        if self.highlighted is None or self.highlighted > 0:
            super().action_cursor_up()


KEYS_HINT = "↑↓: choose · enter: pick · esc: back"


class RewindScreen(ModalScreen[tuple[int, str] | None]):
    """Dismisses with (turn number, mode) or None."""

    CSS_PATH = MODALS_TCSS
    BINDINGS = [Binding("escape", "back", "back")]

    def __init__(self, points: Sequence[Any], note: str = "", *, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.points = tuple(points)
        self.note = note
        self._now = now
        self.chosen: Any = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog rewind"):
            yield Static(Content.from_markup("[b]Rewind[/] [$text-muted]to before which message?[/]"),
                         classes="title", id="rewind-title")
            now = self._now()
            yield HistoryList(*[Option(rewind_point_line(p, now), id=f"turn-{p.number}") for p in self.points],
                              id="rewind-turns")
            yield HistoryList(*[Option(label, id=f"mode-{mode}") for mode, label in ACTIONS],
                              id="rewind-actions")
            yield Static(Content.from_markup("[$text-muted]$n[/]", n=self.note.capitalize()), id="rewind-note")
            yield Static(KEYS_HINT, classes="hint")

    def on_mount(self) -> None:
        turns = self.query_one("#rewind-turns", OptionList)
        self.query_one("#rewind-actions", OptionList).display = False
        self.query_one("#rewind-note", Static).display = False
        if self.points:
            turns.highlighted = len(self.points) - 1
        turns.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        oid = event.option.id or ""
        if oid.startswith("turn-"):
            self.chosen = int(oid.removeprefix("turn-"))
            point = self.points[self.chosen - 1]
            self.query_one("#rewind-title", Static).update(Content.from_markup(
                "[b]Rewind to turn $n[/] [$text-muted]$p[/]", n=str(self.chosen), p=point.preview))
            self.query_one("#rewind-turns", OptionList).display = False
            actions = self.query_one("#rewind-actions", OptionList)
            actions.display = True
            self.query_one("#rewind-note", Static).display = True
            actions.highlighted = 0
            actions.focus()
        elif oid.startswith("mode-") and self.chosen is not None:
            self.dismiss((self.chosen, oid.removeprefix("mode-")))

    def action_back(self) -> None:
        if self.chosen is None:
            self.dismiss(None)
            return
        self.chosen = None
        self.query_one("#rewind-title", Static).update(
            Content.from_markup("[b]Rewind[/] [$text-muted]to before which message?[/]"))
        self.query_one("#rewind-actions", OptionList).display = False
        self.query_one("#rewind-note", Static).display = False
        turns = self.query_one("#rewind-turns", OptionList)
        turns.display = True
        turns.focus()
