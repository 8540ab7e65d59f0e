"""The conversation: user turns, streamed thinking and answers, tool cards, notices.

Streaming discipline (ui.md): an answer is one `Markdown` widget fed through
`Markdown.get_stream()`, which appends fragments and merges them when the screen falls behind; a
message is never re-rendered whole per token. The container is anchored (`anchor()`), so it follows
the tail until the user scrolls up, and End (or reaching the bottom) re-attaches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.events import Click
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from ds4agent.ui import codeview, toolview
from ds4agent.ui.fmt import clip
from ds4agent.ui.widgets.subagent_card import SubagentCard

THINKING_TAIL_LINES = 4  # lines of live reasoning shown while it streams
# Textual lays out every mounted widget on each reflow, so a session of thousands of blocks would
# make every token slower. At the end of a turn the oldest blocks beyond this are dropped (the
# transcript itself is untouched; /history replays it).
MAX_BLOCKS = 400
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

_LINE_STYLE = {
    toolview.ADD: "$text-success",
    toolview.DEL: "$text-error",
    toolview.HUNK: "$text-accent",
    toolview.CONTEXT: "$text-muted",
    toolview.OUTPUT: "$foreground",
    toolview.FAILED: "$text-error",
    toolview.MUTED: "$text-muted",
}


def body_content(lines: list[tuple[str, str]], path: str | None = None) -> Content:
    """Card body lines, each behind a `│` rule, coloured through theme variables; with the path of
    a write/edit, its code syntax-highlighted (ui/codeview.py)."""
    rule = Content.from_markup("[$text-muted]│[/] ")
    painted = codeview.code_body(lines, path, _LINE_STYLE) if path else None
    if painted is not None:
        return Content("\n").join(rule + line for line in painted)
    parts = []
    for style, text in lines:
        parts.append(rule + Content.styled(text, _LINE_STYLE.get(style, "")))
    return Content("\n").join(parts)


class UserMessage(Static):
    def __init__(self, text: str, *, queued: bool = False) -> None:
        marker = "[b $accent]›[/] "
        body = Content.from_markup(marker) + Content(text)
        if queued:
            body += Content.from_markup(" [$text-muted](sent while busy)[/]")
        super().__init__(body, classes="user")
        self.text = text


class Note(Static):
    """A one-line message from the app or the agent: info, warning or error."""

    def __init__(self, text: str, level: str = "info") -> None:
        super().__init__(Content(text), classes=f"note {level}")
        self.text = text
        self.level = level


class ThinkingBlock(Static):
    """Reasoning: live dimmed tail while it streams, then one line "Thought for N s (M tokens)"."""

    # (live header, collapsed verb) per kind: reasoning, or the compaction summary being written
    LABELS = {"thinking": ("Thinking…", "Thought for"), "summary": ("Summarising the conversation…", "Summarised in")}

    def __init__(self, clock: Callable[[], float], kind: str = "thinking") -> None:
        super().__init__("", classes="thinking")
        self._clock = clock
        self.kind = kind
        self._parts: list[str] = []
        self.started = clock()
        self.seconds = 0.0
        self.tokens = 0
        self.streaming = True
        self.expanded = False
        self.replayed = False  # from a saved transcript: no timing, and the UI has no token count

    @classmethod
    def replay(cls, clock: Callable[[], float], text: str, *, expanded: bool) -> ThinkingBlock:
        block = cls(clock)
        block._parts.append(text)
        block.streaming = False
        block.replayed = True
        block.expanded = expanded
        block._redraw()
        return block

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def append(self, text: str, tokens: int) -> None:
        self._parts.append(text)
        self.tokens += tokens
        self._redraw()

    def finish(self, tokens: int | None = None) -> None:
        if not self.streaming:
            return
        self.streaming = False
        self.seconds = self._clock() - self.started
        if tokens is not None:
            self.tokens = max(self.tokens, tokens)
        self._redraw()

    def set_expanded(self, expanded: bool) -> None:
        self.expanded = expanded
        self._redraw()

    def on_click(self, event: Click) -> None:
        if not self.streaming:
            self.set_expanded(not self.expanded)

    def _redraw(self) -> None:
        if self.streaming:
            text = self.text
            # Only the last few lines are drawn: rsplit from the end keeps this O(tail) per update.
            tail = text.rstrip("\n").rsplit("\n", THINKING_TAIL_LINES)[-THINKING_TAIL_LINES:]
            head = Content.from_markup("[$text-muted]✻ $label[/]", label=self.LABELS[self.kind][0])
            body = Content.styled("\n".join(tail), "$text-muted italic")
            self.update(Content("\n").join([head, body]) if text.strip() else head)
            return
        arrow = "▾" if self.expanded else "▸"
        hint = "" if self.expanded else "  [dim]ctrl+t[/dim]"
        if self.replayed:
            # A saved transcript keeps the reasoning text but not how long it took.
            line = Content.from_markup(f"[$text-muted]{arrow} Thought{hint}[/]")
        else:
            line = Content.from_markup(
                f"[$text-muted]{arrow} $verb $secs s ($toks){hint}[/]",
                verb=self.LABELS[self.kind][1],
                secs=f"{self.seconds:.1f}",
                toks=f"{self.tokens} token" + ("" if self.tokens == 1 else "s"),
            )
        if self.expanded and self.text.strip():
            line = Content("\n").join([line, Content.styled(self.text.strip("\n"), "$text-muted italic")])
        self.update(line)


class ToolCard(Vertical):
    """`⏺ name  summary` with a status at the right; a body (diff, output, result) underneath.

    Not focusable (nor is the conversation): the input keeps the focus, so typing always goes to
    the editor. A click toggles a card; Ctrl+O toggles the last one."""

    def __init__(self, name: str, *, index: int = 0) -> None:
        super().__init__()
        self.tool_name = name
        self.index = index
        self.params: dict[str, str] = {}
        self.args: dict[str, Any] = {}
        self.state = "writing"        # writing (model still writing the call) -> running -> ok | failed
        self.status_text = "…"
        self.result: tuple[bool, str, Any, float] | None = None
        self.expanded = False
        self.spin = 0
        self._head = Static(classes="tool-head")
        self._status = Static(classes="tool-status")
        self._body = Static(classes="tool-body")

    def compose(self):
        with Horizontal(classes="tool-line"):
            yield self._head
            yield self._status
        yield self._body

    def on_mount(self) -> None:
        self._redraw()

    # -- updates from events ---------------------------------------------------------------
    def arg_delta(self, param: str, text: str) -> None:
        self.params[param] = self.params.get(param, "") + text
        self._redraw()

    def call_complete(self, args: dict[str, Any]) -> None:
        self.args = dict(args)
        self.state = "running"
        self._redraw()

    def finish(self, ok: bool, text: str, display: Any, elapsed: float) -> None:
        self.result = (ok, text, display, elapsed)
        self.state = "failed" if toolview.result_failed(self.tool_name, ok, text, display) else "ok"
        self.status_text = toolview.result_status(self.tool_name, ok, text, display, elapsed)
        self._redraw()

    def toggle(self) -> None:
        self.expanded = not self.expanded
        self._redraw()

    def tick(self) -> None:
        self.spin += 1
        self._redraw_status()

    def on_click(self, event: Click) -> None:
        self.toggle()

    # -- drawing -------------------------------------------------------------------------------
    def summary(self) -> str:
        args = self.args or self.params
        return toolview.tool_summary(self.tool_name, args)

    def _redraw_status(self) -> None:
        if self.state in ("writing", "running"):
            word = "writing" if self.state == "writing" else "running"
            self._status.update(Content.from_markup(f"[$text-warning]$s {word}[/]", s=SPINNER[self.spin % len(SPINNER)]))
        elif self.state == "ok":
            self._status.update(Content.from_markup("[$text-success]✓[/] $t", t=self.status_text))
        else:
            self._status.update(Content.from_markup("[$text-error]✗ $t[/]", t=self.status_text))

    def _redraw(self) -> None:
        self._head.update(
            Content.from_markup("[b $accent]⏺[/] [b]$name[/]  $summary", name=self.tool_name, summary=self.summary())
        )
        self._redraw_status()
        if self.result is not None:
            ok, text, display, _ = self.result
            lines = toolview.result_body(self.tool_name, ok, text, display, expanded=self.expanded)
        elif self.state == "writing":
            lines = toolview.pending_body(self.tool_name, self.params)
        else:
            lines = []
        self._body.display = bool(lines)
        if lines:
            path = (self.args or self.params).get("path") if self.tool_name in ("write", "edit") else None
            self._body.update(body_content(lines, path if isinstance(path, str) else None))


class InvalidCallCard(Static):
    def __init__(self, reason: str, raw: str, kind: str) -> None:
        text = Content.from_markup("[b $text-error]✗ $label:[/] $reason", label=toolview.invalid_call_label(kind),
                                   reason=reason)
        if raw.strip():
            raw_lines = raw.strip("\n").split("\n")
            if len(raw_lines) > 8:
                raw_lines = raw_lines[:4] + [f"… {len(raw_lines) - 6} lines …"] + raw_lines[-2:]
            text = Content("\n").join([text, body_content([(toolview.FAILED, ln) for ln in raw_lines])])
        super().__init__(text, classes="invalid-call")
        self.reason = reason


class AssistantMessage(Markdown):
    """One stretch of answer text between tool calls, fed through a MarkdownStream."""

    def __init__(self) -> None:
        super().__init__("", classes="assistant")
        self.stream: MarkdownStream | None = None


class Conversation(VerticalScroll, can_focus=False):
    """Owns the widgets of the running turn; the app calls these methods from the event boundary."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, id: str | None = None) -> None:
        super().__init__(id=id)
        self.clock = clock
        self.thinking: ThinkingBlock | None = None
        self.answer: AssistantMessage | None = None
        self.cards: dict[int, ToolCard] = {}
        self.subagents: dict[str, SubagentCard] = {}
        self.last_answer_text = ""
        self._turn_answer: list[str] = []
        self.thinking_expanded = False

    def on_mount(self) -> None:
        self.anchor()

    # -- simple lines ------------------------------------------------------------------------
    async def user(self, text: str, *, queued: bool = False) -> None:
        await self.close_streams()
        self._turn_answer = []
        await self.mount(UserMessage(text, queued=queued))

    async def note(self, text: str, level: str = "info") -> None:
        await self.close_streams()
        await self.mount(Note(text, level))

    async def drop_notes(self, text: str) -> None:
        """Remove the notes saying `text` (a progress line whose work is done)."""
        for note in [n for n in self.query(Note) if n.text == text]:
            await note.remove()

    # -- thinking ------------------------------------------------------------------------------
    async def thinking_delta(self, text: str, tokens: int = 1, kind: str = "thinking") -> None:
        if self.thinking is None or not self.thinking.streaming or self.thinking.kind != kind:
            await self._close_answer()
            self.end_thinking()
            self.thinking = ThinkingBlock(self.clock, kind)
            self.thinking.expanded = self.thinking_expanded
            await self.mount(self.thinking)
        self.thinking.append(text, tokens)

    def end_thinking(self, tokens: int | None = None) -> None:
        if self.thinking is not None and self.thinking.streaming:
            self.thinking.finish(tokens)

    def toggle_thinking(self) -> None:
        self.thinking_expanded = not self.thinking_expanded
        for block in self.query(ThinkingBlock):
            block.set_expanded(self.thinking_expanded)

    # -- answer text ---------------------------------------------------------------------------
    async def text_delta(self, text: str) -> None:
        self.end_thinking()
        if self.answer is None:
            if not text.strip():
                return  # whitespace between thinking / tool cards and the answer opens nothing
            text = text.lstrip("\n")
            self.answer = AssistantMessage()
            await self.mount(self.answer)
            self.answer.stream = Markdown.get_stream(self.answer)
        self._turn_answer.append(text)
        assert self.answer.stream is not None
        await self.answer.stream.write(text)

    async def _close_answer(self) -> None:
        if self.answer is not None and self.answer.stream is not None:
            stream, self.answer.stream = self.answer.stream, None
            await stream.stop()
        self.answer = None

    async def close_streams(self) -> None:
        self.end_thinking()
        await self._close_answer()

    # -- tools -----------------------------------------------------------------------------------
    async def tool_start(self, index: int, name: str) -> ToolCard:
        await self.close_streams()
        card = ToolCard(name, index=index)
        self.cards[index] = card
        await self.mount(card)
        return card

    async def _card(self, index: int, name: str = "?") -> ToolCard:
        card = self.cards.get(index)
        if card is None:
            card = await self.tool_start(index, name)
        return card

    async def tool_arg(self, index: int, param: str, text: str) -> None:
        (await self._card(index)).arg_delta(param, text)

    async def tool_end(self, index: int, name: str, args: dict[str, Any]) -> None:
        (await self._card(index, name)).call_complete(args)

    async def tool_result(self, index: int, name: str, ok: bool, text: str, display: Any, elapsed: float) -> None:
        (await self._card(index, name)).finish(ok, text, display, elapsed)

    async def tool_invalid(self, reason: str, raw: str, kind: str) -> None:
        await self.close_streams()
        await self.mount(InvalidCallCard(reason, raw, kind))

    # -- subagents (the task tool) ---------------------------------------------------------------
    async def subagent_start(self, sid: str, goal: str, writes: bool = False) -> None:
        await self.close_streams()
        card = SubagentCard(sid, goal, writes=writes)
        self.subagents[sid] = card
        await self.mount(card)

    def subagent_delta(self, sid: str, kind: str, text: str, tokens: int = 1) -> None:
        card = self.subagents.get(sid)
        if card is not None:
            card.delta(kind, text, tokens)

    def subagent_end(self, sid: str, summary: str, reason: str, rounds: int, generated: int,
                     seconds: float) -> None:
        card = self.subagents.pop(sid, None)
        if card is not None:
            card.finish(summary, reason, rounds, generated, seconds)

    def new_round(self) -> None:
        self.cards = {}

    def running_cards(self) -> list[ToolCard]:
        return [c for c in self.cards.values() if c.state in ("writing", "running")]

    async def end_turn(self) -> None:
        await self.close_streams()
        answer = "".join(self._turn_answer).strip()
        if answer:
            self.last_answer_text = answer
        for card in self.running_cards():
            card.state = "failed"
            card.status_text = "not run"
            card._redraw()
        await self.prune()

    async def prune(self, limit: int = MAX_BLOCKS) -> None:
        children = list(self.children)
        excess = len(children) - limit
        if excess <= 0:
            return
        await self.remove_children(children[: excess + 1])
        await self.mount(Note("… earlier output hidden (/history N replays it)", "muted"), before=0)

    async def clear_through(self, last) -> None:
        """Remove every block up to and including `last` (None: nothing) and forget the running
        turn's widgets: a new or loaded session starts a clean view."""
        await self.close_streams()
        children = list(self.children)
        if last is not None and last in children:
            await self.remove_children(children[: children.index(last) + 1])
        self.thinking = None
        self.cards = {}
        self._turn_answer = []
        self.last_answer_text = ""
        self.anchor()

    def toggle_card(self, card: ToolCard | SubagentCard | None = None) -> bool:
        """Expand or collapse `card` (default: the last one). False when there is no card."""
        if card is None:
            cards = [c for c in self.query("ToolCard, SubagentCard") if isinstance(c, (ToolCard, SubagentCard))]
            if not cards:
                return False
            card = cards[-1]
        card.toggle()
        return True

    async def compaction_delta(self, text: str, tokens: int = 1) -> None:
        await self.thinking_delta(text, tokens, kind="summary")

    async def history(self, items, subagents=()) -> None:
        """Replay of saved turns (after /load, /history): same widgets, nothing executed.
        `subagents`: the session's subagent records; a `task` call is followed by its card."""
        await self.close_streams()
        pending = list(subagents)
        for item in items:
            if item.kind == "user":
                await self.mount(UserMessage(item.text))
            elif item.kind == "thinking":
                await self.mount(ThinkingBlock.replay(self.clock, item.text, expanded=self.thinking_expanded))
            elif item.kind == "text":
                if item.text.strip():
                    self.last_answer_text = item.text.strip()  # /copy works right after a load
                    msg = AssistantMessage()
                    await self.mount(msg)
                    await msg.update(item.text)
            elif item.kind == "tool_call":
                card = ToolCard(item.name)
                card.args = dict(item.args)
                card.state = "ok"
                card.status_text = "replayed"
                await self.mount(card)
                goal = str(item.args.get("goal", "")).strip() if item.name == "task" else None
                record = next((r for r in pending if r.goal == goal), None)
                if record is not None:
                    pending.remove(record)
                    await self.mount(SubagentCard.replay(record))
            elif item.kind == "tool_result":
                await self.mount(Note("result: " + clip(item.text, 100), "muted"))
            else:
                await self.mount(Note(item.text, "muted"))
