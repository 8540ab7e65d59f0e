"""The worker: the DSML tool loop (prompt-and-dsml.md §6-§12, agent-reference.md §6).

Runs on the Agent's worker thread only (facade.py owns the thread and the queues; this module
never touches threads). One user turn = rounds until the model answers without a tool call:

    sync (prefill the transcript's new suffix; interruptible between chunks)
    -> sample (argmax while the DSML classifier is structural, the user's sampler otherwise)
    -> stream-parse (thinking / text / tool-call events) -> stop at the block's close
    -> EOS appended by the agent -> permissions -> run the invokes in order
    -> one results turn (+ queued text) -> next round

Invariants: the transcript only grows (wholesale replacements: new, load, compaction, rewind);
the live KV always holds a prefix of it; every assistant round ends with exactly one EOS; an
interrupt never leaves a half-appended unit. No tool-round limit; a per-round token cap
(--tokens, further capped by the room left).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, assert_never, cast

from ds4agent.agent import (
    compaction,
    history,
    hooks,
    mcp_glue,
    ops,
    permissions_glue,
    plan,
    rewind,
    sessionops,
    todos,
)
from ds4agent.agent import events as ev
from ds4agent.agent.compaction import MIN_RESERVE, RESULT_RESERVE, compact_threshold
from ds4agent.agent.conversation import Conversation
from ds4agent.agent.decode import TokenStream
from ds4agent.agent.edit_assist import EditAssist
from ds4agent.agent.journal import Journal
from ds4agent.agent.port import AgentIO
from ds4agent.agent.settings import AgentSettings
from ds4agent.agent.stream import TURN_END, AssistantStream, Coalescer, RoundEnd, RoundResult
from ds4agent.agent.subagent import TaskTool
from ds4agent.agent.trace import TraceLog
from ds4agent.engine import DutyCycle, EngineLost, Interrupted, Sampler
from ds4agent.protocol import dsml, template
from ds4agent.protocol.template import THINK_MAX_MIN_CTX
from ds4agent.protocol.tokenizer import Piece, Tokenizer
from ds4agent.tools import Tool, ToolContext, attach, default_tools, run_tool
from ds4agent.tools.args import unencodable
from ds4agent.tools.leftovers import remove_stale_temps
from ds4agent.tools.mcp import McpConfig, McpServers, missing_tool_text
from ds4agent.tools.permissions import PermissionPolicy
from ds4agent.tools.sandbox_settings import SandboxSettingsError, load_allowed_sockets

if TYPE_CHECKING:  # the engine and the store are handed in; only their types are needed here
    from ds4agent.engine import Engine, Session, SnapshotStore
    from ds4agent.sessions.store import SessionStore

# The system prompt is appended again once this many transcript tokens have passed since it last
# appeared (as ds4-agent does), so the tool rules never drift out of the model's attention.
SYSTEM_REMINDER_INTERVAL = 50_000
# Status events during generation are rate-limited (the UI redraws at most ~10 Hz anyway).
STATUS_INTERVAL = 0.25
_THINK_MAX_TOO_SMALL = f"think-max needs a context of at least {THINK_MAX_MIN_CTX} tokens; using think"

# A loader the worker thread runs: progress(0..1) -> the engine (facade.Agent's `engine` argument).
EngineLoader = Callable[[Callable[[float], None]], "Engine"]


class TurnAborted(Exception):
    """The turn cannot go on (context full after compaction, engine failure); message is readable."""


class Worker:
    """The agent's state and behaviour on the worker thread (it implements port.WorkerPort). `io`
    is the facade (events, questions, the interrupt flag and the queue of messages typed while
    busy). The engine, the session, the tokenizer, the sampler and the system text exist once
    startup() has run; nothing touches them before."""

    engine: Engine
    session: Session
    tok: Tokenizer
    sampler: Sampler

    def __init__(self, engine: Engine | EngineLoader, store: SessionStore | None, tools: list[Tool] | None,
                 settings: AgentSettings, *, io: AgentIO, policy: PermissionPolicy | None = None,
                 mcp: McpConfig | None = None) -> None:
        self.settings = settings
        self.io = io
        # The device's duty cycle (/power, --power): rests between prefill chunks and tokens.
        self.duty = DutyCycle(settings.power)
        # The local time the first user turn gives the model (a test sets a fixed one).
        self.local_now: Callable[[], datetime] = lambda: datetime.now().astimezone()
        self.store = store
        self._engine_src = engine
        self.builtin_tools: list[Tool] = list(tools) if tools is not None else default_tools(settings.edit_upto)
        self.mcp_config = mcp
        self.mcp: McpServers | None = None  # started by startup() when mcp names servers
        self.hooks = hooks.AgentHooks()  # none until startup reads them
        self.policy = policy if policy is not None else PermissionPolicy(settings.permission)
        self.tool_ctx = ToolContext(cwd=settings.cwd, should_stop=io.should_stop, on_write=self._record_write,
                                    edit_upto=settings.edit_upto)
        self.trace = TraceLog(None)  # disabled until startup opens --trace
        # The conversation's state (transcript, identity, turn times, status figures, ...): its
        # methods are the only way to change it (conversation.py).
        self.conv = Conversation(settings.effective_think_mode())
        self.journal: Journal | None = None
        self.state = ev.State.LOADING
        self.detail = ""
        # Rewind (rewind.py): the engine states before each user turn.
        self.snapshots: SnapshotStore | None = None

    # ================================================================== startup / shutdown

    @property
    def tools(self) -> list[Tool]:
        task = [TaskTool(self, self.hooks)] if self.settings.subagents else []
        return self.builtin_tools + list(mcp_glue.tools(self)) + list(self.conv.skills.tools()) + task

    def startup(self) -> bool:
        try:
            return self._startup()
        except BaseException:
            mcp_glue.stop(self)  # no server outlives a start that failed
            raise

    def _startup(self) -> bool:
        self.trace = TraceLog(self.settings.trace, on_error=lambda m: self.io.emit(ev.Notice(m, "warning")))
        try:
            self.tool_ctx.sockets = load_allowed_sockets()
        except SandboxSettingsError as err:
            self.io.emit(ev.Notice(f"{err}; jobs reach no Unix socket outside the tree", "warning"))
        self.trace.line("worker start")
        # Asked before the model loads; the servers then start while it loads.
        mcp_glue.start(self)
        self.hooks = hooks.start(self)  # a project's hooks file is asked about then too
        # Temp files of a write killed in an earlier run (crash, kill -9) go before any tool runs.
        for path in remove_stale_temps(self.settings.cwd):
            self.trace.line(f"removed a stale write temp {path}")
        self.tok = Tokenizer.load()
        s = self.settings
        self.sampler = Sampler(temperature=s.temperature, top_p=s.top_p, min_p=s.min_p, seed=s.seed)
        self.set_state(ev.State.LOADING, detail="loading model")
        src = self._engine_src
        if hasattr(src, "new_session"):
            self.engine = cast("Engine", src)
        else:
            def progress(fraction: float) -> None:
                self.set_state(ev.State.LOADING, progress=float(fraction), detail="loading model")

            self.engine = src(progress)
        if s.ctx != getattr(self.engine, "ctx", s.ctx):
            s.ctx = int(self.engine.ctx)  # the engine's context is the truth
        self.conv.use_think_mode(s.effective_think_mode())
        if s.think_mode == "think-max" and self.conv.think_mode != "think-max":
            self.io.emit(ev.Notice(f"{_THINK_MAX_TOO_SMALL} (context {s.ctx})", "warning"))
        device = getattr(self.engine, "device", None)
        notice = str(getattr(device, "notice", "") or "")
        if notice:
            self.io.emit(ev.Notice(notice, "warning"))  # e.g. no GPU: running on the CPU
        self.session = self.engine.new_session()
        make_store = getattr(self.engine, "snapshot_store", None)
        self.snapshots = make_store(s.snapshot_budget) if make_store is not None else None
        for note in getattr(self.store, "notices", ()):  # e.g. a KV directory open to other users
            self.io.emit(ev.Notice(note, "warning"))
        mcp_glue.join(self)  # the servers' tools are part of the system prefix
        cached = sessionops.start_system_prefix(self)
        if self.snapshots is not None and tuple(self.session.tokens) == tuple(self.conv.transcript.ids):
            # The system prefix is where every conversation of this run starts: going back in a
            # loaded or resumed session re-prefills from here at worst, never from token 0.
            self.snapshots.keep(self.session)
        for note in permissions_glue.start_notices(self):
            self.io.emit(ev.Notice(note, "warning"))
        self.io.emit(ev.Ready(model=_describe(self.engine), ctx=s.ctx, sysprompt_cached=cached,
                              device=getattr(device, "label", ""),
                              experts=str(getattr(self.engine, "expert_backend", "") or "")))
        sessionops.offer_resume(self)
        sessionops.open_requested(self)
        todos.publish(self)
        self.set_state(ev.State.IDLE)
        return True

    def close(self, *, discard: bool | None = None) -> None:
        """Stop bash jobs, close the trace and the journal. The journal is kept when the session
        has unsaved turns and the user was not asked (a plain shutdown: terminal closed, killed
        UI): the next start offers to resume it. discard=True after the save question."""
        if discard is None:
            discard = not self.conv.identity.unsaved_work
        try:
            self.tool_ctx.close()
        except Exception:  # shutdown must finish
            pass
        try:
            mcp_glue.stop(self)
        except Exception:  # shutdown must finish
            pass
        sessionops.close_journal(self, keep=not discard)
        self.trace.line("worker stop")
        self.trace.close()

    def _record_write(self, path: str, before: bytes | None, after: bytes) -> None:
        try:
            self.conv.undo_log(self.settings.undo_dir).record(path, before, after)
        except OSError as err:  # the write itself succeeded; only its undo is lost
            self.io.emit(ev.Notice(f"undo log not recorded for {path}: {err.strerror or err}",
                                   "warning"))

    # ================================================================== status

    def set_state(self, state: ev.State, *, progress: float | None = None, detail: str = "") -> None:
        self.state = state
        self.detail = detail
        self.emit_status(progress=progress)

    def emit_status(self, progress: float | None = None) -> None:
        s = self.settings
        self.io.emit(ev.Status(
            state=self.state,
            ctx_used=len(self.conv.transcript),
            ctx_total=s.ctx,
            compact_at=compact_threshold(s.ctx),
            progress=progress,
            generated=self.conv.generated,
            decode_tps=round(self.conv.decode_tps, 2),
            prefill_tps=round(self.conv.prefill_tps, 2),
            greedy=self.conv.greedy,
            unsaved=self.conv.identity.dirty,
            session_id=self.conv.identity.session_id[:8],
            title=self.title_text,
            think_mode=self.conv.think_mode,
            permission_mode=s.permission,
            power=self.duty.percent,
            detail=self.detail,
        ))

    @property
    def title_text(self) -> str:
        return sessionops.display_title(self.conv.identity.title)

    def set_think_mode(self, mode: str) -> None:
        """Later turns use the new THINK token. think-max's prefix lives in the system prefix, so it
        cannot be switched on inside a session (append-only): it takes effect at /new."""
        self.settings.think_mode = mode
        eff = self.settings.effective_think_mode()
        if eff == "think-max" and not self.conv.system_is_max:
            self.conv.use_think_mode("think")
            self.io.emit(ev.Notice("think-max takes effect with the next /new session", "warning"))
        elif mode == "think-max" and eff != "think-max":
            self.conv.use_think_mode("think")
            self.io.emit(ev.Notice(_THINK_MAX_TOO_SMALL, "warning"))
        else:
            self.conv.use_think_mode(eff)
        self.io.emit(ev.Notice(f"thinking mode: {self.conv.think_mode}"))
        self.emit_status()

    # ================================================================== one user turn

    def cmd_turn(self, text: str, queued: bool = False) -> None:
        t0 = time.monotonic()
        typed = text  # as sent, before hooks and attachments (what an interrupt gives back)
        prompt = self.hooks.prompt_submitted(self, text)
        if prompt is None:
            return  # a UserPromptSubmit hook blocked it (and said why)
        text = prompt
        self.io.emit(ev.UserTurn(text, queued=queued))
        if not self.conv.transcript.at_turn_boundary():
            # Defensive: a transcript must end at a boundary before a user turn (an EOS closes
            # every assistant round); close a dangling one rather than corrupt the layout.
            self.conv.transcript.append(self.tok.EOS)
        if self.settings.seed is not None:
            self.sampler.reseed(self.settings.seed)  # re-seeded at every user turn (reference)
        text = plan.decorate(self, self._attach(text))
        # The session's first user turn opens with the local date and time (template.py says why
        # there and not in a system unit of its own).
        date_line = "" if self.conv.transcript.has_user_turn() else template.session_date_line(self.local_now())
        user_ids = template.render(template.user_turn_pieces(text, think_mode=self._mode_for_prompt(),
                                                             date_line=date_line), self.tok)
        total_generated = 0
        rounds = 0
        reason = ev.TurnEnd.DONE
        error = ""
        cut = -1  # where the message begins, while it may still be taken back (see below)
        try:
            compaction.maybe_compact(self, len(self.conv.transcript) + len(user_ids), "soft")
            update = self.pending_results()
            if update:
                # After a compaction with running bash jobs: the update goes first, as a tool
                # result, and the message follows it (the results + text form of §9.1).
                user_ids = template.render(template.tool_results_pieces(update, queued=text,
                                                                        think_mode=self._mode_for_prompt()), self.tok)
            # Deep in a long session: the system prompt again, in front of the <｜User｜>.
            lead, reminded = self._lead(len(user_ids))
            # Its own BPE run (a special token on either side), so appended before the turn: the
            # turn itself still starts at its <｜User｜> (rewind points, turn times).
            lead_ids = self.tok.encode_pieces(lead)
            if len(self.conv.transcript) + len(lead_ids) + len(user_ids) + 1 >= self.settings.ctx:
                raise TurnAborted("context full: the message does not fit the context")
            cut = -1 if update else len(self.conv.transcript)
            if lead_ids:
                self._trace_append(lead_ids, "system")
                self.conv.transcript.extend(lead_ids)
                if reminded:
                    self.conv.transcript.system_seen()
            rewind.keep_boundary(self)
            self._trace_append(user_ids, "user")
            self.conv.transcript.extend(user_ids)
            self.conv.results_delivered()
            self.conv.changed()
            sessionops.journal_write(self)
            while True:
                rounds += 1
                self.io.emit(ev.RoundStarted(rounds))
                result = self._round()
                total_generated += result.generated
                # Journalled before its tools run: a command may run for minutes, and a crash
                # then must keep the round that asked for it.
                sessionops.journal_write(self)
                more = self._after_round(result)
                if result.reason == RoundEnd.CONTEXT_FULL and compaction.mid_response(self):
                    self._append_results([compaction.CONTINUE_NOTE])  # the turn goes on, compacted
                    more = True
                sessionops.journal_write(self)
                if not more:
                    reason = TURN_END.get(result.reason, ev.TurnEnd.DONE)
                    break
        except EngineLost:
            # No later turn can run (a pipeline rank is gone): journal what the turn got so far,
            # then the facade ends the session with the error (the next start offers to resume).
            self._close_round()
            sessionops.journal_write(self)
            raise
        except Exception as err:  # TurnAborted, engine failures, bugs: readable; the session stays usable
            reason, error = ev.TurnEnd.ERROR, str(err) or f"{type(err).__name__}: {err}"
            self._close_round()
            self.io.emit(ev.Error(error))
        finally:
            self.conv.turn_over()
        if reason == ev.TurnEnd.INTERRUPTED and rounds == 1 and total_generated == 0 and cut >= 0:
            # Interrupted before any answer (a large paste's prefill cut short): the message was
            # never read, so it goes back to the editor instead of staying in the context.
            rewind.take_back(self, cut, typed)
        self.io.emit(ev.TurnEnded(reason, rounds=rounds, generated=total_generated,
                                  seconds=round(time.monotonic() - t0, 3), error=error))
        self.hooks.stopped(self, reason)
        # The reference's footer after a failed turn reads `error: MSG` until the next action;
        # the agent is idle all the same (Agent.busy is what gates input).
        if error:
            self.set_state(ev.State.ERROR, detail=error)
        else:
            self.set_state(ev.State.IDLE)
        follow = plan.review(self, reason)  # plan mode: the user approves or sends the plan back
        if follow is not None:
            self.cmd_turn(follow)

    def _lead(self, unit_len: int) -> tuple[list[Piece], bool]:
        """What goes in front of the next unit's <｜User｜>: the system prompt again when
        SYSTEM_REMINDER_INTERVAL tokens have passed since it last appeared. Returns (pieces,
        whether the reminder is among them)."""
        lead: list[Piece] = []
        since = len(self.conv.transcript) + unit_len - self.conv.transcript.system_seen_at
        reminded = since >= SYSTEM_REMINDER_INTERVAL
        if reminded:
            self.trace.line(f"system prompt reminder after {since} tokens")
            lead += template.system_reminder_pieces(self.conv.system.builtin, extra_system_text=self.conv.system.extra,
                                                    tools=self.tools)
        return lead, reminded

    def _attach(self, text: str) -> str:
        """The message with its `@path` files and directories attached (tools/attach.py)."""
        att = attach.expand(text, self.tool_ctx)
        for note in att.notes:
            self.io.emit(ev.Notice(note, "warning"))
        if att.attached:
            self.io.emit(ev.Notice("attached " + ", ".join("@" + p for p in att.attached)))
        return att.text

    def _mode_for_prompt(self) -> str:
        return "think" if self.conv.think_mode == "think-max" else self.conv.think_mode

    def _close_round(self) -> None:
        """After a failure: make sure the transcript ends at a turn boundary (an EOS)."""
        if len(self.conv.transcript) > self.conv.transcript.system_len and self.conv.transcript.last != self.tok.EOS:
            self.conv.transcript.append(self.tok.EOS)

    def _trace_append(self, ids: list[int], tag: str) -> None:
        if self.trace.enabled:
            self.trace.tokens(len(self.conv.transcript), ids, self.tok.token_bytes, tag)

    # ------------------------------------------------------------------ sync (prefill)

    def sync(self, *, interruptible: bool = True) -> bool:
        """Bring the live KV up to the transcript. False when interrupted (state at a prefix)."""
        target = self.conv.transcript.ids
        live = self.session.tokens
        if len(live) != len(target) or tuple(live) != tuple(target):
            self.set_state(ev.State.PREFILL)
        t0 = time.monotonic()
        last = [t0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            tps = done / (now - t0) if now > t0 else 0.0
            self.conv.prefilling(tps)
            self.io.emit(ev.PrefillProgress(done, total, round(tps, 1)))
            if now - last[0] >= STATUS_INTERVAL:
                last[0] = now
                self.emit_status(progress=done / total if total else 1.0)

        try:
            n = self.session.sync(list(target), progress=progress,
                                  should_stop=self.io.should_stop if interruptible else None,
                                  duty=self.duty)
        except Interrupted:
            return False
        dt = time.monotonic() - t0
        # What the engine really prefilled (it may rewind further back than the transcript's change).
        self.conv.prefilled(int(n), n / dt if n and dt > 0 else None)
        if self.trace.enabled:
            self.trace.line(f"prefill {n} tokens in {dt:.3f}s")
        return True

    # ------------------------------------------------------------------ one assistant round

    def _round(self) -> RoundResult:
        tok = self.tok
        EOS = tok.EOS
        if self.io.should_stop() or not self.sync():
            # Interrupted before the first token: an empty output, THINK_TOKEN then EOS (§7).
            self.conv.transcript.append(EOS)
            return RoundResult(RoundEnd.INTERRUPTED)
        room = self.settings.ctx - len(self.conv.transcript) - 1  # keep one position for the EOS
        cap = min(self.settings.round_tokens, room)
        if cap <= 0:
            raise TurnAborted("context full: no room left to generate")
        # A round that would run into the end of the context stops while a compaction still fits
        # after it (its request and summary need room); the turn then goes on compacted.
        early = room - compaction.MIDTURN_RESERVE
        room_stop = 0 < early < cap
        cap = early if room_stop else cap
        assist = EditAssist(self.tool_ctx, tok.encode_untrusted)
        stream = AssistantStream(tok, thinking=self._mode_for_prompt() != "nothink", watch=assist.observe)
        out = Coalescer(self.io.emit)
        emit = out.add
        monotonic = time.monotonic
        is_stop = tok.is_stop
        token_bytes = tok.token_bytes
        ids = self.conv.transcript.ids
        trace = self.trace if self.trace.enabled else None
        # Argmax while the DSML classifier is in a structural state (§12), the user's sampler else.
        tokens = TokenStream(self.session, self.sampler, limit=cap, greedy=lambda: stream.in_syntax,
                             should_stop=self.io.should_stop, duty=self.duty)
        self.set_state(ev.State.GENERATING)
        t0 = time.monotonic()
        last_status = last_journal = t0
        journal_every = self.settings.journal_interval
        n = 0
        reason = RoundEnd.TOKEN_CAP
        for token in tokens:
            if is_stop(token):
                # Never evaluated, never appended: EOS replaces it (§7).
                reason = RoundEnd.STOP_TOKEN
                emit(ev.Notice(f"[generation stopped: the model sampled {tok.token_string(token)}]", "warning"))
                break
            ids.append(token)
            n += 1
            data = token_bytes(token)
            if trace is not None:
                trace.token(len(ids) - 1, token, data)
            for e in stream.feed(token, data):
                emit(e)
            out.tick(monotonic())
            if token == EOS:
                reason = RoundEnd.DONE
                break
            if stream.closed:  # DONE or ERROR: generation stops at the close (§11.6-7)
                reason = RoundEnd.DONE  # _classify reads which from the stream
                break
            if assist.failure is not None:  # an edit's old selects nothing: stop before its new
                reason = RoundEnd.PREFLIGHT
                break
            forced = assist.force_now(stream.in_string_body)
            if forced:
                tokens.force(forced)
                if trace is not None:
                    trace.line(f"forced {len(forced)} token(s): [upto]")
            if n & 15 == 0:
                now = time.monotonic()
                if now - last_journal >= journal_every:
                    # Mid-round journal: a crash now keeps the partial output (resume closes it
                    # with an EOS, as an interrupt would).
                    last_journal = now
                    sessionops.journal_write(self)
                if now - last_status >= STATUS_INTERVAL:
                    last_status = now
                    self.conv.decoding(n, n / (now - t0), greedy=stream.in_syntax)
                    out.flush()
                    self.emit_status()
        if tokens.interrupted:
            reason = RoundEnd.INTERRUPTED
        elif reason == RoundEnd.TOKEN_CAP and room_stop:
            reason = RoundEnd.CONTEXT_FULL
        dt = time.monotonic() - t0
        self.conv.decoding(n, n / dt if n and dt > 0 else None)
        for e in stream.finish():
            emit(e)
        out.flush()
        if ids[-1] != EOS:
            ids.append(EOS)  # the agent ends the turn (close, error, stop token, cap, interrupt)
        result = self._classify(stream, reason, n)
        if reason is RoundEnd.PREFLIGHT and assist.failure is not None and result.reason is RoundEnd.UNTERMINATED:
            index, text = assist.failure
            if assist.completed:
                text += (f"The {assist.completed} call(s) before this edit in the same block were not run; "
                         "call them again if they are still needed.\n")
            result = RoundResult(RoundEnd.PREFLIGHT, n, error=text, index=index)
        if trace is not None:
            self._trace_round_end(trace, stream, result, reason, n, dt)
        return result

    def _trace_round_end(self, trace: TraceLog, stream: AssistantStream, result: RoundResult, reason: RoundEnd,
                         n: int, dt: float) -> None:
        trace.line(f"round end: {reason.value}, {n} tokens, {dt:.3f}s")
        if stream.failed_thinking:
            trace.line("dsml ignored: tool call inside thinking")
        elif result.reason is RoundEnd.TOOLS:
            trace.line(f"dsml done: {len(result.calls)} call(s): " + ", ".join(name for name, _ in result.calls))
        elif result.reason is RoundEnd.DSML_ERROR:
            trace.line(f"dsml error: {result.error}")
        elif result.reason is RoundEnd.UNTERMINATED:
            trace.line("dsml unterminated")

    def _classify(self, stream: AssistantStream, reason: RoundEnd, n: int) -> RoundResult:
        if reason is RoundEnd.INTERRUPTED:
            return RoundResult(RoundEnd.INTERRUPTED, n)  # no results turn, ever (§7)
        if stream.failed_thinking:
            return RoundResult(RoundEnd.THINKING, n, error=stream.thinking_error)
        if stream.error is not None:
            return RoundResult(RoundEnd.DSML_ERROR, n, error=stream.error)
        if stream.done:
            return RoundResult(RoundEnd.TOOLS, n, calls=list(stream.calls))
        if stream.block_open:
            if reason is not RoundEnd.PREFLIGHT:
                self.io.emit(ev.ToolCallInvalid("tool call interrupted", raw=stream.raw_block, kind="interrupted"))
            return RoundResult(RoundEnd.UNTERMINATED, n)
        return RoundResult(reason, n)

    # ------------------------------------------------------------------ after a round

    def _after_round(self, result: RoundResult) -> bool:
        """Run tools / build the results turn. True when another round follows."""
        if result.reason is RoundEnd.THINKING:
            texts = [dsml.error_result(result.error)]
            self.io.emit(ev.ToolResult(0, "", False, texts[0]))
        elif result.reason in (RoundEnd.DSML_ERROR, RoundEnd.UNTERMINATED):
            # Malformed, stray or incomplete DSML: the error and the exact syntax, and the turn
            # goes on (the model usually gets it right the next round).
            reason = result.error if result.reason is RoundEnd.DSML_ERROR else dsml.INCOMPLETE_REASON
            texts = [dsml.syntax_error_result(reason)]
            self.io.emit(ev.ToolResult(0, "", False, texts[0]))
        elif result.reason is RoundEnd.PREFLIGHT:
            texts = [result.error]
            self.io.emit(ev.ToolResult(result.index, EditAssist.tool, False, result.error))
        elif result.reason is RoundEnd.TOOLS:
            texts = self._run_calls(result.calls)
        else:
            return False
        interrupted = self.io.should_stop() and not self.io.has_queued()
        if self.io.should_stop() and not interrupted:
            # Esc with a queued message: the message goes out in this results turn and the next
            # round answers it normally (§9.1), so the interrupt is spent here.
            self.io.clear_interrupt()
        self._append_results(texts)
        if interrupted:
            # Interrupt during tools without queued text: the next round ends before its first
            # token (THINK_TOKEN directly followed by EOS) and the turn is over (§9.1).
            self.conv.transcript.append(self.tok.EOS)
            return False
        return True

    def _append_results(self, texts: list[str]) -> None:
        mode = self._mode_for_prompt()
        queued = self.io.take_queued()
        if queued:
            queued = self._attach(queued)

        def render(ts: list[str], lead: list[Piece] | None = None) -> list[int]:
            # pending_results(): the bash job update when a compaction just ran (also one run
            # inside this function), after the results of this round's calls.
            return template.render(template.tool_results_pieces(ts + self.pending_results(), queued=queued,
                                                                think_mode=mode, lead=lead or ()), self.tok)

        ids = render(texts)
        projected = len(self.conv.transcript) + len(ids)
        if projected + RESULT_RESERVE >= self.settings.ctx:
            compaction.maybe_compact(self, projected, "hard", force=True)
            ids = render(texts)
            projected = len(self.conv.transcript) + len(ids)
            if projected + RESULT_RESERVE >= self.settings.ctx:
                # Still too big: replace the largest results by the error the reference gives.
                order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
                texts = list(texts)
                for i in order:
                    texts[i] = (
                        "Tool error: tool result still does not fit after context compaction "
                        f"(projected_prompt={projected} tokens, ctx={self.settings.ctx}, "
                        f"reserve={RESULT_RESERVE}). Retry with a smaller read/search/bash output."
                    )
                    ids = render(texts)
                    if len(self.conv.transcript) + len(ids) + RESULT_RESERVE < self.settings.ctx:
                        break
                if len(self.conv.transcript) + len(ids) + MIN_RESERVE >= self.settings.ctx:
                    raise TurnAborted("context full after compaction")
        else:
            compaction.maybe_compact(self, projected, "soft")
            ids = render(texts)
        lead, reminded = self._lead(len(ids))
        if reminded:
            with_lead = render(texts, lead)
            if len(self.conv.transcript) + len(with_lead) + RESULT_RESERVE < self.settings.ctx:
                ids = with_lead  # else the reminder waits for a unit it fits beside
            else:
                reminded = False
        if queued:
            self.io.emit(ev.UserTurn(queued, queued=True))
        self._trace_append(ids, "results")
        self.conv.transcript.extend(ids)
        if reminded:
            self.conv.transcript.system_seen()
        self.conv.results_delivered()

    def pending_results(self) -> list[str]:
        """Extra tool results for the next User turn: the bash job update after a compaction
        (Conversation.pending_results)."""
        return self.conv.pending_results(lambda: compaction.jobs_update(self))

    # ------------------------------------------------------------------ tools

    def _run_calls(self, calls: list[tuple[str, dict[str, object]]]) -> list[str]:
        """The result texts of a block's calls, in order. A message typed meanwhile never stops a
        call: it follows this round's results (_append_results). Once the user interrupts, the
        remaining calls are not run; a fixed text answers each of them."""
        texts: list[str] = []
        bad = next((why for _, args in calls if (why := unencodable(args)) is not None), None)
        if bad is not None:
            # Checked for the whole block before any call runs: text that cannot be UTF-8 fails
            # later (journal, transcript, the next prompt), after a write would have happened.
            for i, (name, _) in enumerate(calls):
                text = f"Tool error: invalid tool call: {bad}; no call of this block was run\n"
                self.io.emit(ev.ToolResult(i, name, False, text))
                texts.append(text)
            return texts
        for i, (name, args) in enumerate(calls):
            if self.io.should_stop():
                text = template.RESULT_NOT_RUN_INTERRUPTED
                self.io.emit(ev.ToolResult(i, name, False, text))
                texts.append(text)
            else:
                texts.append(self._run_one(i, name, args))
        return texts

    def _run_one(self, index: int, name: str, args: Mapping[str, object]) -> str:
        tools = self.tools
        tool = next((t for t in tools if t.name == name), None)
        if tool is None:
            # A `server__tool` of an MCP server that is not running (a session saved with it and
            # loaded without it, or a server that died) says so; anything else is unknown.
            text = missing_tool_text(name, self.mcp) or template.result_unknown_tool(name)
            self.io.emit(ev.ToolResult(index, name, False, text))
            return text
        self.set_state(ev.State.TOOL, detail=name)
        refusal = self.hooks.before_tool(self, name, args) or permissions_glue.permit(self, tool, args)
        if refusal is not None:
            self.io.emit(ev.ToolResult(index, name, False, refusal))
            return refusal
        t0 = time.monotonic()
        self.trace.line(f"tool {name} {args!r}")
        result = run_tool(name, args, self.tool_ctx, tools)
        result = self.hooks.after_tool(self, name, args, permissions_glue.after_run(self, name, args, result))
        elapsed = time.monotonic() - t0
        self.io.emit(ev.ToolResult(index, name, bool(result.ok), result.text, result.display, round(elapsed, 3)))
        todos.after_tool(self, result.display)
        return result.text

    # ================================================================== commands other than turns

    def run(self, command: ops.WorkerCommand) -> bool:
        """Run one command of the facade's queue (ops.py): the one place a command becomes
        the worker's work. True when the worker is to end (/quit, not cancelled at the save
        question)."""
        match command:
            case ops.Turn(text, queued):
                self.cmd_turn(text, queued)
            case ops.Save(title):
                self.cmd_save(title)
            case ops.LoadSession(prefix):
                self.cmd_load(prefix)
            case ops.NewSession():
                self.cmd_new()
            case ops.Compact():
                self.cmd_compact()
            case ops.Rewind(number, mode):
                self.cmd_rewind(number, mode)
            case ops.Fork(title):
                self.cmd_fork(title)
            case ops.DeleteSession(prefix):
                self.cmd_delete(prefix)
            case ops.Strip(prefix):
                self.cmd_strip(prefix)
            case ops.Quit():
                return self.confirm_leave()
            case _:
                assert_never(command)
        return False

    def cmd_save(self, title: str | None = None) -> None:
        sessionops.save(self, title)

    def cmd_load(self, prefix: str) -> None:
        target = sessionops.check_load_target(self, prefix)
        if target is not None and self.confirm_leave():
            sessionops.load(self, target)

    def cmd_delete(self, prefix: str) -> None:
        sessionops.delete(self, prefix)
        self.set_state(ev.State.IDLE)

    def cmd_strip(self, prefix: str) -> None:
        sessionops.strip(self, prefix)
        self.set_state(ev.State.IDLE)

    def cmd_new(self) -> None:
        if self.confirm_leave():
            sessionops.new_session(self)

    def cmd_compact(self) -> None:
        if len(self.conv.transcript) <= self.conv.transcript.system_len:
            self.io.emit(ev.Notice("nothing to compact"))
            return
        compaction.compact(self, "manual")
        self.set_state(ev.State.IDLE)

    def cmd_fork(self, title: str) -> None:
        sessionops.fork(self, title or None)

    def cmd_rewind(self, number: int | None, mode: str) -> None:
        """/rewind: the list of user turns (number None), or go back to turn `number`."""
        try:
            if number is None:
                self.io.emit(rewind.list_event(self))
            else:
                rewind.rewind(self, number, mode)
        except rewind.RewindError as err:
            self.io.emit(ev.Error(str(err)))
        self.set_state(ev.State.IDLE)

    def confirm_leave(self) -> bool:
        return sessionops.confirm_leave(self)

    def list_sessions_event(self) -> ev.SessionList:
        return sessionops.list_event(self)

    def history_event(self, n: int) -> ev.History:
        items = history.last_turns(self.tok, self.conv.transcript.snapshot(), self.conv.transcript.system_len, n)
        # `turns` is what is shown (fewer than asked when the session is shorter), so a UI's
        # "last N user turn(s)" header tells the truth.
        return ev.History(sum(1 for i in items if i.kind == "user"), tuple(items))


def _describe(engine: Engine) -> str:
    describe: Callable[[], str] | None = getattr(engine, "describe", None)
    if describe is not None:
        try:
            return str(describe())
        except Exception:
            pass
    cfg = getattr(engine, "config", None)
    return str(getattr(cfg, "name", None) or type(engine).__name__)
