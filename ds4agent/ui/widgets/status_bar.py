"""Status bar and header: both redraw from a StatusState, at most 10 times a second.

The event boundary only mutates the StatusState and marks it dirty; a 0.1 s timer draws it. That
keeps a burst of status events (one per decoded token on a fast model) from costing a repaint each.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from ds4agent.ui import fmt

STATE_STYLE = {
    "error": "$text-error",
    "interrupted": "$text-warning",
    "loading": "$text-warning",
    "prefill": "$text-accent",
    "generating": "$text-accent",
    "tool": "$text-accent",
    "compacting": "$text-warning",
    "saving": "$text-warning",
}

REFRESH_INTERVAL = 0.1


class StatusBar(Static):
    def __init__(self, state: fmt.StatusState, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.model = state
        self.dirty = True
        self.renders = 0

    def on_mount(self) -> None:
        self.draw()
        self.set_interval(REFRESH_INTERVAL, self.draw_if_dirty)

    def mark(self) -> None:
        self.dirty = True

    def draw_if_dirty(self) -> None:
        if self.dirty:
            self.draw()

    def draw(self) -> None:
        s = self.model
        self.dirty = False
        self.renders += 1
        sep = Content.from_markup(" [$text-muted]·[/] ")
        parts = [Content.styled(fmt.state_segment(s), STATE_STYLE.get(s.state, "b"))]
        parts.append(Content(fmt.ctx_segment(s)))
        speed = fmt.speed_segment(s)
        if speed:
            parts.append(Content.styled(speed, "$text-muted"))
        parts.append(Content.styled(fmt.saved_segment(s), "$text-warning" if s.dirty else "$text-success"))
        # Also in the header; repeated last here so a narrow terminal cuts these first.
        parts.append(Content.styled(f"{s.think_mode} · {s.permission}", "$text-muted"))
        self.update(sep.join(parts))

    @property
    def plain(self) -> str:
        return fmt.status_line(self.model)


class HeaderLine(Static):
    def __init__(self, state: fmt.StatusState, cwd: str, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.model = state
        self.cwd = cwd
        self._last: tuple | None = None

    def on_mount(self) -> None:
        self.draw()
        self.set_interval(REFRESH_INTERVAL, self.draw)

    def draw(self) -> None:
        s = self.model
        key = (s.session_id, s.title, s.think_mode, s.permission, s.dirty)
        if key == self._last:
            return
        self._last = key
        left = Content.from_markup(
            "[b $accent]ds4agent[/] [$text-muted]─[/] $cwd [$text-muted]─[/] $session",
            cwd=fmt.shorten_home(self.cwd),
            session=fmt.session_label(s.session_id, s.title),
        )
        right = Content.from_markup("[$text-muted]$think · $perm[/]", think=s.think_mode, perm=s.permission)
        width = max(0, self.size.width - 2)
        gap = max(1, width - left.cell_length - right.cell_length)
        self.update(left + Content(" " * gap) + right)

    def on_resize(self) -> None:
        self._last = None
        self.draw()
