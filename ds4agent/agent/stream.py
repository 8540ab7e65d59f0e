"""One assistant round's token stream -> agent events, on top of the foundation's DSML parser.

The parser (ds4agent.protocol.dsml) does the protocol work: the thinking gate on ids, start-marker
detection with held-back bytes, the block grammar, the greedy classifier (prompt-and-dsml.md §12) and the round
outcome. This adapter only turns its events into the UI's events (agent/events.py) and exposes
the few flags the loop reads between tokens. The same adapter replays saved turns for /history,
so a replay shows exactly what the live stream showed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ds4agent.agent import events as ev
from ds4agent.protocol import dsml

if TYPE_CHECKING:
    from ds4agent.protocol.tokenizer import Tokenizer


class AssistantStream:
    """watch: told of the parser's own events of every token before they are converted (the
    agent's edit assist reads the streaming parameter values there)."""

    __slots__ = ("parser", "_calls_seen", "_watch")

    def __init__(self, tok: Tokenizer, *, thinking: bool,
                 watch: Callable[[list[dsml.Event]], None] | None = None) -> None:
        self.parser = dsml.DsmlParser(thinking=thinking, tokenizer=tok)
        self._calls_seen = 0
        self._watch = watch

    # ------------------------------------------------------------------ flags the loop reads
    @property
    def in_syntax(self) -> bool:
        return self.parser.in_syntax

    @property
    def in_string_body(self) -> bool:
        """Inside a string parameter value, with no close tag starting at its end."""
        return self.parser.state is dsml.GreedyState.STRING_BODY

    @property
    def closed(self) -> bool:
        """DONE or ERROR: stop sampling (the agent appends EOS)."""
        return self.parser.stop

    @property
    def failed_thinking(self) -> bool:
        return self.parser.thinking_violation

    @property
    def thinking_error(self) -> str:
        return dsml.THINKING_ERROR_REASON

    @property
    def error(self) -> str | None:
        o = self.parser.outcome
        return (o.error or "") if o.kind == "error" else None

    @property
    def done(self) -> bool:
        return self.parser.outcome.kind == "done"

    @property
    def calls(self) -> list[tuple[str, dict[str, object]]]:
        return [(c.name, c.arguments) for c in self.parser.outcome.calls]

    @property
    def block_open(self) -> bool:
        return self.parser.outcome.kind == "unterminated"

    @property
    def raw_block(self) -> str:
        return self.parser.raw_block.decode("utf-8", "replace")

    # ------------------------------------------------------------------ events
    def feed(self, token: int, data: bytes) -> list[ev.Event]:
        events = self.parser.feed(token, data)
        if self._watch is not None and events:
            self._watch(events)
        return self._convert(events)

    def finish(self) -> list[ev.Event]:
        return self._convert(self.parser.finish())

    def _convert(self, events: list[dsml.Event]) -> list[ev.Event]:
        out: list[ev.Event] = []
        for e in events:
            if isinstance(e, dsml.ThinkingPart):
                out.append(ev.ThinkingDelta(e.text))
            elif isinstance(e, dsml.TextPart):
                out.append(ev.TextDelta(e.text))
            elif isinstance(e, dsml.ParamDelta):
                out.append(ev.ToolCallArgDelta(e.invoke, e.name, e.text))
            elif isinstance(e, dsml.InvokeStart):
                out.append(ev.ToolCallStart(e.index, e.name))
            elif isinstance(e, dsml.InvokeEnd):
                out.append(ev.ToolCallEnd(e.call.index, e.call.name, e.call.arguments))
            elif isinstance(e, dsml.BlockError):
                out.append(ev.ToolCallInvalid(e.reason, raw=e.stanza, kind="error"))
            elif isinstance(e, dsml.ThinkingViolation):
                out.append(ev.ToolCallInvalid(dsml.THINKING_ERROR_REASON, kind="thinking"))
        return out


class Coalescer:
    """Merges consecutive text deltas of one kind before they reach the event queue.

    At real decode speed (tens of tokens per second) every token is flushed at once; when
    tokens come faster than `interval` (replays, a fast engine) consecutive deltas are joined,
    so the UI's queue gets a few events per frame instead of one per token. Any other event
    flushes the pending delta first, so the order of events is never changed.
    """

    __slots__ = ("_emit", "_interval", "_kind", "_key", "_parts", "_tokens", "_last")

    def __init__(self, emit: Callable[[ev.Event], None], interval: float = 0.02) -> None:
        self._emit = emit
        self._interval = interval
        self._kind: type | None = None
        self._key: tuple = ()
        self._parts: list[str] = []
        self._tokens = 0  # sum of the merged text/thinking deltas' token counts
        self._last = 0.0

    def add(self, e: ev.Event) -> None:
        if isinstance(e, ev.ThinkingDelta | ev.TextDelta):
            key: tuple = ()
            tokens = e.tokens
        elif isinstance(e, ev.ToolCallArgDelta):
            key = (e.index, e.param)
            tokens = 0  # an argument's text counts no tokens of its own
        else:
            self.flush()
            self._emit(e)
            return
        t = type(e)
        if t is not self._kind or key != self._key:
            self.flush()
            self._kind, self._key = t, key
        self._parts.append(e.text)
        self._tokens += tokens

    def tick(self, now: float) -> None:
        if self._parts and now - self._last >= self._interval:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if not self._parts:
            return
        text = self._parts[0] if len(self._parts) == 1 else "".join(self._parts)
        kind = self._kind
        if kind is ev.ToolCallArgDelta:
            self._emit(ev.ToolCallArgDelta(self._key[0], self._key[1], text))
        else:
            self._emit(kind(text, self._tokens))  # type: ignore[misc]
        self._parts = []
        self._tokens = 0
        self._kind = None


class RoundEnd(enum.Enum):
    """How one assistant round ended (prompt-and-dsml.md §11, round outcomes), decided once in the
    worker's _round and _classify."""

    DONE = "done"  # the model sampled EOS (no block)
    TOOLS = "tools"  # a block closed: its calls run, another round follows
    DSML_ERROR = "error"  # a malformed block: its error is the result, another round follows
    THINKING = "thinking"  # DSML inside thinking (§11.3): that error is the result
    PREFLIGHT = "preflight"  # an edit's old text selects nothing: stopped before its new text
    UNTERMINATED = "unterminated"  # a block still open when generation stopped
    INTERRUPTED = "interrupted"
    TOKEN_CAP = "token_cap"
    STOP_TOKEN = "stop_token"
    CONTEXT_FULL = "context_full"  # the answer reached the end of the context: compact and go on


# What a turn reports when its last round ended so; any other last round ended in an answer.
TURN_END = {RoundEnd.INTERRUPTED: ev.TurnEnd.INTERRUPTED, RoundEnd.TOKEN_CAP: ev.TurnEnd.TOKEN_CAP,
             RoundEnd.STOP_TOKEN: ev.TurnEnd.STOP_TOKEN, RoundEnd.CONTEXT_FULL: ev.TurnEnd.CONTEXT_FULL}


@dataclass
class RoundResult:
    """How one assistant round ended and what it left to do."""

    reason: RoundEnd
    generated: int = 0
    calls: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    error: str = ""
    index: int = 0  # preflight: the invoke whose old selected nothing
