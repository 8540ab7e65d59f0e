from pathlib import Path

MODALS_TCSS = Path(__file__).with_name("modals.tcss")


class TypeaheadGuard:
    """For questions that open on their own, under the user's fingers: a permission question in the
    middle of a turn, the resume question at start-up. Keys typed for the editor must not answer
    them ("one" typed while the model loads would answer "n: discard" to the resume question;
    "yes" typed as a follow-up would allow a bash command), so while the user is still typing,
    i.e. less than `app.typeahead_grace` seconds after the previous key, a key does not answer:
    a printable character goes on into the editor, where it was meant to go, and the next key
    after a pause answers. Such screens also focus no button, so Enter never picks one.
    """

    AUTO_FOCUS = ""  # "" focuses nothing (None would mean the app's default: the first button)

    def swallow_typeahead(self, event) -> bool:
        app = self.app  # type: ignore[attr-defined]
        grace = getattr(app, "typeahead_grace", 0.0)
        if grace <= 0:
            return False
        now = app.clock()
        if now - getattr(app, "last_typing", float("-inf")) >= grace:
            return False
        app.last_typing = now
        event.stop()
        event.prevent_default()
        if event.is_printable and event.character:
            app.input.insert(event.character)
        return True
