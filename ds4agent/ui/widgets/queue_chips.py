"""Messages typed while the model works, shown as dim chips above the input."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from ds4agent.ui.fmt import queued_label


class QueueChips(Static):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.items: tuple[str, ...] = ()
        self.display = False

    def set_items(self, items: tuple[str, ...], *, loading: bool = False) -> None:
        """`loading`: the model is still loading, when Esc cannot interrupt anything (the start-up
        is never cut short) and the messages simply go once it is ready: the hint says so."""
        self.items = tuple(items)
        self.display = bool(self.items)
        lines = [
            Content.from_markup("[$text-muted]queued:[/] $t", t=queued_label(t, 70)) for t in self.items[-3:]
        ]
        if len(self.items) > 3:
            lines.insert(0, Content.styled(f"… {len(self.items) - 3} more queued", "$text-muted"))
        hint = "sent when the model is ready" if loading else "esc: send now (interrupts)"
        lines.append(Content.styled(f"ctrl+x: edit the last one · {hint}", "$text-muted"))
        self.update(Content("\n").join(lines))
