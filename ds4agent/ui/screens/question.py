"""A short question with key accelerators ("Save current session?" y / n / Esc = stay)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ds4agent.ui.screens import MODALS_TCSS, AnswerOnce, TypeaheadGuard


class QuestionScreen(AnswerOnce, ModalScreen[str]):
    """Dismisses with the chosen option key; Esc gives `escape_key` (None: Esc does nothing)."""

    CSS_PATH = MODALS_TCSS

    def __init__(self, question: str, options: tuple[tuple[str, str], ...], *, escape_key: str | None = None) -> None:
        super().__init__()
        self.question = question
        self.options = tuple(options)
        self.escape_key = escape_key

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog question"):
            yield Static(Content.from_markup("[b]$q[/]", q=self.question), classes="title")
            # One row when the choices fit it, else one per line: a row cut at the dialog's edge
            # hid the end of the last choice at 80 columns ("[d] never for this fi").
            row = self._fits_one_row()
            with (Horizontal(classes="buttons") if row else Vertical(classes="choices")):
                for key, label in self.options:
                    yield Button(Content(f"[{key}] {label}"), id=f"answer-{key}", compact=True,
                                 variant="primary" if key == "y" else "default")

    def _fits_one_row(self) -> bool:
        # The dialog's inner width (modals.tcss: 90% of the screen, at most 110, border and
        # padding 6) against the buttons (their label, 2 cells of button padding, 2 of margin).
        inner = min(self.app.size.width * 9 // 10, 110) - 6
        return sum(len(f"[{key}] {label}") + 4 for key, label in self.options) <= inner

    def on_key(self, event) -> None:
        if self.answered:  # a second press while the screen closes: nobody's answer
            event.stop()
            event.prevent_default()
            return
        key = event.character or event.key
        if event.key == "escape":
            event.stop()
            if self.escape_key is not None:
                self.answer(self.escape_key)
            return
        if key in {k for k, _ in self.options}:
            event.stop()
            self.answer(key)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.answer((event.button.id or "").removeprefix("answer-"))


class GuardedQuestionScreen(TypeaheadGuard, QuestionScreen):
    """A question the agent asks (resume, save, continue): typing does not answer it."""

    def on_mount(self) -> None:
        self.mark_opened()

    def on_key(self, event) -> None:
        # Textual then runs QuestionScreen.on_key too (handlers run along the MRO) unless the key
        # was swallowed, which prevents the default. Once answered, keys go nowhere (AnswerOnce).
        if not self.answered:
            self.swallow_typeahead(event)


class ConfirmScreen(QuestionScreen):
    """A destructive yes/no (delete a saved session): only the `y` key (or a click) confirms. No
    button has the focus, so an Enter typed for something else ("dsml⏎" typed as a picker
    filter: `d` opened this question) cannot delete."""

    AUTO_FOCUS = ""
