"""Agent: the facade every UI drives. Commands in (plain method calls, any thread), events out.

    agent = Agent(engine, store, tools, settings)   # or Agent.from_run(run) for the CLI
    agent.start()                                    # worker thread: loads the model, system prefix
    agent.submit("fix the failing test")             # queued when busy (prompt-and-dsml.md §9.1)
    for ev in agent.poll_events(): ...               # never blocks; or agent.events.get(timeout=...)

Threading (architecture.md): the engine, the loop, tool execution, compaction and saves all run
on ONE worker thread owned by this object; the UI thread only puts commands on a queue, flips
the interrupt flag, and answers questions. Nothing here ever blocks the calling thread on the
model. Methods return at once; results arrive as events.

The busy rule (RUNS_WHILE_BUSY below) is stated here once: while a turn or command runs, only
submit (queues), steer (waits for the next tool boundary), interrupt, pull_queued, answer_permission,
list_sessions, save (deferred to the end of the turn), set_power and shutdown act; every other command answers
`Error("command requires the model to be idle: /load")` and is never queued, as the reference
does. The front ends read the same rule to refuse a command before calling (ui/commands.py).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ds4agent.agent import events as ev
from ds4agent.agent import ops
from ds4agent.agent.settings import PERMISSION_MODES, AgentRun, AgentSettings, think_mode_named
from ds4agent.engine import FULL_POWER, EngineLost

if TYPE_CHECKING:  # the worker (and with it the engine and the tools) is imported when an Agent is built
    from ds4agent.agent.custom_commands import CustomCommand
    from ds4agent.agent.identity import SubagentRecord
    from ds4agent.agent.worker import EngineLoader, Worker
    from ds4agent.engine import Engine
    from ds4agent.sessions.store import SessionStore
    from ds4agent.tools import Tool
    from ds4agent.tools.mcp import McpConfig
    from ds4agent.tools.permissions import PermissionPolicy

# The busy rule (agent-reference.md §3): while the model works only these slash commands run
# (/save is deferred to the end of the turn, /list only reads file headers, /help is the front
# end's own); every other one is refused with idle_required() and never queued.
# /power also runs while busy: a long prefill or generation is when a laptop gets hot, and the new
# percent is one int the engine reads at its next rest, so nothing the worker holds is touched.
# /steer exists for a busy agent: its text waits, like a queued message, for the next tool boundary.
RUNS_WHILE_BUSY = frozenset({"help", "save", "list", "power", "steer"})

# How /steer's text reaches the model: in the results turn after the call that is running, framed
# so the model takes it as a correction of the answer in progress, not as a new request.
STEER_LEAD = "Guidance from the user while you work (keep going with the current task, taking it into account):"


def steering_text(text: str) -> str:
    """/steer's guidance as the model reads it."""
    return f"{STEER_LEAD}\n{text}"


def power_line(percent: int) -> str:
    """How /power states the duty cycle (its answer and its confirmation)."""
    if percent >= FULL_POWER:
        return "power: 100% (full power, no rests)"
    return f"power: {percent}% (the device rests {FULL_POWER - percent}% of the time; output unchanged)"


def idle_required(command: str) -> str:
    """The refusal of a command (or of its key, e.g. Ctrl+D for /quit) while the model works."""
    return f"command requires the model to be idle: {command}"


class _Pending:
    """One question the worker is waiting on (permission or save/resume)."""

    __slots__ = ("event", "done", "answer", "message")

    def __init__(self, event: ev.Event) -> None:
        self.event = event
        self.done = threading.Event()
        self.answer = ""
        self.message = ""


class Agent:
    """The agent facade. See the module docstring.

    engine: an Engine (ds4agent.engine), or a callable `loader(progress) -> Engine`
            run on the worker thread (so the UI paints while the model loads; progress(0..1)
            becomes Status(state=LOADING, progress=...)).
    store:  the session store (ds4agent.sessions.store), or None (no sessions: /save etc. answer
            an error; the system prefix is prefilled instead of cached).
    tools:  a list of Tool objects (ds4agent.tools), or None for ds4agent.tools.default_tools().
    policy: a PermissionPolicy, or None to build one from settings.permission.
    mcp:    the MCP servers' configuration (ds4agent.tools.mcp.load_config), or None for none:
            started at startup, their tools added after `tools`.
    """

    def __init__(
        self,
        engine: Engine | EngineLoader,
        store: SessionStore | None = None,
        tools: list[Tool] | None = None,
        settings: AgentSettings | None = None,
        *,
        policy: PermissionPolicy | None = None,
        mcp: McpConfig | None = None,
    ) -> None:
        self.settings = settings or AgentSettings()
        self.events: queue.Queue[ev.Event] = queue.Queue()
        # What the worker thread runs next (ops.py); None ends its loop (shutdown).
        self._commands: queue.Queue[ops.WorkerCommand | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued: list[str] = []  # messages typed while busy, in order
        self._steer: list[str] = []  # /steer texts waiting for the next tool boundary, in order
        self._busy = False  # a command (turn, load, ...) is running or scheduled on the worker
        self._interrupt = threading.Event()
        self._stopping = threading.Event()
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._save_deferred = False
        self._save_title: str | None = None  # the title of a deferred /save TITLE
        self._thread: threading.Thread | None = None
        # Why the worker could not start (model not loadable, context too small, ...): set once,
        # when startup fails. From then on nothing is busy and nothing is queued: every message
        # and command is answered at once with this reason (a dead worker must not swallow input).
        self.failure: str | None = None
        # Deferred import keeps `import ds4agent.agent.facade` cheap (no numpy/mlx until start()).
        from ds4agent.agent.worker import Worker

        self._worker: Worker = Worker(engine, store, tools, self.settings, io=self, policy=policy, mcp=mcp)

    # ------------------------------------------------------------------ construction from the CLI

    @classmethod
    def from_run(cls, run: AgentRun) -> Agent:
        """The agent the CLI runs: model from run.model_path (loaded on the worker thread),
        store from --kv-dir, default tools, the MCP servers of the user's and the project's
        configuration, settings from the other flags."""
        from ds4agent.agent.wiring import build_from_run

        try:
            engine_loader, store, tools, settings, mcp = build_from_run(run)
        except Exception as err:  # e.g. the KV directory cannot be created
            # Never a traceback in the UI thread: the worker reports it as a fatal Error event.
            failure = err

            def engine_loader(progress: Callable[[float], None]) -> Engine:
                raise failure

            return cls(engine_loader, None, [], run.fresh_settings())
        return cls(engine_loader, store, tools, settings, mcp=mcp)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker thread (loads the model if a loader was given, then the system prefix)."""
        if self._thread is not None:
            return
        with self._lock:
            self._busy = True  # startup counts as busy: submits queue until Ready
        self._thread = threading.Thread(target=self._run, name="ds4agent-worker", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Stop now: interrupt the current turn, end the worker (no save question; see quit())."""
        self._stopping.set()
        self._interrupt.set()
        for pending in list(self._pending.values()):
            pending.done.set()
        self._commands.put(None)
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def quit(self) -> None:
        """Leave: asks "Save current session?" (a Question event) when there are unsaved turns,
        then stops the worker and publishes Exited. Requires idle, like the reference's /quit."""
        self._command(ops.Quit())

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ commands

    def submit(self, text: str) -> bool:
        """Send a message. Busy: it is queued (QueueChanged) and reaches the model at the next tool
        boundary or as the next turn. Returns False when the text is empty after trimming."""
        # The renderer's trim (C-locale spaces only), so "empty" means what the template rejects.
        # Imported here: `import ds4agent.agent` stays free of the engine (and its tokenizer).
        from ds4agent.protocol.template import trim

        text = trim(text)
        if not text:
            return False
        if self.failure is not None:
            self.emit(ev.Error(f"not sent: {self.failure}"))
            return False
        with self._lock:
            if self._busy:
                self._queued.append(text)
                items = self._queue_items_locked()
            else:
                self._busy = True
                self._interrupt.clear()
                self._commands.put(ops.Turn(text))
                return True
        self.emit(ev.QueueChanged(items))
        return True

    def custom_commands(self, reserved: frozenset[str] = frozenset()) -> tuple[list[CustomCommand], list[str]]:
        """The custom slash commands of the project and the user (custom_commands.py), skipping
        the `reserved` (built-in) names, and notes about the files that cannot be used. Reads only
        small files: any thread may call it."""
        from ds4agent.agent.custom_commands import find_commands

        s = self.settings
        return find_commands(s.cwd, s.user_config_dir(), reserved=reserved)

    def run_command(self, name: str, args: str = "") -> bool:
        """`/NAME args` of a custom command: its file's text (with `$ARGUMENTS`) is sent as a
        message (queued when busy, as typed text is). False, with an Error, when it cannot be."""
        from ds4agent.agent.custom_commands import CustomCommandError, expand

        found, _ = self.custom_commands()
        command = next((c for c in found if c.name == name), None)
        if command is None:
            self.emit(ev.Error(f"unknown custom command: /{name}"))
            return False
        try:
            text = expand(command, args)
        except CustomCommandError as err:
            self.emit(ev.Error(f"/{name}: {err}"))
            return False
        if not self.submit(text):
            self.emit(ev.Error(f"/{name}: {command.path} holds no prompt"))
            return False
        return True

    def subagents(self) -> list[SubagentRecord]:
        """The subagents the live conversation ran (restored with a loaded session)."""
        return list(self._worker.conv.identity.subagents)

    def pull_queued(self) -> str | None:
        """Take back the most recently queued message (Ctrl+X); None when the queue is empty."""
        with self._lock:
            if not self._queued:
                return None
            text = self._queued.pop()
            items = self._queue_items_locked()
        self.emit(ev.QueueChanged(items))
        return text

    def queued(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._queued)

    def steer(self, text: str) -> bool:
        """/steer TEXT: guidance for the answer in progress. It reaches the model at the next safe
        point, in the results turn after the tool call that is running (nothing is cancelled);
        when the answer ends without another tool call it is sent as the next message. Idle, it is
        simply sent as a message. False when the text is empty."""
        from ds4agent.protocol.template import trim

        text = trim(text)
        if not text:
            self.emit(ev.Error("usage: /steer <guidance for the answer in progress>"))
            return False
        with self._lock:
            busy = self._busy and self.failure is None
            if busy:
                self._steer.append(text)
                items = self._queue_items_locked()
        if not busy:
            return self.submit(text)
        self.emit(ev.QueueChanged(items))
        self.emit(ev.Notice("steering: the model reads it after the current tool call"))
        return True

    def interrupt(self) -> None:
        """Esc / Ctrl+C while busy: stop generation or prefill now (prompt-and-dsml.md §7, §9.1).
        A pending permission question is answered "deny"."""
        if not self._busy:
            return
        self._interrupt.set()
        for pending in list(self._pending.values()):
            if isinstance(pending.event, ev.PermissionRequest):
                pending.answer = "n"
                pending.done.set()

    def answer_permission(self, id: str, answer: str, message: str = "") -> bool:
        """Answer a PermissionRequest or Question by its id with one of its option keys.
        Returns False when no such question is pending (already answered, or stale)."""
        pending = self._pending.get(id)
        if pending is None or pending.done.is_set():
            return False
        pending.answer = answer
        pending.message = message
        pending.done.set()
        return True

    answer = answer_permission

    def save(self, title: str | None = None) -> None:
        """/save [TITLE]: idle -> save now; busy -> "save scheduled at next safe point" and save
        when the turn ends. A title becomes the session's title (stored in the file's title
        trailer). Result: SessionSaved + Notice, or Error("save failed: ...")."""
        if self.failure is not None:
            self.emit(ev.Error(f"save failed: {self.failure}"))
            return
        with self._lock:
            if self._busy:
                self._save_deferred = True
                self._save_title = title or self._save_title
                deferred = True
            else:
                deferred = False
                self._busy = True
                self._commands.put(ops.Save(title))
        if deferred:
            self.emit(ev.Notice("save scheduled at next safe point"))

    def load(self, prefix: str) -> None:
        """/load PREFIX (alias /switch): save question if unsaved, then restore the session with no
        prefill; SessionLoaded carries the last turns for display."""
        self._command(ops.LoadSession(prefix))

    def new(self) -> None:
        """/new: save question if unsaved, then reset to the system prefix (SessionNew)."""
        self._command(ops.NewSession())

    def compact(self) -> None:
        """/compact: summarise the conversation now (CompactionStarted ... CompactionDone)."""
        self._command(ops.Compact())

    def rewind_points(self) -> None:
        """/rewind: publishes RewindList (the session's user turns, 1 = the first)."""
        self._command(ops.Rewind())

    def rewind(self, number: int, mode: str = "both") -> None:
        """/rewind N [both|chat|code|fork]: go back to just before user turn N (rewind.py);
        Rewound carries the turn's prompt for the input box and how much was re-prefilled."""
        number = int(number)
        self._command(ops.Rewind(number, mode))

    def fork(self, title: str = "") -> None:
        """/fork [TITLE]: save the conversation as a new session (SessionSaved); the original
        file is left untouched and later saves go to the fork."""
        self._command(ops.Fork(title))

    def list_sessions(self) -> None:
        """/list: publishes SessionList (runs at once, busy or not: it only reads file headers)."""
        self.emit(self._worker.list_sessions_event())

    def delete(self, prefix: str) -> None:
        """/del PREFIX: asks "Delete session ...?" (a Question), then deletes the file; refuses
        the live session while it has unsaved turns. Idle only."""
        self._command(ops.DeleteSession(prefix))

    def strip(self, prefix: str) -> None:
        """/strip PREFIX: rewrite a saved session as a stripped file (its text and title kept, its
        KV state dropped; loading it prefills the text again). Idle only."""
        self._command(ops.Strip(prefix))

    def delete_session(self, prefix: str) -> str:
        """Delete a saved session by id prefix (the picker's `d`); runs in the caller's thread (it
        only unlinks a file). Returns the deleted path; raises the store's KVCError (readable)."""
        store = self._worker.store
        if store is None:
            raise RuntimeError("no session directory")
        path = store.delete(prefix)
        from ds4agent.agent.sessionops import forget_deleted

        forget_deleted(self._worker, path.stem)
        return str(path)

    def history(self, n: int = 3) -> None:
        """/history [N]: publishes History with the last N (1..200) human turns (idle only)."""
        if self._refused_while_busy("/history"):
            return
        n = max(1, min(200, int(n)))
        self.emit(self._worker.history_event(n))

    def set_think_mode(self, mode: str) -> None:
        """think | nothink | think-max, or a level 0 | 1 | 2 (/think N): changes the THINK token of
        later turns (think-max's system prefix cannot change inside a session: it takes effect at
        /new). Idle only."""
        if self._refused_while_busy("/nothink" if mode == "nothink" else "/think"):
            return
        try:
            mode = think_mode_named(mode)
        except ValueError as err:
            self.emit(ev.Error(str(err)))
            return
        self._worker.set_think_mode(mode)

    def set_power(self, percent: int | None = None) -> None:
        """/power [N]: the device computes at most N% of the time (1..100) from the next prefill
        chunk or token on; no N says the current value. Runs while busy (RUNS_WHILE_BUSY)."""
        worker = self._worker
        if percent is None:
            self.emit(ev.Notice(power_line(worker.duty.percent)))
            return
        if isinstance(percent, bool) or not 1 <= percent <= FULL_POWER:
            self.emit(ev.Error(f"/power takes a whole number from 1 to {FULL_POWER} (got {percent}); "
                               f"{FULL_POWER} is full power"))
            return
        worker.settings.power = percent
        worker.duty.percent = percent
        self.emit(ev.Notice(power_line(percent)))
        worker.emit_status()

    def set_permission_mode(self, mode: str) -> None:
        """ask | auto | read-only | plan for the tool calls that follow (allow-for-session grants
        are kept); idle only, so no tool call is being checked meanwhile. Confirmed by a Notice and
        Status."""
        if self._refused_while_busy("/permissions"):
            return
        if mode not in PERMISSION_MODES:
            self.emit(ev.Error(f"unknown permission mode: {mode} ({', '.join(PERMISSION_MODES)})"))
            return
        from ds4agent.agent import plan  # (the worker's side: imported once an Agent exists)

        plan.switch(self._worker, mode)

    def toggle_plan(self) -> None:
        """/plan and Shift+Tab: into plan mode (agent/plan.py), or back to the mode it left. Idle only."""
        if self._refused_while_busy("/plan"):
            return
        from ds4agent.agent import plan

        plan.toggle(self._worker)

    # ------------------------------------------------------------------ events

    def poll_events(self, max_events: int | None = None) -> list[ev.Event]:
        """Everything published so far (up to max_events), without blocking."""
        out: list[ev.Event] = []
        while max_events is None or len(out) < max_events:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        return out

    def emit(self, event: ev.Event) -> None:
        self.events.put(event)

    # ------------------------------------------------------------------ the worker's side (io)

    def should_stop(self) -> bool:
        return self._interrupt.is_set()

    def clear_interrupt(self) -> None:
        self._interrupt.clear()

    def stopping(self) -> bool:
        return self._stopping.is_set()

    def has_queued(self) -> bool:
        with self._lock:
            return bool(self._queued or self._steer)

    def take_queued(self) -> str:
        """All queued messages as one text (template.join_queued: numbered when several); empties
        the queue."""
        with self._lock:
            text = self._pop_queued_locked()
        if text:
            self.emit(ev.QueueChanged(()))
        return text

    def _pop_queued_locked(self) -> str:
        """The queue as one text ("" when empty) and emptied; the caller holds _lock."""
        # The renderer's rule; imported here so that importing the facade stays cheap.
        from ds4agent.protocol.template import join_queued

        text = join_queued([*self._queued, *(steering_text(t) for t in self._steer)])
        self._queued.clear()
        self._steer.clear()
        return text

    def _queue_items_locked(self) -> tuple[str, ...]:
        """What QueueChanged shows: the queued messages, then the /steer texts as typed."""
        return (*self._queued, *(f"/steer {t}" for t in self._steer))

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def ask(self, event: ev.PermissionRequest | ev.Question) -> tuple[str, str]:
        """Publish a question and wait for its answer (worker thread only). A permission question
        is answered "n" by an interrupt; every question is answered "n" by shutdown. The key comes
        back as one lower-case letter ("Y ", "yes" -> "y"; an empty answer -> "n")."""
        pending = _Pending(event)
        self._pending[event.id] = pending
        try:
            if isinstance(event, ev.PermissionRequest) and self._interrupt.is_set():
                return "n", ""
            self.emit(event)
            while not pending.done.wait(0.1):
                if self._stopping.is_set():
                    return "n", ""
            if self._stopping.is_set() and not pending.answer:
                return "n", ""
            return (pending.answer or "n").strip().lower()[:1] or "n", pending.message
        finally:
            self._pending.pop(event.id, None)

    # ------------------------------------------------------------------ internals

    def _refused_while_busy(self, command: str) -> bool:
        """The busy rule for a command that runs in the caller's thread: True (and an Error
        event) when the worker is busy."""
        if not self._busy:
            return False
        self.emit(ev.Error(idle_required(command)))
        return True

    def _command(self, command: ops.WorkerCommand) -> None:
        """Schedule a worker command, or refuse it by the busy rule (never queued)."""
        name = command.name
        if self.failure is not None:
            # No worker to run it: /quit leaves at once, anything else says why it cannot run.
            self.emit(ev.Exited(1) if isinstance(command, ops.Quit) else ev.Error(f"/{name} cannot run: {self.failure}"))
            return
        with self._lock:
            if self._busy:
                busy = True
            else:
                busy = False
                self._busy = True
                self._interrupt.clear()
                self._commands.put(command)
        if busy:
            self.emit(ev.Error(idle_required(f"/{name}")))

    def _run(self) -> None:
        worker = self._worker
        message = "startup failed"
        try:
            ok = worker.startup()
        except BaseException as err:  # a crash here must reach the UI as text, not a traceback
            message = f"startup failed: {err or type(err).__name__}"
            self.emit(ev.Error(message, fatal=True))
            self.emit(ev.Status(state=ev.State.ERROR, ctx_used=0, ctx_total=self.settings.ctx, compact_at=0,
                                detail=message))
            ok = False
        if not ok:
            self._fail_start(message)
            return
        self._after_command()
        discard: bool | None = None  # None: keep the journal if there are unsaved turns
        exit_status = 0
        while True:
            command = self._commands.get()
            if command is None or self._stopping.is_set():
                break
            try:
                if worker.run(command):  # /quit, and the user did not cancel at the save question
                    self._stopping.set()
                    discard = True  # the user answered the save question
                    break
            except EngineLost as err:
                # The engine cannot go on (a pipeline rank died): end here, keeping the journal.
                self.emit(ev.Error(f"{command.failure} failed: {err}", fatal=True))
                self._stopping.set()
                exit_status = 1
                break
            except Exception as err:  # every failure becomes a readable event
                self.emit(ev.Error(f"{command.failure} failed: {err}"))
            self._after_command()
        try:
            worker.close(discard=discard)
        finally:
            self.emit(ev.Exited(exit_status))

    def _fail_start(self, message: str) -> None:
        """The worker ends without having started: leave nothing busy and nothing queued (the
        messages typed while the model loaded can never be sent; say so, once), then Exited(1)."""
        self.failure = message
        with self._lock:
            self._busy = False
            dropped = len(self._queued) + len(self._steer)
            self._queued.clear()
            self._steer.clear()
        if dropped:
            self.emit(ev.QueueChanged(()))
            self.emit(ev.Error(f"{dropped} queued message{'' if dropped == 1 else 's'} not sent: "
                               "the agent could not start"))
        self.emit(ev.Exited(1))

    def _after_command(self) -> None:
        """End of a command on the worker: run a deferred save, then either start the next turn
        with the queued text or go idle."""
        from ds4agent.agent import todos

        # A load, rewind, new session or compaction may have brought another task list.
        todos.publish(self._worker)
        while True:
            with self._lock:
                save, title = self._save_deferred, self._save_title
                self._save_deferred, self._save_title = False, None
            if save:
                try:
                    self._worker.run(ops.Save(title))
                except Exception as err:
                    self.emit(ev.Error(f"save failed: {err}"))
            with self._lock:
                if self._stopping.is_set():
                    self._busy = False
                    return
                text = self._pop_queued_locked()
                if not text:
                    self._busy = False
            if not text:
                self._worker.emit_status()
                return
            self.emit(ev.QueueChanged(()))
            self._interrupt.clear()
            try:
                self._worker.run(ops.Turn(text, queued=True))
            except Exception as err:
                self.emit(ev.Error(f"turn failed: {err}"))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Tests / headless: block until the worker is idle with nothing queued (True) or timeout."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                idle = not self._busy and self._commands.empty()
            if idle or not self.running:
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def drain(self) -> Iterable[ev.Event]:
        return self.poll_events()

