"""F1 / /help: the commands and keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from ds4agent.ui.commands import help_text
from ds4agent.ui.screens import MODALS_TCSS


class HelpScreen(ModalScreen[None]):
    CSS_PATH = MODALS_TCSS
    BINDINGS = [Binding("escape,q,f1", "close", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Static(Content.from_markup("[b]ds4agent help[/]  [$text-muted](esc closes)[/]"), classes="title")
            with VerticalScroll():
                yield Static(Content(help_text()))

    def action_close(self) -> None:
        self.dismiss(None)
