"""Subagents forked from the live KV cache: the `task` tool.

The model calls `task` with a goal; a subagent works on it and its summary becomes the call's
result. What no agent that talks to a remote model can do: the subagent starts as a fork of the
parent's live KV state, with no prefill of the conversation. A session state is immutable (engine
session.py), so the fork is a new Session rewound to a snapshot of the parent's: O(1), nothing
copied, and the parent's state is not touched at all (its KV stays bit for bit what it was, and
its next round prefills only the tool result). The child then prefills only its brief (a user
turn of a few dozen tokens) and starts decoding. Its memory is one more session state: the rows
it adds while it works (the shared prefix is the parent's arrays).

The subagent sees everything the parent saw (the conversation, the system text, the tools), and
then a brief: the goal, that it is a subagent, that it must end with a summary. It runs its own
tool loop (no compaction, no edit assist, no nesting: `task` is refused inside it) under its own
token budget (the `max_tokens` argument, default SUBAGENT_TOKENS, at most the room left in the
context). Read-only unless the call says `allow_writes=true`: a tool that changes anything is then
asked about exactly as for the parent; else it is refused with a text that says why. An
interrupt (Esc, Ctrl+C) stops it like any generation; its partial findings are returned.

Events: SubagentStarted, SubagentDelta (the card's transcript: thinking, text, tool calls and
results), SubagentEnded. The records (goal, transcript, summary) of the live session are saved
beside the KV directory with the session (save_records / load_records) and restored with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ds4agent.agent import events as ev
from ds4agent.agent.decode import TokenStream
from ds4agent.agent.hooks import AgentHooks
from ds4agent.agent.identity import SubagentRecord
from ds4agent.agent.port import WorkerPort
from ds4agent.agent.stream import AssistantStream
from ds4agent.fsutil import atomic_write
from ds4agent.protocol import dsml, template
from ds4agent.sessions.index import subagents_path
from ds4agent.tools import Observation, ToolContext, ToolError, run_tool
from ds4agent.tools.args import arg_bool, arg_int, arg_str

if TYPE_CHECKING:  # the store is handed in; only its type is needed here
    from ds4agent.sessions.store import SessionStore

TASK_TOOL = "task"
SUBAGENT_TOKENS = 16_384  # the default budget: tokens the subagent may generate over all its rounds
MIN_TOKENS = 256
# What the subagent reads after the parent's conversation (untrusted text, a user turn).
BRIEF = """You are now a subagent: a copy of the assistant above, forked to do one task for it. The assistant that called the `task` tool is waiting for your result.

Task:
{goal}

Work on this task only, with the tools{mode}. Do not call `task`. When you are done, answer with a concise summary of what you found or did: facts, file paths and line numbers, commands and their results, and anything left open. That answer is all the caller will see."""
READ_ONLY_NOTE = " (read-only: you may read, search and list, but not write files or run commands)"
REFUSED_READ_ONLY = ("Tool call refused: this subagent is read-only, so {name} is not available. "
                     "Report what should be done instead.")
REFUSED_NESTED = "Tool call refused: a subagent cannot start another subagent."


class TaskTool:
    """The `task` tool. Holds the worker: it forks the worker's session and uses its tools."""

    name = TASK_TOOL
    description = ("Start a subagent for a self-contained task (investigating code, searching, reading and "
                   "summarising several files) and get back its summary. The subagent starts instantly with "
                   "this whole conversation in mind, works with its own token budget and is read-only unless "
                   "allow_writes is true. Give it a precise goal and say what the summary must contain.")
    schema = {
        "type": "object",
        "properties": {
            "goal": {"type": "string", "description": "the task, and what its summary must report"},
            "max_tokens": {"type": "integer", "description": f"token budget (default {SUBAGENT_TOKENS})"},
            "allow_writes": {"type": "boolean", "description": "let it change files and run commands "
                             "(asked about as usual); default false"},
        },
        "required": ["goal"],
    }
    mutates = False  # starting one changes nothing; what it does is checked call by call

    def __init__(self, worker: WorkerPort, hooks: AgentHooks | None = None) -> None:
        self.worker = worker
        self.hooks = hooks  # the parent's hooks: PreToolUse / PostToolUse judge the subagent's calls too

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        goal = arg_str(args, "goal", required=True).strip()
        if not goal:
            raise ToolError("task needs a goal")
        budget = arg_int(args, "max_tokens", default=SUBAGENT_TOKENS, lo=MIN_TOKENS,
                         hi=max(MIN_TOKENS, self.worker.settings.round_tokens))
        record = run_subagent(self.worker, goal, budget=budget, hooks=self.hooks,
                              writes=bool(arg_bool(args, "allow_writes", default=False)))
        head = f"Subagent {record.reason} ({record.rounds} rounds, {record.generated} tokens)"
        return Observation(f"{head}:\n{record.summary or '(no summary)'}\n", ok=record.reason == "done")


def run_subagent(worker: WorkerPort, goal: str, *, budget: int, writes: bool,
                 hooks: AgentHooks | None = None) -> SubagentRecord:
    """Fork the live state, run the subagent's rounds, record and announce the result."""
    from ds4agent.engine import Sampler

    io, tok, s = worker.io, worker.tok, worker.settings
    t0 = time.monotonic()
    sid = io.new_id("subagent")
    parent = worker.session
    child = worker.engine.new_session()
    forked_at = len(parent.tokens)
    child.rewind(parent.snapshot())  # the fork: an O(1) reference to the parent's immutable state
    mode = "think" if worker.conv.think_mode == "think-max" else worker.conv.think_mode
    ids = list(worker.conv.transcript.ids)
    base = len(ids)
    brief = BRIEF.format(goal=goal, mode="" if writes else READ_ONLY_NOTE)
    ids += template.render(template.user_turn_pieces(brief, think_mode=mode), tok)
    card = _CardLog(io, sid)
    io.emit(ev.SubagentStarted(sid, goal, forked_at=forked_at, writes=writes))
    sampler = Sampler(temperature=s.temperature, top_p=s.top_p, min_p=s.min_p, seed=s.seed)
    generated = rounds = prefilled = 0
    first_token = 0.0
    summary = ""
    reason = "done"
    while True:
        try:
            prefilled += int(child.sync(list(ids), should_stop=io.should_stop))
        except Exception as err:  # the engine's Interrupted included: nothing more to do
            reason = "interrupted" if io.should_stop() else "error"
            summary = summary or ("" if reason == "interrupted" else f"engine error: {err}")
            break
        cap = min(budget - generated, s.ctx - len(ids) - 1)
        if cap <= 0:
            reason = "budget" if budget - generated <= 0 else "context_full"
            break
        rounds += 1
        stream = AssistantStream(tok, thinking=mode != "nothink")
        tokens = TokenStream(child, sampler, limit=cap, greedy=_structural(stream),
                             should_stop=io.should_stop, duty=worker.duty)
        text: list[str] = []
        n = 0
        for token in tokens:
            if tok.is_stop(token):
                break
            if not first_token:
                first_token = time.monotonic() - t0
            ids.append(token)
            n += 1
            for e in stream.feed(token, tok.token_bytes(token)):
                _relay(card, e, text)
            if token == tok.EOS or stream.closed:
                break
        for e in stream.finish():
            _relay(card, e, text)
        generated += n
        if ids[-1] != tok.EOS:
            ids.append(tok.EOS)
        summary = "".join(text).strip() or summary
        if tokens.interrupted:
            reason = "interrupted"
            break
        results = _results(worker, card, stream, writes, hooks)
        if results is None:
            if n >= cap:
                reason = "budget" if budget - generated <= 0 else "context_full"
            break  # an answer without a tool call: the summary
        ids += template.render(template.tool_results_pieces(results, think_mode=mode), tok)
    record = SubagentRecord(sid, goal, summary, tok.decode_bytes(ids[base:]).decode("utf-8", "replace"), reason,
                            rounds, generated, forked_at, prefilled, round(time.monotonic() - t0, 3),
                            round(first_token, 4), tuple(card.lines))
    worker.conv.subagent_ran(record)
    io.emit(ev.SubagentEnded(sid, summary, reason, rounds=rounds, generated=generated, seconds=record.seconds))
    return record


def _structural(stream: AssistantStream) -> Callable[[], bool]:
    """Argmax while the DSML classifier is in a structural state, as for the parent (worker.py)."""
    return lambda: stream.in_syntax


class _CardLog:
    """What the card is sent (SubagentDelta events), also kept, merged, for the record."""

    def __init__(self, io: Any, sid: str) -> None:
        self.io = io
        self.sid = sid
        self.lines: list[tuple[str, str]] = []

    def add(self, kind: str, text: str) -> None:
        self.io.emit(ev.SubagentDelta(self.sid, kind, text))
        if kind in ("thinking", "text") and self.lines and self.lines[-1][0] == kind:
            self.lines[-1] = (kind, self.lines[-1][1] + text)
        else:
            self.lines.append((kind, text))


def _relay(card: _CardLog, e: ev.Event, text: list[str]) -> None:
    """One of the subagent's stream events as a line of its card (and its answer text kept)."""
    if isinstance(e, ev.TextDelta):
        text.append(e.text)
        card.add("text", e.text)
    elif isinstance(e, ev.ThinkingDelta):
        card.add("thinking", e.text)
    elif isinstance(e, ev.ToolCallEnd):
        shown = " ".join(f"{k}={str(v)[:80]!r}" for k, v in e.args.items())
        card.add("tool", f"{e.name} {shown}".rstrip())
    elif isinstance(e, ev.ToolCallInvalid):
        card.add("error", f"invalid tool call: {e.reason}")


def _results(worker: WorkerPort, card: _CardLog, stream: AssistantStream, writes: bool,
             hooks: AgentHooks | None) -> list[str] | None:
    """The results of the round's calls (or its DSML error); None when it called nothing."""
    if stream.failed_thinking:
        return [dsml.error_result(stream.thinking_error)]
    if stream.error is not None:
        return [dsml.syntax_error_result(stream.error)]
    if stream.block_open:
        return [dsml.syntax_error_result(dsml.INCOMPLETE_REASON)]
    if not stream.done:
        return None
    texts = []
    for name, args in stream.calls:
        if worker.io.should_stop():
            texts.append(template.RESULT_NOT_RUN_INTERRUPTED)
            continue
        text = _call(worker, name, args, writes, hooks)
        texts.append(text)
        first = text.strip().splitlines()[0] if text.strip() else ""
        card.add("result", first[:200])
    return texts


def _call(worker: WorkerPort, name: str, args: Mapping[str, object], writes: bool, hooks: AgentHooks | None) -> str:
    from ds4agent.agent import permissions_glue

    tools = [t for t in worker.tools if t.name != TASK_TOOL]
    tool = next((t for t in tools if t.name == name), None)
    if name == TASK_TOOL:
        return REFUSED_NESTED
    if tool is None:
        return template.result_unknown_tool(name)
    if tool.mutates and not writes:
        return REFUSED_READ_ONLY.format(name=name)
    refusal = hooks.before_tool(worker, name, args) if hooks is not None else None
    if refusal is None and tool.mutates:
        refusal = permissions_glue.permit(worker, tool, args)
    if refusal is not None:
        return refusal
    result = run_tool(name, args, worker.tool_ctx, tools)
    return (hooks.after_tool(worker, name, args, result) if hooks is not None else result).text


# ---------------------------------------------------------------------- saved with the session

def save_records(worker: WorkerPort, session_id: str) -> None:
    """Write the live session's records for the session just saved (nothing when there are none)."""
    store = worker.store
    if store is None or not worker.conv.identity.subagents or not session_id:
        return
    path = subagents_path(store.directory, session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "subagents": [asdict(r) for r in worker.conv.identity.subagents]}
    atomic_write(path, (json.dumps(doc, ensure_ascii=True, indent=1) + "\n").encode("ascii"))


def load_records(worker: WorkerPort, session_id: str) -> None:
    """The records saved with a session (none when the file is missing or unreadable)."""
    worker.conv.subagents_loaded(_read_records(worker.store, session_id))


def _read_records(store: SessionStore | None, session_id: str) -> list[SubagentRecord]:
    """The records of a session's file, up to the first unreadable one."""
    records: list[SubagentRecord] = []
    if store is None or not session_id:
        return records
    try:
        doc = json.loads(subagents_path(store.directory, session_id).read_bytes())
        fields = set(SubagentRecord.__dataclass_fields__)
        for r in doc.get("subagents", ()):
            r = {k: v for k, v in r.items() if k in fields}
            r["lines"] = tuple((str(k), str(t)) for k, t in r.get("lines", ()))  # JSON gave lists
            records.append(SubagentRecord(**r))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return records
