"""One assistant round's token stream -> agent events, on top of the foundation's DSML parser.

The parser (ds4agent.engine.dsml) does the protocol work: the thinking gate on ids, start-marker
detection with held-back bytes, the block grammar, the §12 greedy classifier and the round
outcome. This adapter only turns its events into the UI's events (agent/events.py) and exposes
the few flags the loop reads between tokens. The same adapter replays saved turns for /history,
so a replay shows exactly what the live stream showed.
"""

from __future__ import annotations

from typing import Any

from ds4agent.agent import events as ev
from ds4agent.engine import dsml


class AssistantStream:
    __slots__ = ("parser", "_calls_seen")

    def __init__(self, tok: Any, *, thinking: bool) -> None:
        self.parser = dsml.DsmlParser(thinking=thinking, tokenizer=tok)
        self._calls_seen = 0

    # ------------------------------------------------------------------ flags the loop reads
    @property
    def in_syntax(self) -> bool:
        return self.parser.in_syntax

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
    def calls(self) -> list[tuple[str, dict]]:
        return [(c.name, c.arguments) for c in self.parser.outcome.calls]

    @property
    def block_open(self) -> bool:
        return self.parser.outcome.kind == "unterminated"

    @property
    def raw_block(self) -> str:
        return bytes(self.parser._raw).decode("utf-8", "replace")

    # ------------------------------------------------------------------ events
    def feed(self, token: int, data: bytes) -> list[ev.Event]:
        return self._convert(self.parser.feed(token, data))

    def finish(self) -> list[ev.Event]:
        return self._convert(self.parser.finish())

    def _convert(self, events: list[Any]) -> list[ev.Event]:
        out: list[ev.Event] = []
        for e in events:
            t = type(e)
            if t is dsml.ThinkingDelta:
                out.append(ev.ThinkingDelta(e.text))
            elif t is dsml.TextDelta:
                out.append(ev.TextDelta(e.text))
            elif t is dsml.ParamDelta:
                out.append(ev.ToolCallArgDelta(e.invoke, e.name, e.text))
            elif t is dsml.InvokeStart:
                out.append(ev.ToolCallStart(e.index, e.name))
            elif t is dsml.InvokeEnd:
                out.append(ev.ToolCallEnd(e.call.index, e.call.name, e.call.arguments))
            elif t is dsml.BlockError:
                out.append(ev.ToolCallInvalid(e.reason, raw=e.stanza, kind="error"))
            elif t is dsml.ThinkingViolation:
                out.append(ev.ToolCallInvalid(dsml.THINKING_ERROR_REASON, kind="thinking"))
        return out
