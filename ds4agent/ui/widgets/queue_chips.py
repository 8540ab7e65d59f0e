"""Messages typed while the model works, shown as dim chips above the input.

The chips are the widget's own state (Textual vars): whoever changes them assigns, and the chips
repaint themselves."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import var
from textual.widgets import Static

from ds4agent.ui.fmt import queued_label


class QueueChips(Static):
    # Typed before the agent object existed: the app hands them to the agent once it exists.
    waiting: var[tuple[str, ...]] = var((), init=False)
    # The agent's own queue, as its last QueueChanged event said.
    queued: var[tuple[str, ...]] = var((), init=False)
    # The model is still loading, when Esc cannot interrupt anything (the start-up is never cut
    # short) and the messages simply go once it is ready: the hint says so.
    loading = var(True, init=False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False

    @property
    def items(self) -> tuple[str, ...]:
        return self.waiting + self.queued

    def watch_waiting(self) -> None:
        self.redraw()

    def watch_queued(self) -> None:
        self.redraw()

    def watch_loading(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        items = self.items
        self.display = bool(items)
        lines = [Content.from_markup("[$text-muted]queued:[/] $t", t=queued_label(t, 70)) for t in items[-3:]]
        if len(items) > 3:
            lines.insert(0, Content.styled(f"… {len(items) - 3} more queued", "$text-muted"))
        hint = "sent when the model is ready" if self.loading else "esc: send now (interrupts)"
        lines.append(Content.styled(f"ctrl+x: edit the last one · {hint}", "$text-muted"))
        self.update(Content("\n").join(lines))
