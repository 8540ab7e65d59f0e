"""F1 / /help: the commands and keys, two columns; a long meaning wraps inside its own column."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from ds4agent.ui.commands import help_sections
from ds4agent.ui.screens import MODALS_TCSS


class HelpScreen(ModalScreen[None]):
    CSS_PATH = MODALS_TCSS
    BINDINGS = [Binding("escape,q,f1", "close", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Static(Content.from_markup("[b]ds4agent help[/]  [$text-muted](esc closes)[/]"), classes="title")
            with VerticalScroll():
                for heading, rows in help_sections():
                    yield Static(Content.styled(f"{heading}:", "b"), classes="help-heading")
                    with Grid(classes="help-rows"):
                        for what, meaning in rows:
                            yield Static(Content(what), classes="help-what")
                            yield Static(Content(meaning), classes="help-meaning")

    def action_close(self) -> None:
        self.dismiss(None)
