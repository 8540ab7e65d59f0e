"""Session picker (/load without a prefix, Ctrl+L): a filterable table of saved sessions, newest first.

The table has the focus: Enter loads the highlighted session, `d` deletes it (after a y/n
confirmation), Esc closes. Typing any other character starts the filter (title or id); Enter in the
filter loads the highlighted row, Down goes back to the table.
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

from ds4agent.ui.fmt import clip, format_age, format_size, human_count
from ds4agent.ui.screens import MODALS_TCSS
from ds4agent.ui.screens.question import ConfirmScreen
from ds4agent.ui.toolview import field


class SessionPicker(ModalScreen[str | None]):
    """Dismisses with the chosen session id (full) or None."""

    CSS_PATH = MODALS_TCSS
    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("d", "delete", "delete", show=False),
    ]

    def __init__(self, sessions: Sequence[Any], *, directory: str = "",
                 delete: Callable[[str], str | None] | None = None, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        # newest first by last use (the agent already sorts; sorting again keeps the promise local)
        self.sessions = sorted(sessions, key=lambda s: -(field(s, "last_used", default=0) or 0))
        self.directory = directory
        self._delete = delete
        self._now = now
        self.rows: list[Any] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker"):
            yield Static(Content.from_markup("[b]Load a session[/] [$text-muted]$d[/]", d=self.directory),
                         classes="title")
            yield Input(placeholder="filter by title or id", id="picker-filter")
            yield DataTable(id="picker-table", cursor_type="row", zebra_stripes=True)
            yield Static("enter: load · d: delete · type: filter · esc: close", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "title", "age", "tokens", "size")
        self._fill("")
        table.focus()

    def _fill(self, needle: str) -> None:
        table = self.query_one(DataTable)
        table.clear()
        needle = needle.lower().strip()
        now = self._now()
        self.rows = []
        for s in self.sessions:
            sid = str(field(s, "id", default=""))
            title = str(field(s, "title", default="") or "")
            if needle and needle not in title.lower() and not sid.lower().startswith(needle):
                continue
            self.rows.append(s)
            parent = str(field(s, "forked_from", default="") or "")
            shown = clip(title or "(untitled)", 60 - (len(parent) + 11 if parent else 0))
            table.add_row(
                str(field(s, "short_id", default=sid[:8])),
                shown + (f"  (fork of {parent})" if parent else ""),
                format_age(now - (field(s, "last_used", default=now) or now)),
                human_count(field(s, "tokens", default=0) or 0),
                format_size(field(s, "size_bytes", default=0) or 0),
                key=sid,
            )
        if not self.rows:
            table.add_row("", "(no sessions)" if not needle else "(no match)", "", "", "")

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
        if event.is_printable and event.character and event.character not in ("d",):
            event.stop()
            filt.focus()
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
        if s is None or self._delete is None:
            return
        sid = str(field(s, "id"))
        short = str(field(s, "short_id", default=sid[:8]))
        title = str(field(s, "title", default="") or "")

        def answered(key: str | None) -> None:
            if key != "y":
                return
            error = self._delete(sid)
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
