"""Session picker (/load without a prefix, Ctrl+L): a filterable table of saved sessions, newest first.

The table has the focus: Enter loads the highlighted session, Ctrl+D (or Delete in the table)
deletes it after a y/n confirmation, Esc closes. Typing any character adds to the filter (title or
id), which keeps what was typed until it is edited or cleared (Backspace works from the table too);
Enter in the filter loads the highlighted row, Down goes back to the table. No letter deletes: a
filter may start with any of them.
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
from textual.widgets import DataTable, Input, Static

from ds4agent.ui.fmt import clip, fit, format_age, format_size, human_count
from ds4agent.ui.screens import MODALS_TCSS
from ds4agent.ui.screens.question import ConfirmScreen
from ds4agent.ui.toolview import field

COLUMNS = ("id", "title", "age", "tokens", "size")
SCROLLBAR = 2  # the table's vertical scrollbar, when the list is long


def _title_cell(title: str, parent: str, width: int) -> str:
    """The title, then which session it was forked from; where the column is too narrow for the
    parent's id beside a readable title (80 columns), only that it is a fork."""
    if not parent:
        return fit(title, width)
    suffix = f"  (fork of {parent})"
    if width - len(suffix) < 20:
        suffix = "  (fork)"
    return fit(title, max(1, width - len(suffix))) + suffix


def _used_at(session: Any) -> float:
    return field(session, "last_used", default=0) or field(session, "created_at", default=0) or 0


def _tokens_cell(session: Any) -> str:
    """The token count, marked when the session was saved without its KV state (a load prefills
    that many tokens)."""
    tokens = human_count(field(session, "tokens", default=0) or 0)
    return f"{tokens} stripped" if field(session, "stripped", default=False) else tokens


class SessionPicker(ModalScreen[str | None]):
    """Dismisses with the chosen session id (full) or None."""

    CSS_PATH = MODALS_TCSS
    BINDINGS = [
        Binding("escape", "close", "close"),
        # priority: the filter field would take Ctrl+D as "delete right"
        Binding("ctrl+d", "delete", "delete", show=False, priority=True),
        Binding("delete", "delete", "delete", show=False),
    ]

    def __init__(self, sessions: Sequence[Any], *, directory: str = "",
                 delete: Callable[[str], str | None] | None = None, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        # The order /list shows (the agent's): readable sessions newest first by last use, else
        # creation, then the unreadable files (sorting again keeps the promise local).
        self.sessions = sorted(sessions, key=lambda s: (bool(getattr(s, "unreadable", "")), -_used_at(s)))
        self.directory = directory
        self._delete = delete
        self._now = now
        self.rows: list[Any] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker"):
            yield Static(Content.from_markup("[b]Load a session from[/] [$text-muted]$d[/]", d=self.directory),
                         classes="title")
            # select_on_focus off: the field takes the focus at the first typed key, and selecting
            # its text then would let the next key (after a pause) replace what was typed so far.
            yield Input(placeholder="filter by title or id", id="picker-filter", select_on_focus=False)
            yield DataTable(id="picker-table", cursor_type="row", zebra_stripes=True)
            yield Static("enter: load · ctrl+d: delete · type: filter · esc: close", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*COLUMNS)
        self._fill("")
        table.focus()

    def _fill(self, needle: str) -> None:
        table = self.query_one(DataTable)
        table.clear()
        needle = needle.lower().strip()
        now = self._now()
        self.rows = []
        cells = []
        for s in self.sessions:
            sid = str(field(s, "id", default=""))
            title = str(field(s, "title", default="") or "")
            if needle and needle not in title.lower() and not sid.lower().startswith(needle):
                continue
            self.rows.append(s)
            cells.append((sid, str(field(s, "short_id", default=sid[:8])), title or "(untitled)",
                          format_age(now - (_used_at(s) or now)),
                          _tokens_cell(s),
                          format_size(field(s, "size_bytes", default=0) or 0),
                          str(field(s, "forked_from", default="") or "")))
        # The title takes what the other columns leave, so age, tokens and size always show.
        others = sum(max([len(h)] + [len(c[i]) for c in cells]) for i, h in ((1, "id"), (3, "age"),
                                                                              (4, "tokens"), (5, "size")))
        title_width = max(10, self._table_width() - others - 2 * len(COLUMNS) - SCROLLBAR)
        for sid, short, title, age, tokens, size, parent in cells:
            table.add_row(short, _title_cell(title, parent, title_width), age, tokens, size, key=sid)
        if not self.rows:
            table.add_row("", "(no sessions)" if not needle else "(no match)", "", "", "")

    def _table_width(self) -> int:
        """The table's width; before the first layout, what the dialog's CSS gives it (90% of the
        screen, at most 110, less border and padding)."""
        width = self.query_one(DataTable).size.width
        return width if width > 0 else min(110, self.app.size.width * 9 // 10) - 6

    def on_resize(self) -> None:
        self._fill(self.query_one(Input).value)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._fill(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._choose()

    def on_key(self, event) -> None:
        filt = self.query_one(Input)
        if self.focused is filt:
            if event.key == "down":
                event.stop()
                self.query_one(DataTable).focus()
            return
        if event.key == "backspace" and filt.value:
            event.stop()
            filt.value = filt.value[:-1]
        elif event.is_printable and event.character:
            event.stop()
            filt.focus()
            filt.cursor_position = len(filt.value)
            filt.insert_text_at_cursor(event.character)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._choose()

    def _highlighted(self) -> Any | None:
        table = self.query_one(DataTable)
        row = table.cursor_row
        if 0 <= row < len(self.rows):
            return self.rows[row]
        return None

    def _choose(self) -> None:
        s = self._highlighted()
        if s is not None:
            self.dismiss(str(field(s, "id")))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        s = self._highlighted()
        delete = self._delete
        if s is None or delete is None:
            return
        sid = str(field(s, "id"))
        short = str(field(s, "short_id", default=sid[:8]))
        title = str(field(s, "title", default="") or "")

        def answered(key: str | None) -> None:
            if key != "y":
                return
            error = delete(sid)
            if error:
                self.notify(error, severity="error")
                return
            self.sessions = [x for x in self.sessions if str(field(x, "id")) != sid]
            self._fill(self.query_one(Input).value)

        self.app.push_screen(
            ConfirmScreen(f'Delete session {short} "{clip(title, 40)}"?', (("y", "delete"), ("n", "keep")),
                           escape_key="n"),
            answered,
        )
