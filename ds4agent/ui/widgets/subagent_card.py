"""A subagent's card: what the `task` tool's subagent is doing, and afterwards what it did.

    ⎇ subagent · find where parse is defined          running · 41 tokens
    │ ⏺ search query='def parse'                          (its last lines, while it runs)
    │   ⎿ 1 match shown

Done, it folds to its header and the first line of its summary; a click (or Ctrl+O on the last
card) unfolds its whole transcript: reasoning dimmed, tool calls and their results' first lines,
its answer. The tail and the fold keep it to a few rows, so an 80x24 screen still shows the turn.
"""

from __future__ import annotations

from textual.content import Content
from textual.events import Click
from textual.widgets import Static

from ds4agent.ui.fmt import clip

TAIL_LINES = 4  # transcript lines shown while it runs
MAX_CHARS = 64_000  # what the card keeps of a long transcript (its end)
GOAL_WIDTH = 36
LINE_WIDTH = 74  # a live tail line: its end, so the tail is TAIL_LINES rows at 80 columns

_STYLE = {"thinking": "$text-muted italic", "text": "", "tool": "$text-accent", "result": "$text-muted",
          "error": "$text-error"}


class SubagentCard(Static):
    def __init__(self, sid: str, goal: str, *, writes: bool = False) -> None:
        super().__init__("", classes="subagent")
        self.sid = sid
        self.goal = goal
        self.writes = writes
        self.parts: list[tuple[str, str]] = []  # (kind, text), consecutive deltas of a kind merged
        self.tokens = 0
        self.running = True
        self.expanded = False
        self.outcome = ""  # "done · 3.2 s · 86 tokens" once over
        self.rounds = 0
        self.summary = ""
        self._redraw()

    @classmethod
    def replay(cls, record) -> SubagentCard:
        """A saved subagent (agent.identity.SubagentRecord), folded, as it was when it ended."""
        card = cls(record.id, record.goal)
        for kind, text in record.lines:
            card.delta(kind, text, 0)
        card.finish(record.summary, record.reason, record.rounds, record.generated, record.seconds)
        return card

    def delta(self, kind: str, text: str, tokens: int = 1) -> None:
        """More of its transcript; `tokens`: the generated tokens a (merged) delta stands for."""
        if kind in ("thinking", "text"):
            self.tokens += tokens
        if kind in ("tool", "result", "error"):
            text = ("⏺ " if kind == "tool" else "  ⎿ " if kind == "result" else "  ✗ ") + text
            self.parts.append((kind, "\n" + text + "\n"))
        elif self.parts and self.parts[-1][0] == kind:
            self.parts[-1] = (kind, self.parts[-1][1] + text)
        else:
            # reasoning and answer each start on a line of their own
            self.parts.append((kind, text if not self.parts or self.parts[-1][1].endswith("\n") else "\n" + text))
        self._trim()
        self._redraw()

    def finish(self, summary: str, reason: str, rounds: int, generated: int, seconds: float) -> None:
        self.running = False
        self.summary = summary
        verdict = "done" if reason == "done" else {"interrupted": "stopped", "budget": "out of budget",
                                                   "context_full": "out of context"}.get(reason, reason)
        self.rounds = rounds
        self.outcome = f"{verdict} · {seconds:.1f} s · {generated} tokens"
        self._redraw()

    def toggle(self) -> None:
        self.expanded = not self.expanded
        self._redraw()

    def on_click(self, event: Click) -> None:
        self.toggle()

    def _trim(self) -> None:
        size = sum(len(t) for _, t in self.parts)
        while size > MAX_CHARS and len(self.parts) > 1:
            size -= len(self.parts.pop(0)[1])

    def _transcript(self, tail: int = 0) -> Content:
        """The transcript as styled text; with `tail`, only its last parts holding about that many
        characters (a running card redraws per token: its cost must not grow with the run)."""
        parts = self.parts
        if tail:
            size, start = 0, len(parts)
            while start > 0 and size < tail:
                start -= 1
                size += len(parts[start][1])
            parts = parts[start:]
        pieces = [Content.styled(text[-tail:] if tail else text, _STYLE.get(kind, "")) for kind, text in parts]
        return Content("").join(pieces) if pieces else Content("")

    def _redraw(self) -> None:
        arrow = "▾" if self.expanded else "▸"
        mode = "" if not self.writes else " (may write)"
        state = f"running · {self.tokens} tokens" if self.running else self.outcome
        head = Content.from_markup(f"[b $accent]⎇[/] [b]subagent[/]{mode} · $goal  [$text-muted]$state[/]",
                                   goal=clip(self.goal, GOAL_WIDTH), state=state)
        rule = Content.from_markup("[$text-muted]│[/] ")
        if self.running or self.expanded:
            live = self.running and not self.expanded
            lines = self._transcript(tail=4 * TAIL_LINES * LINE_WIDTH if live else 0).split("\n")
            lines = [ln for ln in lines if ln.plain.strip()]
            if live:
                lines = [ln if len(ln.plain) <= LINE_WIDTH else Content("…") + ln[len(ln.plain) - LINE_WIDTH + 1:]
                         for ln in lines[-TAIL_LINES:]]
            body = [rule + ln for ln in lines]
            if not self.running:
                head = Content.from_markup(f"[$text-muted]{arrow}[/] ") + head
                body.append(rule + Content.styled(f"({self.rounds} round{'s' * (self.rounds != 1)})", "$text-muted"))
            self.update(Content("\n").join([head, *body]))
            return
        summary = clip(self.summary, GOAL_WIDTH + 12) if self.summary else "(no summary)"
        fold = Content.from_markup(f"[$text-muted]{arrow}[/] ") + head
        self.update(Content("\n").join([fold, rule + Content(summary)]))
