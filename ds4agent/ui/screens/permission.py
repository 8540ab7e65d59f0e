"""Permission question: "Allow bash?" with the command or the diff, answered y / s / n (or m).

Never times out into a "no" (ui.md): the screen stays until a key is pressed. `m` denies with a
message to the model, typed in a one-line field.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static
from textual.widgets.button import ButtonVariant

from ds4agent.ui import toolview
from ds4agent.ui.screens import MODALS_TCSS, AnswerOnce, TypeaheadGuard
from ds4agent.ui.widgets.conversation import body_content

DEFAULT_OPTIONS = (("y", "allow once"), ("s", "allow for this session"), ("n", "deny"))
MAX_DETAIL_LINES = 40


def detail_content(detail: str) -> Content:
    """A diff is coloured line by line; anything else (a command) is shown as it is."""
    lines = detail.rstrip("\n").split("\n") if detail else []
    if len(lines) > MAX_DETAIL_LINES:
        hidden = len(lines) - MAX_DETAIL_LINES
        lines = lines[: MAX_DETAIL_LINES - 5] + [f"… {hidden} lines …"] + lines[-5:]
    looks_like_diff = any(ln.startswith(("@@", "+++", "---")) for ln in lines)
    if looks_like_diff:
        return body_content(toolview.diff_lines("\n".join(lines)))
    return Content("\n").join([Content(ln) for ln in lines])


class PermissionScreen(AnswerOnce, TypeaheadGuard, ModalScreen[tuple[str, str]]):
    """Dismisses with (answer key, message)."""

    CSS_PATH = MODALS_TCSS
    BINDINGS = [Binding("escape", "noop", show=False)]

    def __init__(self, question: str, detail: str, options: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.options = tuple(options) or DEFAULT_OPTIONS
        self._keys = {k for k, _ in self.options}
        # `m` opens the message field; an option with key m names what the message is for (a plan
        # sent back with comments), else it is a deny with the reason.
        self._message_label = dict(self.options).get("m", "deny, say why")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog permission"):
            yield Static(Content.from_markup("[b]$q[/]", q=self.question), classes="title")
            if self.detail:
                with VerticalScroll(classes="detail"):
                    yield Static(detail_content(self.detail))
            # One choice per line: the session-scope label names the scope ("commands starting with
            # git", "all edit calls in the working directory") and must be readable in full.
            with Vertical(classes="choices"):
                for key, label in self.options:
                    if key == "m":
                        continue
                    variant: ButtonVariant = "error" if key == "n" else ("primary" if key == "y" else "default")
                    yield Button(Content(f"[{key}] {label}"), id=f"answer-{key}", variant=variant, compact=True)
                if "n" in self._keys:
                    yield Button(Content(f"[m] {self._message_label}"), id="answer-m", compact=True)
            hint = "your comments (Enter sends them)" if "m" in self._keys else "message to the model (Enter to deny)"
            yield Input(placeholder=hint, id="deny-message")

    def on_mount(self) -> None:
        self.mark_opened()
        self.query_one("#deny-message", Input).display = False

    def on_key(self, event) -> None:
        if self.answered:  # a second press while the screen closes: nobody's answer
            event.stop()
            event.prevent_default()
            return
        if isinstance(self.focused, Input):
            if event.key == "escape":
                event.stop()
                self.query_one("#deny-message", Input).display = False
                self.set_focus(None)
            return
        if self.swallow_typeahead(event):
            return
        # Nothing has the focus (TypeaheadGuard), so the scroll keys move a long command or diff.
        scroll = {"up": "scroll_up", "down": "scroll_down", "pageup": "scroll_page_up",
                  "pagedown": "scroll_page_down", "home": "scroll_home", "end": "scroll_end"}.get(event.key)
        if scroll is not None and self.query(".detail"):
            event.stop()
            getattr(self.query_one(".detail", VerticalScroll), scroll)(animate=False)
            return
        key = event.character or event.key
        if key == "m" and "n" in self._keys:
            event.stop()
            self._ask_message()
        elif key in self._keys:
            event.stop()
            self.answer((key, ""))

    def _ask_message(self) -> None:
        field = self.query_one("#deny-message", Input)
        field.display = True
        field.focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        key = (event.button.id or "").removeprefix("answer-")
        if key == "m":
            self._ask_message()
        elif key:
            self.answer((key, ""))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.answer(("n", event.value.strip()))

    def action_noop(self) -> None:
        """Esc does not answer: a permission question never turns into a silent "no"."""
