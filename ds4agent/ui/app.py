"""The Textual app: header, conversation, input, status bar; agent events in, commands out.

    ds4agent                      -> main(run): Ds4App(agent_factory=lambda: Agent.from_run(run))
    Ds4App(agent=agent)           -> tests inject an agent built on the scripted engine

The first paint never waits for the model: the agent is built on a thread worker and its own worker
thread loads the weights, reporting progress as Status events ("loading model… 37%"). Until the
agent object exists, sent messages wait in a local list (shown as queued chips); after that the
agent queues them itself while it is busy.

Events cross into the UI at exactly one place, `_drain` (bridge.py): a 30 Hz timer takes what the
worker published, merges runs of deltas, and posts one `AgentEvents` message; the next drain waits
until that batch is drawn, so a fast model can never flood the message queue.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import var
from textual.widget import Widget
from textual.widgets import TextArea

from ds4agent.agent import events as ev
from ds4agent.agent.settings import AgentRun
from ds4agent.ui import bridge, commands, dispatch, fmt
from ds4agent.ui.history import InputHistory
from ds4agent.ui.messages import AgentEvents, AgentFailed, AgentReady
from ds4agent.ui.notify import Notifier
from ds4agent.ui.widgets.conversation import Conversation, ToolCard
from ds4agent.ui.widgets.prompt_input import CommandHints, PromptInput
from ds4agent.ui.widgets.queue_chips import QueueChips
from ds4agent.ui.widgets.status_bar import HeaderLine, StatusBar
from ds4agent.ui.widgets.todos import TodoPanel

if TYPE_CHECKING:  # the facade is imported by main() only: the first paint does not wait for it
    from ds4agent.agent.facade import Agent

SPINNER_INTERVAL = 0.125  # 8 Hz: the only animation faster than 4 Hz (ui.md)
# A question that opens on its own (permission, resume) ignores keys until the user has paused
# typing this long: faster than anyone reads a question, slower than the gap between typed keys.
TYPEAHEAD_GRACE_S = 0.5
NO_TOOL_CARD = "no tool card yet: Ctrl+O opens the last one once the model has used a tool"


class Ds4App(App):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses in other modules still find it
    TITLE = "ds4agent"
    ENABLE_COMMAND_PALETTE = False

    # The app's own state, as Textual vars. What is on screen lives with its widget: the status
    # bar and the header repaint themselves from `status_model` (widgets/status_bar.py), the chips,
    # the task list and the cards keep theirs.
    draining = var(False)            # a drained batch is still being drawn: the next drain waits
    picker_wanted = var(False)       # the next SessionList opens the picker (Ctrl+L, /load)
    picker_at_ready = var(False)     # --resume without a prefix: the picker once the model is ready
    rewind_wanted = var(False)       # the next RewindList opens the rewind screen (/rewind, Esc Esc)
    quitting = var(False)            # /quit (or a quit key) asked the agent to save and stop
    exit_status = var(0)             # 1 once the agent stopped on a fatal error
    # Why the model could not start (set once). From then on the app is only a screen to read
    # the error on and leave: nothing is busy, every quit key leaves at once, messages and
    # commands are answered with the reason, and main() prints it again after the full
    # screen has closed (the terminal would otherwise lose it with the screen).
    startup_error: var[str | None] = var(None)
    # A user-issued /new, /load or picker choice is on its way: when the switch happens, the view
    # is cleared through `switch_mark`, the last block before the command (None: all of it), so a
    # new session starts a clean view while what the command itself printed after it (e.g.
    # "saved session …" from the save question) stays. An agent-initiated resume clears nothing.
    switch_pending = var(False)
    switch_mark: var[Widget | None] = var(None)
    # After a rewind the view replays the turns that are left; /history is refused while the
    # agent is busy (its busy rule), and the rewind command is still finishing when its event
    # arrives, so the replay is asked for at the first drain that finds the agent idle.
    replay_due = var(False)
    # A message too big for the context, sent once and warned about: Enter again sends it.
    big_message_warned = var("")

    BINDINGS = [
        Binding("ctrl+q", "quit_request", "quit", show=False, priority=True),
        Binding("ctrl+c", "ctrl_c", "interrupt", show=False),
        Binding("ctrl+d", "quit_request", "quit", show=False),
        Binding("escape", "escape", "interrupt", show=False),
        Binding("ctrl+x", "pull_queued", "pull back", show=False),
        Binding("ctrl+t", "toggle_thinking", "thinking", show=False),
        Binding("ctrl+g", "toggle_todos", "tasks", show=False),
        # Priority: the input (a TextArea) would otherwise take Shift+Tab as "focus previous".
        Binding("shift+tab", "toggle_plan", "plan mode", show=False, priority=True),
        Binding("ctrl+o", "toggle_card", "tool card", show=False),
        Binding("ctrl+l", "picker", "sessions", show=False),
        Binding("f1", "help", "help", show=False),
    ]

    def __init__(
        self,
        agent_factory: Callable[[], Agent] | None = None,
        *,
        agent: Agent | None = None,
        cwd: str | None = None,
        history: InputHistory | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
        animate: bool = True,
        ctx: int = 0,
        think_mode: str = "think",
        permission: str = "ask",
        typeahead_grace: float = TYPEAHEAD_GRACE_S,
        open_picker: bool = False,
        notifier: Notifier | None = None,
    ) -> None:
        super().__init__()
        if agent is None and agent_factory is None:
            raise ValueError("Ds4App needs an agent or an agent factory")
        self.agent_factory = agent_factory
        self.agent: Agent | None = None
        self._given_agent = agent
        self.cwd = cwd if cwd is not None else os.getcwd()
        self.history = history if history is not None else InputHistory()
        self.clock = clock
        self.now = now
        self.spin = animate  # the running cards' spinner (tests draw still frames)
        self.typeahead_grace = typeahead_grace
        self.notifier = notifier  # rings the terminal when a long turn ends or a question waits
        self.last_typing = float("-inf")        # clock() of the last key typed (screens/TypeaheadGuard)
        self.status_model = fmt.StatusState(ctx_total=ctx, think_mode=think_mode, permission=permission)
        self._last_ctrl_c = -1e9               # clock() of the last Ctrl+C / Esc (twice quits / rewinds)
        self._last_escape = -1e9
        self.picker_at_ready = open_picker
        self.events_seen = 0                   # raw agent events handled (the benchmark reads it)
        self._event_table = self._event_handlers()

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield HeaderLine(self.status_model, self.cwd, id="header")
        yield Conversation(clock=self.clock, id="conversation")
        with Vertical(id="bottom"):
            yield CommandHints(id="hints")
            yield TodoPanel(id="todos")
            yield QueueChips(id="queue")
            yield PromptInput(self.history, cwd=self.cwd, id="input")
        yield StatusBar(self.status_model, id="status")

    # The main widgets are looked up once, at mount: a DOM query per event would walk the whole
    # conversation.
    conversation: Conversation
    input: PromptInput
    status_bar: StatusBar
    chips: QueueChips
    hints: CommandHints

    def on_mount(self) -> None:
        self.conversation = self.query_one(Conversation)
        self.input = self.query_one(PromptInput)
        self.status_bar = self.query_one(StatusBar)
        self.chips = self.query_one(QueueChips)
        self.hints = self.query_one(CommandHints)
        self.input.focus()
        self.set_interval(1 / bridge.DRAIN_HZ, self._drain)
        if self.spin:
            self.set_interval(SPINNER_INTERVAL, self._spin)
        if self._given_agent is not None:
            self._given_agent.start()
            self.post_message(AgentReady(self._given_agent))
        elif self.agent_factory is not None:  # one of the two (__init__)
            self._build_agent(self.agent_factory)

    @work(thread=True, exclusive=True, group="agent")
    def _build_agent(self, factory: Callable[[], Agent]) -> None:
        """Off the UI thread: constructing the agent may import numpy/MLX and open the store."""
        try:
            agent = factory()
            agent.start()
        except Exception as err:  # shown as one readable line, never a traceback
            self.post_message(AgentFailed(str(err) or type(err).__name__))
            return
        self.post_message(AgentReady(agent))

    def on_agent_ready(self, message: AgentReady) -> None:
        self.agent = message.agent
        for note in commands.use_custom_commands(self.agent):
            self.call_later(self.conversation.note, note, "warning")
        pending = self.chips.waiting
        for text in pending:
            self.agent.submit(text)
        # Handed over: the agent's queue now (its QueueChanged will say so), shown until then.
        self.chips.waiting, self.chips.queued = (), pending

    async def on_agent_failed(self, message: AgentFailed) -> None:
        self.exit_status = 1
        self.startup_error = message.text
        self.status_model.state = "error"
        self.status_model.detail = message.text
        await self.conversation.note(f"ds4agent: {message.text}", "error")
        dropped = len(self.chips.waiting)
        self.chips.waiting = ()
        if dropped:
            await self.conversation.note(
                f"{dropped} queued message{'' if dropped == 1 else 's'} not sent: the agent could not start", "error")
        await self.conversation.note(commands.FAILED_START_HINT, "warning")

    async def on_unmount(self) -> None:
        if self.agent is not None:
            # A model still loading cannot be cut short; its worker is a daemon thread, so do not
            # keep the terminal waiting for it.
            self.agent.shutdown(timeout=0.2 if self.loading else 2.0)

    # ------------------------------------------------------------------ the event boundary
    def _drain(self) -> None:
        if self.agent is None or self.draining:
            return
        if self.replay_due and not self.agent.busy:
            self.replay_due = False
            self.agent.history(3)
        events = self.agent.poll_events(bridge.MAX_EVENTS_PER_DRAIN)
        if events:
            self.draining = True
            self.post_message(AgentEvents(bridge.coalesce(events)))

    async def on_agent_events(self, message: AgentEvents) -> None:
        try:
            for event, count in message.batch:
                self.events_seen += count
                await self._handle(event, count)
        finally:
            self.draining = False

    def _spin(self) -> None:
        for card in self.conversation.running_cards():
            card.tick()

    async def _handle(self, e: ev.Event, n: int) -> None:
        ring = self.notifier.on_event(e) if self.notifier is not None else ""
        if ring and not self.is_headless and self._driver is not None:
            self._driver.write(ring)  # as App.bell() writes its BEL
        drawn = self._event_table.dispatch(e, n)
        if inspect.isawaitable(drawn):
            await drawn

    def _event_handlers(self) -> dispatch.EventTable[object]:
        """The app's side of the one event table (ui/dispatch.py): what each event does on screen.
        A handler is called as handler(event, n) and may return an awaitable, which is awaited
        before the next event is handled (a batch is drawn in order)."""
        status = self.status_model
        return dispatch.EventTable({
            # What only draws: straight to the widget (the status bar repaints itself from `status`).
            ev.Status: lambda e, n: status.apply_status(e),
            ev.PrefillProgress: lambda e, n: status.apply_prefill(e),
            # n: the tokens the (merged) deltas stand for, so the block's count is exact. Whatever
            # comes next (text, a tool card, a note, the turn's end) ends the block in Conversation.
            ev.ThinkingDelta: lambda e, n: self.conversation.thinking_delta(e.text, n),
            ev.TextDelta: lambda e, n: self.conversation.text_delta(e.text),
            ev.RoundStarted: lambda e, n: self.conversation.new_round(),
            ev.ToolCallStart: lambda e, n: self.conversation.tool_start(e.index, e.name),
            ev.ToolCallArgDelta: lambda e, n: self.conversation.tool_arg(e.index, e.param, e.text),
            ev.ToolCallEnd: lambda e, n: self.conversation.tool_end(e.index, e.name, e.args),
            ev.ToolCallInvalid: lambda e, n: self.conversation.tool_invalid(e.reason, e.raw, e.kind),
            ev.Notice: lambda e, n: self.conversation.note(e.text, "warning" if e.level == "warning" else "info"),
            ev.CompactionStarted: lambda e, n: self.conversation.note(fmt.compacting_line(e.reason), "warning"),
            ev.CompactionDelta: lambda e, n: self.conversation.compaction_delta(e.text, n),
            # The agent reports the outcome itself (a Notice, or an Error "compaction failed: …").
            ev.CompactionDone: lambda e, n: self.conversation.end_thinking(e.summary_tokens or None),
            ev.SubagentStarted: lambda e, n: self.conversation.subagent_start(e.id, e.goal, e.writes),
            ev.SubagentDelta: lambda e, n: self.conversation.subagent_delta(e.id, e.kind, e.text, n),
            ev.SubagentEnded: lambda e, n: self.conversation.subagent_end(e.id, e.summary, e.reason, e.rounds,
                                                                          e.generated, e.seconds),
            ev.TodoList: lambda e, n: self.query_one(TodoPanel).set_items(e.items),
            # What asks: a screen (see "questions" below).
            ev.PermissionRequest: lambda e, n: self._ask_permission(e),
            ev.Question: lambda e, n: self._ask_question(e),
            # What changes the app's state too: the handlers that follow, in this order.
            ev.ToolResult: self._show_tool_result, ev.UserTurn: self._show_user_turn,
            ev.TurnEnded: self._show_turn_ended, ev.QueueChanged: self._show_queue,
            ev.Error: self._show_error, ev.Ready: self._show_ready, ev.SessionSaved: self._show_saved,
            ev.SessionLoaded: self._show_loaded, ev.SessionNew: self._show_new,
            ev.SessionList: self._show_session_list, ev.History: self._show_history,
            ev.RewindList: self._show_rewind_list, ev.Rewound: self._show_rewound, ev.Exited: self._show_exited,
        })

    async def _show_tool_result(self, e: ev.ToolResult, n: int) -> None:
        self._close_stale_permission()
        await self.conversation.tool_result(e.index, e.name, e.ok, e.text, e.display, e.elapsed)

    async def _show_user_turn(self, e: ev.UserTurn, n: int) -> None:
        self.switch_pending = False  # the switch did not happen (cancelled or failed)
        self.replay_due = False  # a queued message went out first: the view goes on from it
        await self.conversation.user(e.text, queued=e.queued)

    async def _show_turn_ended(self, e: ev.TurnEnded, n: int) -> None:
        self._close_stale_permission()
        await self.conversation.end_turn()
        note = fmt.turn_end_note(e.reason, e.error, e.generated)
        if note:
            await self.conversation.note(*note)

    async def _show_queue(self, e: ev.QueueChanged, n: int) -> None:
        self.chips.queued, self.chips.loading = tuple(e.items), self.loading

    async def _show_error(self, e: ev.Error, n: int) -> None:
        await self.conversation.note(e.text, "error")
        if e.fatal:
            s = self.status_model
            s.state, s.detail = "error", e.text
            self.startup_error = self.startup_error or e.text

    async def _show_ready(self, e: ev.Ready, n: int) -> None:
        self.status_model.device, self.status_model.experts = e.device, e.experts
        self.chips.loading = False  # Esc can interrupt from now on
        await self.conversation.drop_notes(ev.SYSPROMPT_UPDATING)  # done: the ready line says so
        await self.conversation.note(fmt.ready_line(e.model, e.ctx, e.experts), "muted")
        if self.picker_at_ready and self.agent is not None:
            # --resume without a prefix: the picker, as soon as there is an agent to ask. The
            # listing runs while the worker still finishes its start-up.
            self.picker_at_ready = False
            self.picker_wanted = True
            self.agent.list_sessions()

    async def _show_saved(self, e: ev.SessionSaved, n: int) -> None:
        s = self.status_model
        s.session_id, s.title, s.dirty = e.short_id, e.title, False

    async def _show_loaded(self, e: ev.SessionLoaded, n: int) -> None:
        self.status_model.switch_session(e.short_id, e.title, e.tokens)
        await self._clear_for_switch()
        # The agent follows with its own "switched to session …" / "resumed …" notice.
        heading = fmt.loaded_history_heading(e.short_id, e.title, e.history)
        if heading:
            await self._replay(heading, e.history)

    async def _show_new(self, e: ev.SessionNew, n: int) -> None:
        self.status_model.switch_session()
        await self._clear_for_switch()
        await self.conversation.note("new session", "info")

    async def _show_session_list(self, e: ev.SessionList, n: int) -> None:
        if self.picker_wanted:
            from ds4agent.ui.screens.session_picker import SessionPicker

            self.picker_wanted = False
            self.push_screen(
                SessionPicker(e.sessions, directory=e.directory, delete=self._delete_session, now=self.now),
                self._picked,
            )
            return
        lines = fmt.session_list_lines(e.directory, e.sessions, self.now())
        await self.conversation.note("\n".join(lines), "info")

    async def _show_history(self, e: ev.History, n: int) -> None:
        if not e.items:
            await self.conversation.note(fmt.NO_HISTORY, "muted")
            return
        await self._replay(fmt.history_heading(e.turns), e.items)

    async def _show_rewind_list(self, e: ev.RewindList, n: int) -> None:
        if not self.rewind_wanted:
            return
        self.rewind_wanted = False
        if not e.points:
            await self.conversation.note("no user turns to rewind to yet", "info")
            return
        from ds4agent.ui.screens.rewind import RewindScreen

        def chosen(result: tuple[int, str] | None) -> None:
            if result is not None and self.agent is not None:
                self.agent.rewind(*result)

        self.push_screen(RewindScreen(e.points, e.note, now=self.now), chosen)

    async def _show_rewound(self, e: ev.Rewound, n: int) -> None:
        conv = self.conversation
        if e.mode != "code":
            # The view starts again from the rewound point: the last turns that are still there.
            children = conv.children
            if children:
                await conv.clear_through(children[-1])
            self.replay_due = True  # see its declaration
        for line in e.refused:
            await conv.note(f"not restored: {line}", "warning")
        if e.prompt and not self.input.text:
            self.input.restore(e.prompt)  # to edit and send again (a long one folded, as pasted)
        self.input.focus()

    async def _show_exited(self, e: ev.Exited, n: int) -> None:
        if self.quitting:
            self.exit(return_code=e.status)
            return
        # The worker stopped on its own (a fatal startup error): keep the error readable on
        # screen; leaving (Ctrl+D, /quit) then exits with the agent's status.
        s = self.status_model
        self.exit_status = e.status
        s.state = "error"
        s.detail = s.detail or "the agent stopped"
        self.startup_error = self.startup_error or s.detail
        await self.conversation.note(commands.FAILED_START_HINT, "warning")

    # ------------------------------------------------------------------ questions
    # Screens are imported where they are first shown: they pull in Button, Input and DataTable,
    # which the first paint does not need (bench/ui_stream.py measures time to first paint).
    def _ask_permission(self, e: ev.PermissionRequest) -> None:
        from ds4agent.ui.screens.permission import PermissionScreen

        def answered(result: tuple[str, str] | None) -> None:
            key, message = result or ("n", "")
            if self.agent is not None:
                self.agent.answer_permission(e.id, key, message)

        self.push_screen(PermissionScreen(e.question, e.detail, e.options), answered)

    def _close_stale_permission(self) -> None:
        """An interrupt answers a pending permission question inside the agent ("deny"); when the
        tool's result (or the turn's end) arrives while the question is still on screen, it is stale."""
        from ds4agent.ui.screens.permission import PermissionScreen

        if isinstance(self.screen, PermissionScreen):
            self.screen.dismiss(None)

    def _ask_question(self, e: ev.Question) -> None:
        from ds4agent.ui.screens.question import GuardedQuestionScreen

        keys = [k for k, _ in e.options] or ["y", "n"]
        options = e.options or (("y", "yes"), ("n", "no"))
        # Esc means "not now": cancel (stay) where offered, "n" for "Continue anyway?" (= stay);
        # never "discard" for the resume question, and nothing for a save question without cancel.
        escape = "c" if "c" in keys else ("n" if e.kind == "continue" else None)
        # Every agent question is guarded: even the save question of a command the user just gave
        # (/load, /new) opens while the next line may already be on its way.

        def answered(key: str | None) -> None:
            if self.agent is not None and key is not None:
                self.agent.answer_permission(e.id, key)
                if e.kind == "save" and key == "c":
                    self.quitting = False

        self.push_screen(GuardedQuestionScreen(e.question, options, escape_key=escape), answered)

    # ------------------------------------------------------------------ input
    @on(TextArea.Changed, "#input")
    def _input_changed(self) -> None:
        self.hints.show_for(self.input.text, self.input.text_before_cursor(), self.cwd)

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text
        self.hints.show_for("")
        if commands.is_command(text):
            await self.run_command(text)
            return
        if self.startup_error is not None:
            await self.conversation.note(commands.not_sent_after_failed_start(), "error")
            return
        if self.agent is None:
            self.chips.waiting += (text.strip(),)
            return
        warning = fmt.big_message_warning(text, self.status_model)
        if warning and text != self.big_message_warned:
            self.big_message_warned = text
            await self.conversation.note(warning, "warning")
            self.input.restore(text)
            return
        self.big_message_warned = ""
        self.agent.submit(text)

    @property
    def busy(self) -> bool:
        if self.startup_error is not None:
            return False  # nothing runs any more (and /quit must not wait for it)
        return self.agent is None or bool(self.agent.busy)

    async def run_command(self, line: str) -> None:
        """A slash command: the shared table's agent call, or this app's own handler for it."""
        try:
            cmd = commands.prepare(line, busy=self.busy, failed_start=self.startup_error is not None)
            own = self._command_handlers().get(cmd.name)
            if own is not None:
                await own(cmd)
            else:
                self._ask_agent(cmd)
        except commands.UnknownCommand as err:
            await self.conversation.note(str(err), "error")
            if not self.input.text:
                # Back to correct and send again, selected: typing a new command replaces it
                # instead of being appended to the wrong one.
                self.input.set_text(line.strip())
                self.input.select_all()
        except commands.CommandError as err:
            await self.conversation.note(str(err), "error")

    def _ask_agent(self, cmd: commands.ParsedCommand) -> None:
        if self.agent is None:  # the first moments of the start-up: a command that runs while busy
            raise commands.CommandError(f"{cmd.typed} cannot run yet: the model is still loading")
        commands.call_agent(cmd, self.agent)

    def _command_handlers(self) -> dict[str, Callable[[commands.ParsedCommand], Awaitable[None]]]:
        """What only the app does for a command (screens, the clipboard, clearing the view)."""
        return {"help": self._cmd_help, "save": self._cmd_save, "list": self._cmd_list, "load": self._cmd_load,
                "new": self._cmd_new, "rewind": self._cmd_rewind, "permissions": self._cmd_permissions,
                "copy": self._cmd_copy, "quit": self._cmd_quit}

    async def _cmd_help(self, cmd: commands.ParsedCommand) -> None:
        self.action_help()

    async def _cmd_save(self, cmd: commands.ParsedCommand) -> None:
        if self.agent is None:
            await self.conversation.note("save failed: the model is still loading", "error")
        else:
            self._ask_agent(cmd)

    async def _cmd_list(self, cmd: commands.ParsedCommand) -> None:
        if self.agent is not None:
            self._ask_agent(cmd)

    async def _cmd_load(self, cmd: commands.ParsedCommand) -> None:
        if cmd.arg:
            self._mark_switch()
            self._ask_agent(cmd)
        else:
            self.action_picker()

    async def _cmd_new(self, cmd: commands.ParsedCommand) -> None:
        self._mark_switch()
        self._ask_agent(cmd)

    async def _cmd_rewind(self, cmd: commands.ParsedCommand) -> None:
        number, _ = commands.rewind_args(cmd.arg)
        if number is None:
            self.action_rewind()  # the list opens as a screen
        else:
            self._ask_agent(cmd)

    async def _cmd_permissions(self, cmd: commands.ParsedCommand) -> None:
        if not cmd.arg:
            await self.conversation.note(commands.permissions_text(self.status_model.permission), "info")
        else:
            self._ask_agent(cmd)

    async def _cmd_copy(self, cmd: commands.ParsedCommand) -> None:
        conv = self.conversation
        answer = conv.last_answer_text
        if not answer:
            await conv.note("nothing to copy yet", "warning")
        else:
            self.copy_to_clipboard(answer)
            await conv.note(f"copied the last answer ({len(answer)} characters)", "info")

    async def _cmd_quit(self, cmd: commands.ParsedCommand) -> None:
        self.action_quit_request()

    def _picked(self, session_id: str | None) -> None:
        if session_id and self.agent is not None:
            self._mark_switch()
            self.agent.load(session_id)

    def _mark_switch(self) -> None:
        children = self.conversation.children
        self.switch_mark = children[-1] if children else None
        self.switch_pending = True

    async def _clear_for_switch(self) -> None:
        if self.switch_pending:
            self.switch_pending = False
            await self.conversation.clear_through(self.switch_mark)

    def _delete_session(self, session_id: str) -> str | None:
        """Deletes through the agent when it offers it; returns an error line otherwise."""
        delete = getattr(self.agent, "delete_session", None)
        if delete is None:
            return "deleting sessions is not available in this build (use: ds4agent kv rm PREFIX)"
        try:
            delete(session_id)
        except Exception as err:  # one readable line
            return f"delete failed: {err}"
        return None

    async def _replay(self, heading: str, items: Sequence[ev.HistoryItem]) -> None:
        """Saved turns between a heading and the end-of-history line (after /load, /history)."""
        await self.conversation.note(heading, "muted")
        await self.conversation.history(items, getattr(self.agent, "subagents", list)())
        await self.conversation.note(fmt.HISTORY_END, "muted")

    # ------------------------------------------------------------------ actions
    def action_help(self) -> None:
        from ds4agent.ui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_picker(self) -> None:
        if self.startup_error is not None:
            self.call_later(self.conversation.note, f"Ctrl+L cannot run: {commands.FAILED_START_HINT}", "error")
            return
        if self.busy or self.agent is None:  # busy: no agent object yet is loading
            self.call_later(self.conversation.note, commands.idle_required("/load"), "error")
            return
        self.picker_wanted = True
        self.agent.list_sessions()

    def action_rewind(self) -> None:
        """/rewind and Esc Esc: the list of user turns (the RewindList event opens the screen)."""
        if self.startup_error is not None:
            self.call_later(self.conversation.note, f"/rewind cannot run: {commands.FAILED_START_HINT}", "error")
            return
        if self.busy or self.agent is None:  # busy: no agent object yet is loading
            self.call_later(self.conversation.note, commands.idle_required("/rewind"), "error")
            return
        self.rewind_wanted = True
        self.agent.rewind_points()

    def action_toggle_thinking(self) -> None:
        self.conversation.toggle_thinking()

    def action_toggle_todos(self) -> None:
        self.query_one(TodoPanel).toggle()

    def action_toggle_plan(self) -> None:
        if self.screen is not self.screen_stack[0]:
            self.screen.focus_previous()  # in a dialog Shift+Tab keeps its usual meaning
        elif self.agent is not None:
            self.agent.toggle_plan()

    def action_toggle_card(self) -> None:
        focused = self.focused
        if not self.conversation.toggle_card(focused if isinstance(focused, ToolCard) else None):
            self.call_later(self.conversation.note, NO_TOOL_CARD, "muted")

    def action_scroll_conversation(self, direction: int) -> None:
        conv = self.conversation
        if direction < 0:
            conv.scroll_page_up()  # releases the anchor: the view stops following the tail
        else:
            conv.scroll_page_down()

    def action_follow_tail(self) -> None:
        self.conversation.anchor()

    @property
    def loading(self) -> bool:
        return self.agent is None or self.status_model.state == "loading"

    @property
    def turn_busy(self) -> bool:
        """A turn (or command) is running: Esc / Ctrl+C interrupt it. While the model loads they do
        not: an interrupt must never cut the start-up short."""
        return (self.agent is not None and bool(self.agent.busy) and not self.loading
                and self.startup_error is None)

    def interrupt(self) -> None:
        """Esc / Ctrl+C on a running turn: asked of the agent, and said in the status line at
        once (the work stops between prefill chunks or tokens, which may take a moment)."""
        if self.agent is not None:  # turn_busy: there is one
            self.agent.interrupt()
            self.status_model.interrupting = True

    def action_escape(self) -> None:
        if self.turn_busy:
            self.interrupt()
            return
        self.hints.show_for("")
        if self.input.text or self.busy:
            return
        # Esc Esc on an empty idle prompt: rewind (as Claude Code does).
        now = self.clock()
        if now - self._last_escape <= commands.ESC_ESC_WINDOW_S:
            self._last_escape = -1e9
            self.action_rewind()
        else:
            self._last_escape = now

    def action_ctrl_c(self) -> None:
        if self.turn_busy:
            self.interrupt()
            return
        field = self.input
        if field.text:
            field.clear()
            return
        now = self.clock()
        if now - self._last_ctrl_c <= commands.QUIT_WINDOW_S:
            self.action_quit_request()
            return
        self._last_ctrl_c = now
        self.call_later(self.conversation.note, commands.QUIT_HINT, "warning")

    def action_pull_queued(self) -> None:
        text: str | None
        if self.chips.waiting:
            *rest, text = self.chips.waiting
            self.chips.waiting = tuple(rest)
        elif self.agent is not None:
            text = self.agent.pull_queued()
        else:
            text = None
        if text is None:
            return
        field = self.input
        field.set_text(text if not field.text else field.text + "\n" + text)
        field.focus()

    def action_quit_request(self) -> None:
        agent = self.agent
        if agent is None or not agent.running or self.loading or self.startup_error is not None:
            # nothing to save yet (or the agent is gone): leave at once; on_unmount stops the worker
            self.exit(return_code=self.exit_status)
            return
        if agent.busy:
            self.call_later(self.conversation.note, commands.idle_required("/quit"), "error")
            return
        self.quitting = True
        agent.quit()


def main(run: AgentRun) -> int:
    """`ds4agent` with no subcommand: the full-screen app in the current directory."""
    from ds4agent.agent.facade import Agent
    from ds4agent.agent.notify_config import NotifyConfigError
    from ds4agent.ui.notify import for_run

    try:
        notifier = for_run(run, os.environ)
    except NotifyConfigError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    app = Ds4App(
        lambda: Agent.from_run(run),
        notifier=notifier,
        ctx=run.settings.ctx,
        think_mode=run.settings.think_mode,
        permission=run.settings.permission,
        open_picker=run.settings.resume == "",
    )
    app.run()
    if app.startup_error is not None:
        # The full screen (and the error on it) is gone: say it again where it stays.
        print(f"ds4agent: {app.startup_error}", file=sys.stderr)
    last = fmt.exit_line(app.status_model)
    if last:
        print(last)  # where the work is, left on the terminal after the screen closes
    return int(app.return_code or 0)
