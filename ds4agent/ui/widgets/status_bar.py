"""Status bar and header: both repaint themselves from the StatusState they are given.

The event boundary only mutates the StatusState; nobody tells a bar to redraw. Each bar's 0.1 s
timer copies the fields it shows into its `shown` var, and Textual calls `watch_shown` only when
that copy differs from the last one: a burst of status events (one per decoded token on a fast
model) costs at most 10 repaints a second, and an unchanged state costs none.
"""

from __future__ import annotations

from dataclasses import astuple

from textual.content import Content
from textual.reactive import var
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
    # The state's fields as last drawn (see the module's docstring); () before the first look.
    shown: var[tuple[object, ...]] = var((), init=False)

    def __init__(self, state: fmt.StatusState, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.model = state
        self.renders = 0

    def on_mount(self) -> None:
        self.look()
        self.set_interval(REFRESH_INTERVAL, self.look)

    def look(self) -> None:
        self.shown = astuple(self.model)

    def watch_shown(self) -> None:
        self.draw()

    def on_resize(self) -> None:
        self.draw()

    def draw(self) -> None:
        self.renders += 1
        self.update(self.fitted(self.size.width))  # the content width (padding excluded)

    def fitted(self, width: int) -> Content:
        """The fullest status line that fits `width` cells: a narrow terminal first drops the power
        cap, then the last speeds, then the compaction
        threshold, then the context meter, then the saved mark, so the state and the device stay
        readable; a state that still does not fit (a long error message) is cut and ends in "…"."""
        s = self.model
        sep = Content.from_markup(" [$text-muted]·[/] ")
        state = Content.styled(fmt.state_segment(s), STATE_STYLE.get(s.state, "b"))
        saved = Content.styled(fmt.saved_segment(s), "$text-warning" if s.dirty else "$text-success")
        speed = fmt.speed_segment(s)
        speed_part = [Content.styled(speed, "$text-muted")] if speed else []
        # The think and permission modes are the header's (right above): not repeated here. A power
        # cap is not in the header, so it shows with the device.
        power = [Content.styled(f"power {s.power}%", "$text-muted")] if s.power < 100 else []
        device = [Content.styled(s.device, "$text-muted")] if s.device else []
        full_ctx, short_ctx = Content(fmt.ctx_segment(s)), Content(fmt.ctx_segment(s, threshold=False))
        variants = (
            [state, full_ctx, *speed_part, saved, *power, *device],
            [state, full_ctx, *speed_part, saved, *device],
            [state, full_ctx, saved, *device],
            [state, short_ctx, saved, *device],
            [state, saved, *device],
            [state, *device],  # a long error message: the message itself matters most
        )
        for parts in variants:
            line = sep.join(parts)
            if width <= 0 or line.cell_length <= width:
                return line
        # The state (an error message) is what gets cut; the device stays whole.
        tail = sep.join(["", *device]) if device else Content("")
        room = width - tail.cell_length
        if room >= 8:
            return state.truncate(room, ellipsis=True) + tail
        return line.truncate(width, ellipsis=True)

    @property
    def plain(self) -> str:
        return fmt.status_line(self.model)


class HeaderLine(Static):
    # The session and the modes as last drawn (see the module's docstring).
    shown: var[tuple[object, ...]] = var((), init=False)

    def __init__(self, state: fmt.StatusState, cwd: str, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.model = state
        self.cwd = cwd

    def on_mount(self) -> None:
        self.look()
        self.set_interval(REFRESH_INTERVAL, self.look)

    def look(self) -> None:
        s = self.model
        self.shown = (s.session_id, s.title, s.think_mode, s.permission, s.dirty)

    def watch_shown(self) -> None:
        self.draw()

    def draw(self) -> None:
        s = self.model
        width = self.size.width  # the content width (padding excluded)
        modes = f"{s.think_mode} · {s.permission}"
        place, session = fmt.header_parts(self.cwd, s.session_id, s.title, modes, width)
        left = Content.from_markup(
            "[b $accent]ds4agent[/] [$text-muted]─[/] $cwd [$text-muted]─[/] $session",
            cwd=place, session=session,
        )
        right = Content.from_markup("[$text-muted]$modes[/]", modes=modes)
        gap = max(1, width - left.cell_length - right.cell_length)
        self.update(left + Content(" " * gap) + right)

    def on_resize(self) -> None:
        self.draw()
