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

    def set_items(self, items: tuple[str, ...]) -> None:
        self.items = tuple(items)
        self.display = bool(self.items)
        lines = [
            Content.from_markup("[$text-muted]queued:[/] $t", t=queued_label(t, 70)) for t in self.items[-3:]
        ]
        if len(self.items) > 3:
            lines.insert(0, Content.styled(f"… {len(self.items) - 3} more queued", "$text-muted"))
        lines.append(Content.styled("ctrl+x: edit the last one · esc: send now (interrupts)", "$text-muted"))
        self.update(Content("\n").join(lines))
