from pathlib import Path
from typing import ClassVar

MODALS_TCSS = Path(__file__).with_name("modals.tcss")


class TypeaheadGuard:
    """For every question that opens under the user's fingers: a permission question in the
    middle of a turn, the resume question at start-up, the save question of /load, /new or /quit.
    Keys typed for the editor must not answer them ("/rewind 9" typed right after "/load 3f2a"
    would answer "n: don't save"; "yes" typed as a follow-up would allow a bash command). A key
    answers only once the question has been on screen for `app.typeahead_grace` seconds and the
    user paused that long since the previous key; before that it goes where it was meant to go,
    the editor: a character is inserted, Backspace deletes, Enter sends the line (as it would
    have a moment earlier, before the question appeared: a message is queued, a command runs or
    is refused by the busy rule). Such screens focus no button, so Enter never picks one.
    Each screen calls `mark_opened()` from its on_mount.
    """

    AUTO_FOCUS: ClassVar[str | None] = ""  # "" focuses nothing (None would mean the app's default: the first button)
    opened_at = float("-inf")

    def mark_opened(self) -> None:
        self.opened_at = self.app.clock()  # type: ignore[attr-defined]

    def on_paste(self, event) -> None:
        """A paste is never an answer: it goes to the editor (it was lost under the question)."""
        from textual import events

        event.stop()
        self.app.input.post_message(events.Paste(event.text))  # type: ignore[attr-defined]

    def swallow_typeahead(self, event) -> bool:
        app = self.app  # type: ignore[attr-defined]
        grace = getattr(app, "typeahead_grace", 0.0)
        if grace <= 0:
            return False
        now = app.clock()
        if now - getattr(app, "last_typing", float("-inf")) >= grace and now - self.opened_at >= grace:
            return False
        app.last_typing = now
        event.stop()
        event.prevent_default()
        if event.key == "enter":
            app.input.send()
        elif event.key == "backspace":
            app.input.action_delete_left()
        elif event.is_printable and event.character:
            app.input.insert(event.character)
        return True


class AnswerOnce:
    """A question answered at most once: the first key or click dismisses it; a second one (a
    double press of `y`, a key repeat, a click landing while the screen closes) is ignored.
    Dismissing twice would pop the screen under it (Textual: "Can't pop screen") and hand the
    caller a second answer."""

    answered = False

    def answer(self, value) -> None:
        if self.answered:
            return
        self.answered = True
        self.dismiss(value)  # type: ignore[attr-defined]
