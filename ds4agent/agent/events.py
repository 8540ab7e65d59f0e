"""The typed events every UI consumes (TUI, plain mode, headless, tests).

The agent's worker thread publishes these, in order, on `Agent.events` (a thread-safe
`queue.Queue`); a UI drains it at its own pace (`Agent.poll_events()` never blocks). Every event
is a frozen dataclass holding only plain data (str, int, float, bool, tuples, and the tools'
`display` payloads), so a UI can keep them, compare them in tests, and `event_to_dict` can
stream them as JSON lines (`ds4agent -p ... --json`). No UI types live here.

Text events carry *deltas* (the new bytes decoded since the last event of that kind); a UI
appends them. Token-level bookkeeping never crosses this boundary: a UI sees counts only.

Event flow of one user turn (think mode, one tool round), for orientation:

    UserTurn -> Status(prefill) -> PrefillProgress* -> Status(generating)
    -> ThinkingDelta* -> TextDelta* -> ToolCallStart -> ToolCallArgDelta* -> ToolCallEnd
    -> Status(tool) -> [PermissionRequest -> (UI calls answer_permission)] -> ToolResult
    -> Status(prefill) -> ... -> TextDelta* -> TurnEnded -> Status(idle)
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


class State(enum.StrEnum):
    """What the worker is doing; the status bar's state word."""

    IDLE = "idle"
    LOADING = "loading"  # loading the model / restoring the system-prompt cache
    PREFILL = "prefill"
    GENERATING = "generating"
    TOOL = "tool"  # running a tool (or waiting for a permission answer)
    COMPACTING = "compacting"
    SAVING = "saving"
    ERROR = "error"


@dataclass(frozen=True)
class Event:
    """Base class of every agent event."""


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class Status(Event):
    """Everything the status bar shows. Sent whenever one of the fields changes
    (rate-limited by the agent to a few per second during generation).

    ctx_used: tokens in the transcript; ctx_total: the session context size;
    compact_at: the token count at which soft compaction triggers (85% of ctx or
    ctx - min(8192, ctx/4), whichever is lower);
    progress: 0..1 while loading (model / cache), else None;
    generated: tokens sampled so far in the current round;
    decode_tps / prefill_tps: the latest measured speeds (0.0 when unknown);
    greedy: the DSML classifier is in a structural state (argmax sampling);
    unsaved: the session has turns that were not saved;
    session_id: first 8 hex of the saved name, "" when never saved/loaded;
    title: the session title ("" for a new session);
    think_mode: "think" | "nothink" | "think-max" (the effective mode);
    permission_mode: "ask" | "auto" | "read-only" | "plan";
    power: the device's duty-cycle cap in percent (/power; 100: full power, no rests);
    detail: a short free text for the state (e.g. the running tool's name, an error message).
    """

    state: State
    ctx_used: int
    ctx_total: int
    compact_at: int
    progress: float | None = None
    generated: int = 0
    decode_tps: float = 0.0
    prefill_tps: float = 0.0
    greedy: bool = False
    unsaved: bool = False
    session_id: str = ""
    title: str = ""
    think_mode: str = "think"
    permission_mode: str = "ask"
    power: int = 100
    detail: str = ""


@dataclass(frozen=True)
class Ready(Event):
    """The model is loaded and the system prefix is live; the agent accepts turns.

    model: a short description of the model; ctx: the session context;
    sysprompt_cached: True when the system prefix came from its KV cache (no prefill);
    device: where the engine computes ("Metal GPU", "CUDA GPU", "CPU"; "" when unknown);
    experts: which routed-expert backend runs and why (Engine.expert_backend: "mxfp4 via MLX
    gather_qmm", "Q4_K portable MLX (Metal kernels failed self-check: ...)"; "" when unknown).
    """

    model: str
    ctx: int
    sysprompt_cached: bool
    device: str = ""
    experts: str = ""


# --------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class UserTurn(Event):
    """A user message reached the model (echo it in the conversation).

    queued=True: text typed while busy, delivered at a tool boundary inside a results turn
    or as the next turn (prompt-and-dsml.md §9.1).
    """

    text: str
    queued: bool = False


@dataclass(frozen=True)
class PrefillProgress(Event):
    """Prefill of the transcript's new suffix: `done` of `total` tokens, at `tps` tokens/s."""

    done: int
    total: int
    tps: float


@dataclass(frozen=True)
class RoundStarted(Event):
    """A new assistant round begins (round 1 answers the user, later rounds follow tool results)."""

    round: int


@dataclass(frozen=True)
class ThinkingDelta(Event):
    """More reasoning text (the `<think>` tags themselves are never included).

    tokens: sampled tokens this delta stands for (the agent merges the deltas of a fast engine;
    a merged delta carries the sum), so a UI can count thinking tokens exactly."""

    text: str
    tokens: int = 1


@dataclass(frozen=True)
class TextDelta(Event):
    """More visible answer text (DSML blocks are never included: they arrive as ToolCall* events).

    tokens: sampled tokens this delta stands for (summed when deltas are merged)."""

    text: str
    tokens: int = 1


@dataclass(frozen=True)
class ToolCallStart(Event):
    """The model opened an invoke. `index` counts invokes within the round's block (0-based)."""

    index: int
    name: str


@dataclass(frozen=True)
class ToolCallArgDelta(Event):
    """More raw text of parameter `param` of invoke `index` (streamed while the model writes it)."""

    index: int
    param: str
    text: str


@dataclass(frozen=True)
class ToolCallEnd(Event):
    """Invoke `index` is complete; `args` are the parsed values (strings, or JSON values for
    `string="false"` parameters), first occurrence of a duplicated name kept."""

    index: int
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallInvalid(Event):
    """The block was malformed (DSML ERROR); the model gets `Tool error: invalid DSML tool call: reason`.

    raw: the block text as sampled (for a red card); kind: "error" (malformed),
    "thinking" (a call inside <think>, ignored), "interrupted" (block left open at EOS/cap/stop).
    """

    reason: str
    raw: str = ""
    kind: str = "error"


@dataclass(frozen=True)
class ToolResult(Event):
    """The result of invoke `index`.

    ok: False for tool errors, refusals and calls that were not executed;
    text: exactly what the model receives (inside <tool_result>);
    display: the tool's display payload (bash output head/tail, a diff, ...), or None;
    elapsed: seconds the tool ran.
    """

    index: int
    name: str
    ok: bool
    text: str
    display: Any = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class PermissionRequest(Event):
    """The worker waits for `Agent.answer_permission(id, answer)`; nothing times out into a "no".

    tool: the tool name; question: one line ("Allow bash?", "Allow edit to src/x.py?");
    detail: the command or the diff to show; options: (key, label) pairs, e.g.
    (("y", "allow once"), ("s", "allow for this session (commands starting with git)"), ("n", "deny")).
    The answer is one of the keys; a deny may carry a message: answer_permission(id, "n", message).
    """

    id: str
    tool: str
    question: str
    detail: str = ""
    options: tuple[tuple[str, str], ...] = ()
    # "command" (detail is a shell command) | "diff" (unified diff) | "arguments" (an MCP tool's
    # arguments as indented JSON)
    preview_kind: str = "command"
    diff: Any = None  # the tools' DiffDisplay for write/edit (numbered lines), else None
    outside_workspace: bool = False


@dataclass(frozen=True)
class Question(Event):
    """A yes/no style question from the agent itself, answered with `Agent.answer_permission(id, key)`.

    kind: "save" ("Save current session?" before /new, /load, quit with unsaved turns;
    options y / n / c = cancel, stay), "continue" (the save failed: "Continue anyway?" y / n),
    "resume" (a crash journal was found; y resumes it, n discards it), or "mcp" (at start: the
    project's .mcp.json is not approved yet; y starts its servers and is remembered for this file,
    n skips them this time, d refuses the file for good).
    """

    id: str
    kind: str
    question: str
    options: tuple[tuple[str, str], ...] = ()


class TurnEnd(enum.StrEnum):
    """Why a user turn ended (TurnEnded.reason). A str enum: front ends and `--json` consumers
    compare it with these strings."""

    DONE = "done"  # an answer ended it (also after tools, or a round the model left unfinished)
    INTERRUPTED = "interrupted"  # Esc / Ctrl+C
    TOKEN_CAP = "token_cap"  # the round reached --tokens or the end of the context
    STOP_TOKEN = "stop_token"  # the model sampled a token that ends a round (prompt-and-dsml.md §7)
    # an answer filled the context and the compaction that would have let it go on failed
    CONTEXT_FULL = "context_full"
    BLOCKED = "blocked"  # a UserPromptSubmit hook refused the message
    ERROR = "error"  # the turn failed (see TurnEnded.error)


@dataclass(frozen=True)
class TurnEnded(Event):
    """The user turn is over (the agent goes idle unless queued text starts the next one).

    reason: a TurnEnd; rounds / generated: rounds run and tokens sampled in the turn; seconds: wall
    time; error: the message when reason is ERROR.
    """

    reason: TurnEnd
    rounds: int = 0
    generated: int = 0
    seconds: float = 0.0
    error: str = ""


# --------------------------------------------------------------------------- sessions


def format_age(seconds: float) -> str:
    """`Ns ago`, `Nm ago`, `Nh ago`, `Nd ago` (agent-reference.md §3 /list): how every front end,
    `kv ls` and the agent's own questions say how long ago a session was used."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


@dataclass(frozen=True)
class HistoryItem:
    """One piece of a replayed turn. kind: "user" | "thinking" | "text" | "tool_call" |
    "tool_result" | "note". For tool_call: name + args; otherwise text."""

    kind: str
    text: str = ""
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionInfo:
    """One saved session for /list and the picker (newest first)."""

    id: str  # full 40-hex identity
    short_id: str  # first 8 hex
    title: str
    tokens: int
    size_bytes: int
    last_used: int  # unix seconds
    created_at: int
    path: str
    forked_from: str = ""  # short id of the session this one was forked from ("" when none)
    unreadable: str = ""  # why the file cannot be read ("" for a readable session); title says so too
    stripped: bool = False  # saved without its KV state: loading it prefills the text (kvc-format.md §12.6)

    @property
    def recency(self) -> int:
        """What "newest first" orders by: last use, else (a header without one) creation."""
        return self.last_used or self.created_at


@dataclass(frozen=True)
class SessionSaved(Event):
    id: str
    short_id: str
    tokens: int
    path: str
    title: str


@dataclass(frozen=True)
class SessionLoaded(Event):
    """A session was restored (no prefill). history: its last few human turns for display."""

    id: str
    short_id: str
    tokens: int
    title: str
    history: tuple[HistoryItem, ...] = ()
    resumed: bool = False  # True when restored from the crash journal
    prefilled: int = 0  # tokens prefilled to get there (0 for a plain load)


@dataclass(frozen=True)
class SessionNew(Event):
    """The transcript was reset to the system prefix."""


@dataclass(frozen=True)
class SessionList(Event):
    directory: str
    sessions: tuple[SessionInfo, ...]


@dataclass(frozen=True)
class History(Event):
    """Answer to /history N: the last `turns` human turns (items in order)."""

    turns: int
    items: tuple[HistoryItem, ...]


@dataclass(frozen=True)
class RewindPoint:
    """One user turn the session can go back to (1 = the first). time: when it was sent (epoch
    seconds; 0 when unknown, e.g. a loaded session's older turns); preview: its first line."""

    number: int
    time: float
    preview: str
    tokens: int  # the transcript length just before the turn (what a rewind keeps)


@dataclass(frozen=True)
class RewindList(Event):
    """Answer to /rewind without a turn: the user turns, oldest first; note: what code restore
    cannot undo (changes made through bash)."""

    points: tuple[RewindPoint, ...]
    note: str = ""


@dataclass(frozen=True)
class Rewound(Event):
    """A rewind happened. mode: both | chat | code | fork. prompt: the chosen turn's text, for the
    input box. prefilled: tokens re-prefilled to get there (0 when a snapshot served).
    restored / refused: code files put back, and files left alone (with the reason)."""

    number: int
    mode: str
    prompt: str
    tokens: int
    prefilled: int
    restored: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


# --------------------------------------------------------------------------- compaction, queue, notices


@dataclass(frozen=True)
class CompactionStarted(Event):
    reason: str  # "soft" | "hard" | "mid-response" | "manual"
    tokens_before: int


@dataclass(frozen=True)
class CompactionDelta(Event):
    """More text of the summary being written (shown dimmed)."""

    text: str


@dataclass(frozen=True)
class CompactionDone(Event):
    ok: bool
    tokens_before: int
    tokens_after: int
    summary_tokens: int = 0
    tail_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class SubagentStarted(Event):
    """The `task` tool forked a subagent from the live KV state (forked_at tokens, not prefilled);
    writes: it may change files (asked about as usual), else it is read-only."""

    id: str
    goal: str
    forked_at: int = 0
    writes: bool = False


@dataclass(frozen=True)
class SubagentDelta(Event):
    """A piece of subagent `id`'s transcript for its card. kind: "thinking" | "text" (deltas),
    "tool" (a call, one line), "result" (its first line), "error" (an invalid call)."""

    id: str
    kind: str
    text: str


@dataclass(frozen=True)
class SubagentEnded(Event):
    """Subagent `id` is over; `summary` is what its caller reads. reason: "done", "interrupted",
    "budget" (its token budget ran out), "context_full", "error"."""

    id: str
    summary: str
    reason: str
    rounds: int = 0
    generated: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class QueueChanged(Event):
    """The messages typed while busy, in order (empty tuple when the queue was taken)."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class TodoList(Event):
    """The model's task list changed (its todo tool), or a load / rewind / new session brought
    another one: items are the tools' TodoItem(text, status), status pending | in_progress | done.
    The whole list every time; () when there is none."""

    items: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Notice(Event):
    """A readable one-line message (e.g. "saved session 3f2a9c1e (1234 tokens)",
    "[generation stopped: the model sampled <｜User｜>]"). level: "info" | "warning"."""

    text: str
    level: str = "info"


# The Notice while the system prompt's KV cache is rebuilt at start: a progress line, which the
# full-screen app drops once Ready says the start is over (the reference prints it too).
SYSPROMPT_UPDATING = "Updating system prompt cache..."


@dataclass(frozen=True)
class Error(Event):
    """A readable error (never a traceback). fatal=True: the agent cannot continue."""

    text: str
    fatal: bool = False


@dataclass(frozen=True)
class Exited(Event):
    """The worker stopped (after shutdown()); the UI may exit. status: suggested exit status."""

    status: int = 0


# --------------------------------------------------------------------------- serialisation


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict: {"type": ClassName, ...fields}. Unknown display payloads become repr()."""
    out: dict[str, Any] = {"type": type(event).__name__}
    out.update(_plain(event))
    return out
