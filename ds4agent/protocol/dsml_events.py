"""What the DSML parser reports (prompt-and-dsml.md §11): the parsed calls, the streaming events, a
round's outcome, and the texts the model and the UI get for a failed round. The parser is dsml.py,
which re-exports all of these (callers write `dsml.InvokeEnd`, `dsml.error_result`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

THINKING_ERROR_REASON = "tool calling is not allowed inside <think></think>"
THINKING_NOTE = f"[tool call ignored: {THINKING_ERROR_REASON}]"
UNTERMINATED_NOTE = "[tool call interrupted]"


# Shown after a DSML syntax error: the error alone often brings the same mistake again.
SYNTAX_REMINDER = ("Write tool calls exactly like this:\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
                   '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
                   "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")


def error_result(reason: str) -> str:
    """The single tool result a failed round gives the model (§11.7)."""
    return f"Tool error: invalid DSML tool call: {reason}"


def syntax_error_result(reason: str) -> str:
    """A malformed, stray or incomplete block's result: the error, then the syntax reminder."""
    return f"{error_result(reason)}\n\n{SYNTAX_REMINDER}"
INCOMPLETE_REASON = "the tool call block ended before its closing tag"


# ----------------------------------------------------------------------------- parsed data

@dataclass(frozen=True, slots=True)
class Param:
    name: str
    value: Any  # str for string values; the parsed JSON for string="false" (raw text when invalid)
    raw: str  # the value text after unescaping (what a JSON parse was tried on)
    is_json: bool
    json_error: str | None = None  # why a string="false" value was kept as raw text


@dataclass(frozen=True, slots=True)
class ToolCall:
    index: int
    name: str
    params: tuple[Param, ...]

    @property
    def arguments(self) -> dict[str, Any]:
        """name -> value; for a repeated parameter name the first one wins (§8)."""
        args: dict[str, Any] = {}
        for p in self.params:
            args.setdefault(p.name, p.value)
        return args


# ----------------------------------------------------------------------------- events

@dataclass(frozen=True, slots=True)
class ThinkingPart:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingEnd:
    """Token </think> (128822) left thinking."""


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingViolation:
    """A DSML marker inside thinking: the round is failed (shown once)."""

    note: str = THINKING_NOTE


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A start marker completed outside thinking; the tool_calls block is open."""

    marker: bytes  # the marker as sampled (canonical or a tolerated typo)


@dataclass(frozen=True, slots=True)
class InvokeStart:
    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ParamStart:
    invoke: int
    name: str
    is_json: bool


@dataclass(frozen=True, slots=True)
class ParamDelta:
    invoke: int
    name: str
    text: str  # raw value text as sampled (for display; the final value is in ParamEnd)


@dataclass(frozen=True, slots=True)
class ParamEnd:
    invoke: int
    param: Param


@dataclass(frozen=True, slots=True)
class InvokeEnd:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class BlockDone:
    """`</｜DSML｜tool_calls>` closed the block: stop sampling, append EOS, run the calls."""

    calls: tuple[ToolCall, ...]
    trailing: bytes  # bytes of the closing token after '>' (kept in the transcript, never parsed)


@dataclass(frozen=True, slots=True)
class BlockError:
    """A malformed block: stop sampling, append EOS, give the model `result` (nothing of the block runs)."""

    reason: str
    stanza: str  # the raw block text up to the error, for display

    @property
    def result(self) -> str:
        return error_result(self.reason)

    @property
    def note(self) -> str:
        return f"[invalid tool call: {self.reason}]"


Event = (
    ThinkingPart | ThinkingEnd | TextPart | ThinkingViolation | BlockStart | InvokeStart | ParamStart
    | ParamDelta | ParamEnd | InvokeEnd | BlockDone | BlockError
)


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """What the round produced, once it is over.

    kind: "none" (no block), "done" (a complete block: run `calls`), "error" (malformed block),
    "unterminated" (a block still open when the round ended). `thinking_violation` overrides them all:
    then the only result is `failure_result` (unless the round was interrupted, which adds no results turn).
    """

    kind: str
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None
    thinking_violation: bool = False

    @property
    def failure_result(self) -> str | None:
        """The parser's error text of a failed round (thinking rule or ERROR), else None; the agent
        adds the syntax reminder to a syntax error (syntax_error_result)."""
        if self.thinking_violation:
            return error_result(THINKING_ERROR_REASON)
        if self.kind == "error":
            return error_result(self.error or "")
        return None

    @property
    def runs_tools(self) -> bool:
        return self.kind == "done" and not self.thinking_violation
