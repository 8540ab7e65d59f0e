"""Plain mode (`ds4agent --plain`, or when stdout is not a terminal): one stream of text.

Two front ends over the same renderer:
- interactive (stdin and stdout are terminals): prompt_toolkit keeps a `ds4agent>` prompt and a
  one-line status at the bottom while output scrolls above (patch_stdout); Enter sends, Ctrl+J
  adds a line, Ctrl+C interrupts / clears, Ctrl+D on an empty line quits, Ctrl+X pulls back the
  last queued message, Esc interrupts while the model works.
- line mode (anything else, e.g. a pipe): each stdin line is a message or a command, answers go to
  stdout as plain text, questions read the next line (end of input answers "n", as the reference).

Events are drained and merged by the same bridge as the TUI (bridge.py).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

from ds4agent.agent import events as ev
from ds4agent.agent.settings import AgentRun
from ds4agent.ui import bridge, commands, dispatch, fmt, mentions, todo_panel, toolview
from ds4agent.ui.notify import Notifier

# style keys -> prompt_toolkit styles (plain text in line mode)
PT_STYLES = {
    "user": "bold",
    "marker": "bold fg:ansicyan",
    "thinking": "fg:ansibrightblack italic",
    "text": "",
    "tool": "bold fg:ansicyan",
    "ok": "fg:ansigreen",
    "fail": "fg:ansired",
    "muted": "fg:ansibrightblack",
    "warning": "fg:ansiyellow",
    "error": "bold fg:ansired",
    toolview.ADD: "fg:ansigreen",
    toolview.DEL: "fg:ansired",
    toolview.HUNK: "fg:ansicyan",
    toolview.CONTEXT: "fg:ansibrightblack",
    toolview.OUTPUT: "",
    toolview.FAILED: "fg:ansired",
    toolview.MUTED: "fg:ansibrightblack",
}

Write = Callable[[str, str], None]


class PlainRenderer:
    """Turns agent events into styled text pieces; `write(text, style_key)` puts them somewhere."""

    def __init__(self, write: Write, *, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], float] = time.time) -> None:
        self.write = write
        self.clock = clock
        self.now = now
        self.status = fmt.StatusState()
        self.mode: str | None = None       # "thinking" | "text" while a stream is open
        self.at_line_start = True
        self.think_started = 0.0
        self.think_tokens = 0
        self.last_answer = ""               # the last turn's answer, for /copy
        self.answer_text = ""
        self.questions: list[ev.Event] = []   # PermissionRequest / Question waiting for the front end
        self.exited: ev.Exited | None = None
        self.draft = ""  # a rewound turn's prompt, for the input line
        self._events = self._event_handlers()

    def out(self, text: str, style: str = "text") -> None:
        if text:
            self.write(fmt.terminal_safe(text), style)
            self.at_line_start = text.endswith("\n")

    def line(self, text: str, style: str = "text") -> None:
        self.close_stream()
        self.out(text + "\n", style)

    def close_stream(self) -> None:
        if self.mode == "thinking":
            secs = self.clock() - self.think_started
            if not self.at_line_start:
                self.out("\n", "thinking")
            tokens = self.think_tokens  # exact: the deltas carry their token counts
            self.out(f"(thought for {secs:.1f} s, {tokens} token{'' if tokens == 1 else 's'})\n", "muted")
        elif self.mode == "text" and not self.at_line_start:
            self.out("\n")
        self.mode = None

    def handle(self, e: ev.Event, n: int = 1) -> None:
        self._events.dispatch(e, n)

    def _event_handlers(self) -> dispatch.EventTable[None]:
        """Plain mode's side of the one event table (ui/dispatch.py)."""
        return dispatch.EventTable({
            ev.Status: lambda e, n: self.status.apply_status(e),
            ev.PrefillProgress: lambda e, n: self.status.apply_prefill(e),
            ev.UserTurn: self._user_turn, ev.ThinkingDelta: self._thinking,
            ev.TextDelta: self._text, ev.CompactionDelta: self._text,
            ev.ToolCallStart: lambda e, n: self.close_stream(), ev.ToolCallEnd: self._tool_end,
            ev.ToolResult: self._tool_result, ev.ToolCallInvalid: self._tool_invalid,
            ev.TurnEnded: self._turn_ended, ev.Notice: self._notice,
            ev.Error: lambda e, n: self.line(f"ds4agent: {e.text}", "error"),
            ev.Ready: self._ready, ev.SessionSaved: self._saved, ev.SessionLoaded: self._loaded,
            ev.SessionNew: self._new, ev.SessionList: lambda e, n: self.print_sessions(e),
            ev.RewindList: self._rewind_list, ev.Rewound: self._rewound, ev.History: self._history,
            ev.CompactionStarted: lambda e, n: self.line(fmt.compacting_line(e.reason), "warning"),
            # The agent reports a compaction's outcome itself (a Notice or an Error).
            ev.CompactionDone: lambda e, n: self.close_stream(),
            ev.PermissionRequest: self._question, ev.Question: self._question, ev.Exited: self._exited,
            ev.TodoList: self._todos,
            # A line mode shows a subagent's start, its calls and its outcome, not its stream.
            ev.SubagentStarted: lambda e, n: self.line(f"⎇ subagent: {fmt.clip(e.goal, 100)}", "muted"),
            ev.SubagentDelta: lambda e, n: (self.line(f"  ⎇ {fmt.clip(e.text, 100)}", "muted")
                                            if e.kind == "tool" else None),
            ev.SubagentEnded: lambda e, n: self.line(
                f"⎇ subagent {e.reason} ({e.rounds} rounds, {e.generated} tokens, {e.seconds:.1f} s): "
                f"{fmt.clip(e.summary, 100)}", "muted"),
        })

    def _todos(self, e: ev.TodoList, n: int) -> None:
        """The whole list each time it changes (a line editor has no panel to update)."""
        self.close_stream()
        for style, text in todo_panel.lines(e.items, 78, max_rows=len(e.items)):
            self.line(text, "muted" if style in ("done", "more", "header") else "text")

    def _user_turn(self, e: ev.UserTurn, n: int) -> None:
        self.close_stream()
        self.answer_text = ""
        self.out("\n› ", "marker")
        self.out(e.text + ("  (sent while busy)" if e.queued else "") + "\n\n", "user")

    def _thinking(self, e: ev.ThinkingDelta, n: int) -> None:
        if self.mode != "thinking":
            self.close_stream()
            self.mode = "thinking"
            self.think_started = self.clock()
            self.think_tokens = 0
            e_text = e.text.lstrip("\n")
        else:
            e_text = e.text
        self.think_tokens += n
        self.out(e_text, "thinking")

    def _text(self, e: ev.TextDelta | ev.CompactionDelta, n: int) -> None:
        text = e.text
        if self.mode != "text":
            self.close_stream()
            text = text.lstrip()
            if not text:
                return
            self.mode = "text"
        if isinstance(e, ev.TextDelta):
            self.answer_text += text
        self.out(text, "text" if isinstance(e, ev.TextDelta) else "thinking")

    def _tool_end(self, e: ev.ToolCallEnd, n: int) -> None:
        self.close_stream()
        self.out("⏺ ", "tool")
        self.out(f"{e.name}  {toolview.tool_summary(e.name, e.args)}\n")

    def _tool_result(self, e: ev.ToolResult, n: int) -> None:
        self.close_stream()
        failed = toolview.result_failed(e.name, e.ok, e.text, e.display)
        status = toolview.result_status(e.name, e.ok, e.text, e.display, e.elapsed)
        self.out(("  ✗ " if failed else "  ✓ ") + status + "\n", "fail" if failed else "ok")
        for style, text in toolview.result_body(e.name, e.ok, e.text, e.display):
            self.out("  │ ", "muted")
            self.out(text + "\n", style)

    def _tool_invalid(self, e: ev.ToolCallInvalid, n: int) -> None:
        self.line(f"[{toolview.invalid_call_label(e.kind)}: {e.reason}]", "error")

    def _turn_ended(self, e: ev.TurnEnded, n: int) -> None:
        self.close_stream()
        if self.answer_text.strip():
            self.last_answer = self.answer_text.strip()
        note = fmt.turn_end_note(e.reason, e.error, e.generated)
        if note:
            self.line(*note)

    def _notice(self, e: ev.Notice, n: int) -> None:
        self.line(e.text, "warning" if e.level == "warning" else "muted")

    def _ready(self, e: ev.Ready, n: int) -> None:
        self.status.device, self.status.experts = e.device, e.experts
        self.line(fmt.ready_line(e.model, e.ctx, e.experts), "muted")

    def _saved(self, e: ev.SessionSaved, n: int) -> None:
        s = self.status
        s.session_id, s.title, s.dirty = e.short_id, e.title, False

    def _loaded(self, e: ev.SessionLoaded, n: int) -> None:
        self.status.switch_session(e.short_id, e.title, e.tokens)
        # The agent follows with its own "switched to session …" / "resumed …" notice.
        heading = fmt.loaded_history_heading(e.short_id, e.title, e.history)
        if heading:
            self.replay(heading, e.history)

    def _new(self, e: ev.SessionNew, n: int) -> None:
        self.status.switch_session()
        self.line("─" * 40 + " new session", "muted")

    def _rewind_list(self, e: ev.RewindList, n: int) -> None:
        for row in fmt.rewind_list_lines(e.points, e.note, self.now()):
            self.line(row, "muted")

    def _rewound(self, e: ev.Rewound, n: int) -> None:
        # The agent's notice says what happened; files left alone are listed one by one.
        for line in e.refused:
            self.line(f"  not restored: {line}", "warning")
        if e.prompt:
            self.draft = e.prompt  # back in the input (interactive), to edit and re-send

    def _history(self, e: ev.History, n: int) -> None:
        if not e.items:
            self.line(fmt.NO_HISTORY, "muted")
        else:
            self.replay(fmt.history_heading(e.turns), e.items)

    def _question(self, e: ev.PermissionRequest | ev.Question, n: int) -> None:
        self.close_stream()
        self.questions.append(e)

    def _exited(self, e: ev.Exited, n: int) -> None:
        self.close_stream()
        self.exited = e

    def replay(self, heading: str, items) -> None:
        """Saved turns between a heading and the end-of-history line (after /load, /history)."""
        self.line(heading, "muted")
        for item in items:
            if item.kind == "user":
                self.out("› ", "marker")
                self.out(item.text + "\n", "user")
            elif item.kind == "thinking":
                self.line(item.text.strip(), "thinking")
            elif item.kind == "text":
                self.line(item.text.strip())
            elif item.kind == "tool_call":
                self.out("⏺ ", "tool")
                self.out(f"{item.name}  {toolview.tool_summary(item.name, item.args)}\n")
            else:
                self.line(fmt.clip(item.text, 200), "muted")
        self.line(fmt.HISTORY_END, "muted")

    def print_sessions(self, e: ev.SessionList) -> None:
        heading, *rows = fmt.session_list_lines(e.directory, e.sessions, self.now())
        self.line(heading, "muted")
        for row in rows:
            self.line(row)


class PlainFrontEnd:
    """What both plain front ends share: commands and event pumping."""

    def __init__(self, agent: Any, renderer: PlainRenderer) -> None:
        self.agent = agent
        self.r = renderer
        self.quitting = False
        # A /load or /new is running on the worker: the next command typed at the interactive
        # prompt waits for it instead of being refused as "requires the model to be idle".
        self.switching = False
        self.width: Callable[[], int | None] = lambda: None  # the terminal's columns, when there is one
        # Interactive runs ring the terminal (ui/notify.py) through `ring`; line mode does not.
        self.notifier: Notifier | None = None
        self.ring: Callable[[str], None] = lambda seq: None
        for note in commands.use_custom_commands(agent):
            renderer.line(note, "warning")

    def pump(self) -> int:
        events = self.agent.poll_events(bridge.MAX_EVENTS_PER_DRAIN)
        for e, n in bridge.coalesce(events):
            if self.notifier is not None and (seq := self.notifier.on_event(e)):
                self.ring(seq)
            self.r.handle(e, n)
        return len(events)

    def run_command(self, line: str, *, copy: Callable[[str], bool] | None = None) -> str | None:
        """Run a slash command (the shared table's agent call, or plain mode's own handler for it);
        the line when the command is unknown, else None."""
        own: dict[str, Callable[[commands.ParsedCommand], None]] = {
            "help": self._cmd_help, "load": self._cmd_load, "new": self._cmd_new,
            "permissions": self._cmd_permissions, "copy": lambda cmd: self._cmd_copy(copy),
            "quit": self._cmd_quit,
        }
        try:
            cmd = commands.prepare(line, busy=bool(self.agent.busy))
            handler = own.get(cmd.name)
            if handler is not None:
                handler(cmd)
            else:
                commands.call_agent(cmd, self.agent)
        except commands.UnknownCommand as err:
            self.r.line(str(err), "error")
            return line.strip()
        except commands.CommandError as err:
            self.r.line(str(err), "error")
        return None

    def _cmd_help(self, cmd: commands.ParsedCommand) -> None:
        self.r.line(commands.help_text(self.width(), plain=True), "muted")

    def _cmd_load(self, cmd: commands.ParsedCommand) -> None:
        if cmd.arg:
            self.switching = True
            commands.call_agent(cmd, self.agent)
        else:
            self.r.line("usage: /load <id-prefix> (saved sessions below)", "muted")
            self.agent.list_sessions()

    def _cmd_new(self, cmd: commands.ParsedCommand) -> None:
        self.switching = True
        commands.call_agent(cmd, self.agent)

    def _cmd_permissions(self, cmd: commands.ParsedCommand) -> None:
        if not cmd.arg:
            self.r.line(commands.permissions_text(self.r.status.permission), "muted")
        else:
            commands.call_agent(cmd, self.agent)

    def _cmd_copy(self, copy: Callable[[str], bool] | None) -> None:
        r = self.r
        text = r.last_answer
        if not text:
            r.line("nothing to copy yet", "warning")
        elif copy is not None and copy(text):
            r.line(f"copied the last answer ({len(text)} characters)", "muted")
        else:
            r.line("copy needs a terminal (the output is not one)", "error")

    def _cmd_quit(self, cmd: commands.ParsedCommand) -> None:
        self.quitting = True
        commands.call_agent(cmd, self.agent)


def completions_for(text_before_cursor: str, cwd: str) -> list[tuple[str, int, str]]:
    """Tab in plain mode: (replacement, start offset from the cursor, description) for a /command
    being typed as the line's first word, or an @path under the cursor."""
    if text_before_cursor.startswith("/") and " " not in text_before_cursor:
        return [("/" + c.name, -len(text_before_cursor), c.help) for c in commands.completions(text_before_cursor)]
    partial = mentions.mention_at_cursor(text_before_cursor)
    if partial is None:
        return []
    return [("@" + path, -len(partial) - 1, "") for path in mentions.candidates(cwd, partial)]


def question_prompt(e: ev.Event) -> tuple[str, tuple[str, ...]]:
    options = getattr(e, "options", ()) or (("y", "yes"), ("n", "no"))
    keys = tuple(k for k, _ in options)
    labels = ", ".join(f"{k} = {label}" for k, label in options)
    text = e.question  # type: ignore[attr-defined]
    detail = getattr(e, "detail", "")
    return (f"{detail}\n{text} ({labels}) " if detail else f"{text} ({labels}) "), keys


# Questions only a person at a terminal may answer: a script's next line is never taken for one
# (the project's MCP servers would start, or not, on whatever line came next).
PERSON_ONLY = frozenset({"mcp"})


def line_answer(q: ev.Event, keys: tuple[str, ...], person: bool, read: Callable[[], str],
                unread: Callable[[str], None], say: Callable[[str], None]) -> str:
    """The answer to a question in line mode. A person (stdin a terminal) is asked again after an
    answer that is not one of the keys. Piped input answers only with a line that is exactly a
    key (or yes/no); any other line is left to run as the next message or command, and the
    question gets its safe answer (cancel where offered, else no); a PERSON_ONLY question never
    reads the pipe at all. End of input answers "n", as the reference does."""
    safe = "c" if "c" in keys else "n"
    if not person and getattr(q, "kind", "") in PERSON_ONLY:
        say("(no one at a terminal to answer) ")
        return "n"
    while True:
        line = read()
        if not line:
            return "n"
        word = line.strip().lower()
        word = {"yes": "y", "no": "n"}.get(word, word)
        if word in keys:
            return word
        if not person:
            unread(line)
            say("(not an answer: left as the next input) ")
            return safe
        say(f"answer with one of: {', '.join(keys)} ")


# ----------------------------------------------------------------------------------- line mode
def run_lines(agent: Any, stdin, stdout, *, poll: float = 0.02) -> int:
    """Non-interactive plain mode: one stdin line per message or command; plain text out."""

    def write(text: str, style: str) -> None:
        stdout.write(text)
        stdout.flush()

    r = PlainRenderer(write)
    fe = PlainFrontEnd(agent, r)
    agent.start()

    person = bool(getattr(stdin, "isatty", lambda: False)())
    pending: list[str] = []  # a line read for a question that was not an answer: it runs next

    def next_line() -> str:
        return pending.pop(0) if pending else stdin.readline()

    def answer_questions() -> None:
        while r.questions:
            q = r.questions.pop(0)
            prompt, keys = question_prompt(q)
            write(prompt, "muted")
            answer = line_answer(q, keys, person, next_line, pending.append,
                                 lambda text: write(text, "muted"))
            write(answer + "\n", "muted")
            agent.answer_permission(q.id, answer)  # type: ignore[attr-defined]

    def settle() -> None:
        """Pump until the agent is idle with nothing left to show (or it exited)."""
        quiet = 0
        while r.exited is None:
            got = fe.pump()
            answer_questions()
            if not agent.busy and not got:
                quiet += 1
                if quiet >= 3:
                    return
            else:
                quiet = 0
            time.sleep(poll)

    settle()
    while r.exited is None:
        raw = next_line()
        if not raw:
            break
        text = raw.rstrip("\n")
        if not text.strip():
            continue
        if commands.is_command(text):
            fe.run_command(text)
        else:
            agent.submit(text)
        settle()
    if r.exited is None:
        fe.quitting = True
        agent.quit()
        settle()
    r.close_stream()
    agent.shutdown(timeout=2.0)
    last = fmt.exit_line(r.status)
    if last:
        r.line(last, "muted")
    return r.exited.status if r.exited is not None else 0


# ----------------------------------------------------------------------------------- interactive
_QUIT = object()
_QUESTION = object()


def _completer_class():
    from prompt_toolkit.completion import Completer, Completion

    class Completions(Completer):
        def __init__(self, cwd: str) -> None:
            self.cwd = cwd

        def get_completions(self, document, complete_event):
            for text, start, meta in completions_for(document.text_before_cursor, self.cwd):
                yield Completion(text, start_position=start, display_meta=meta)

    return Completions


def terminal_input(stdin: Any = None) -> Any:
    """prompt_toolkit's input for the plain front end, raw even while a line is printed above the
    prompt. prompt_toolkit prints there (patch_stdout, run_in_terminal) in cooked mode, for code
    that reads a line meanwhile; none of ours does, and keys typed during a print (the model
    streams a line at a time) were echoed by the terminal into the transcript and their Enter
    turned into Ctrl+J: a new line in the editor instead of a send. Raw, they wait in the
    terminal's queue, unechoed, for the prompt to read them as typed. The output side is the same
    either way (raw mode leaves the terminal's newline translation on)."""
    from prompt_toolkit.input import create_input

    inp = create_input(stdin)
    # the instance's cooked_mode is what run_in_terminal asks for
    setattr(inp, "cooked_mode", inp.raw_mode)  # noqa: B010 - an instance attribute over the method
    return inp


async def run_interactive(agent: Any, notifier: Notifier | None = None) -> int:  # pragma: no cover - exercised by the tmux test
    """The interactive plain front end. One long function on purpose: prompt_toolkit's key
    bindings, the toolbar and the pump loop are closures over the same session, renderer and
    draft, and they only make sense read together with the prompt loop that owns them."""
    from prompt_toolkit import PromptSession, print_formatted_text

    PlainCompleter = _completer_class()
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.formatted_text import FormattedText
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.patch_stdout import patch_stdout

    from ds4agent.ui.history import InputHistory

    # Whole lines only: under patch_stdout a partial line is overwritten when the prompt below is
    # redrawn, so streamed fragments wait here until their newline (close_stream always ends the
    # line at the end of a block or turn).
    pending: list[tuple[str, str]] = []

    def write(text: str, style: str) -> None:
        pt_style = PT_STYLES.get(style, "")
        while text:
            head, newline, text = text.partition("\n")
            if head:
                pending.append((pt_style, head))
            if not newline:
                break
            print_formatted_text(FormattedText(pending))
            pending.clear()

    r = PlainRenderer(write)
    fe = PlainFrontEnd(agent, r)
    fe.width = lambda: shutil.get_terminal_size().columns
    fe.notifier = notifier

    def ring(seq: str) -> None:
        # Past patch_stdout, straight to the terminal: the sequence prints nothing, and the
        # proxy would hold it until a newline.
        if sys.__stdout__ is not None:
            sys.__stdout__.write(seq)
            sys.__stdout__.flush()

    fe.ring = ring
    saved_history = InputHistory()
    pt_history = InMemoryHistory()
    for entry in saved_history.entries:
        pt_history.append_string(entry)

    kb = KeyBindings()
    def turn_busy() -> bool:  # an interrupt never cuts the model's start-up short
        return bool(agent.busy) and r.status.state != "loading"

    busy = Condition(turn_busy)
    last_ctrl_c = [0.0]

    @kb.add("c-j")
    def _(event) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("c-c")
    def _(event) -> None:
        buf = event.current_buffer
        if turn_busy():
            agent.interrupt()
            r.status.interrupting = True  # said at once in the status line
        elif buf.text:
            buf.reset()
        elif time.monotonic() - last_ctrl_c[0] <= commands.QUIT_WINDOW_S:
            event.app.exit(result=_QUIT)
        else:
            last_ctrl_c[0] = time.monotonic()
            r.line(commands.QUIT_HINT, "warning")

    @kb.add("c-d")
    def _(event) -> None:
        buf = event.current_buffer
        if buf.text:
            buf.delete()
        else:
            event.app.exit(result=_QUIT)

    @kb.add("c-x")
    def _(event) -> None:
        text = agent.pull_queued()
        if text:
            event.current_buffer.insert_text(text)

    @kb.add("escape", eager=True, filter=busy)
    def _(event) -> None:
        agent.interrupt()
        r.status.interrupting = True

    @kb.add("s-tab")
    def _(event) -> None:
        agent.toggle_plan()  # refused with a message while the model works (the busy rule)

    def toolbar():
        width = shutil.get_terminal_size().columns
        return FormattedText([("reverse", " " + fmt.status_line(r.status, width - 2) + " ")])

    # erase_when_done: the line typed at the prompt is wiped when it is sent; what stays in the
    # scrollback is the renderer's one echo of it ("› text" when it reaches the model).
    session: PromptSession = PromptSession(
        input=terminal_input(), history=pt_history, key_bindings=kb, bottom_toolbar=toolbar, refresh_interval=0.2,
        completer=PlainCompleter(os.getcwd()), complete_while_typing=False,
        multiline=False, enable_open_in_editor=False, erase_when_done=True,
    )
    ask_now = asyncio.Event()

    def copy(text: str) -> bool:
        if sys.__stdout__ is None:
            return False  # no terminal to ask
        data = base64.b64encode(text.encode()).decode()
        sys.__stdout__.write(f"\x1b]52;c;{data}\a")
        sys.__stdout__.flush()
        return True

    async def pump_loop() -> None:
        while True:
            fe.pump()
            if r.draft and session.app.is_running and not session.default_buffer.text:
                # A rewound turn's prompt goes back into the input, to be edited and re-sent.
                session.default_buffer.text = r.draft
                session.default_buffer.cursor_position = len(r.draft)
                r.draft = ""
            if r.questions or r.exited is not None:
                ask_now.set()
                if session.app.is_running and not session.app.is_done:
                    session.app.exit(result=_QUESTION)
            await asyncio.sleep(1 / bridge.DRAIN_HZ)

    agent.start()
    draft = ""
    warned = ""  # a message too big for the context, warned about once
    status = 0
    # The terminal stays raw between two prompts too: a key typed ahead while a command runs (an
    # Enter right after /new) is then read by the next prompt as typed, instead of the terminal
    # echoing it and turning Enter into Ctrl+J (a new line in the editor, not a send).
    with session.input.raw_mode(), patch_stdout(raw=True):
        pump = asyncio.create_task(pump_loop())
        try:
            while True:
                if r.exited is not None:
                    status = r.exited.status
                    break
                if r.questions:
                    q = r.questions.pop(0)
                    prompt, keys = question_prompt(q)
                    answer = ""
                    while answer not in keys:
                        try:
                            answer = (await session.prompt_async(prompt, default="")).strip().lower()[:1]
                        except (EOFError, KeyboardInterrupt):
                            answer = "c" if "c" in keys else "n"
                    agent.answer_permission(q.id, answer)  # type: ignore[attr-defined]
                    r.line(prompt + answer, "muted")  # the erased question, kept with its answer
                    if getattr(q, "kind", "") == "save" and answer == "c":
                        fe.quitting = False
                    continue
                ask_now.clear()
                result = await session.prompt_async("ds4agent> ", default=draft)
                draft = ""
                if result is _QUESTION:
                    draft = session.default_buffer.text
                    continue
                if result is _QUIT:
                    if r.status.state == "loading":
                        break  # nothing to save yet: leave while the model is still loading
                    if agent.busy:
                        r.line(commands.idle_required("/quit"), "error")
                        continue
                    fe.quitting = True
                    agent.quit()
                    await _wait_for(lambda: r.exited is not None or bool(r.questions))
                    continue
                text = str(result)
                if not text.strip():
                    continue
                saved_history.add(text)
                if commands.is_command(text):
                    if fe.switching and agent.busy:
                        # A command typed while /load or /new still runs waits for it (the prompt
                        # stays live meanwhile, so typing goes on); a question coming first (the
                        # save question) is answered first and the command stays in the editor.
                        await _wait_for(lambda: not agent.busy or bool(r.questions) or r.exited is not None)
                        if agent.busy:
                            draft = text
                            continue
                    fe.switching = False
                    r.line(f"› {text}", "muted")  # the prompt line is erased: commands echo here
                    if fe.run_command(text, copy=copy):
                        # An unknown command: not put back in the prompt, where the next command
                        # typed would be appended to it; the input history has it.
                        r.line("(Up brings it back to correct)", "muted")
                    if fe.quitting:  # the save question (or the exit) comes next: no prompt in between
                        await _wait_for(lambda: r.exited is not None or bool(r.questions), timeout=10.0)
                else:
                    warning = fmt.big_message_warning(text, r.status)
                    if warning and text != warned:
                        warned = text  # Enter again on the same text sends it
                        r.line(warning, "warning")
                        draft = text
                        continue
                    warned = ""
                    agent.submit(text)
        finally:
            pump.cancel()
            agent.shutdown(timeout=2.0)
    last = fmt.exit_line(r.status)
    if last:
        print(last)
    return status


async def _wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def main(run: AgentRun) -> int:
    """`ds4agent --plain` (or stdout not a terminal)."""
    from ds4agent.agent.facade import Agent

    agent = Agent.from_run(run)
    if run.settings.resume == "":
        # --resume without a prefix: plain mode's "picker" is the list and a /load to type.
        agent.list_sessions()
        agent.emit(ev.Notice("choose a session to resume: /load PREFIX"))
    if sys.stdin.isatty() and sys.stdout.isatty():
        from ds4agent.agent.notify_config import NotifyConfigError
        from ds4agent.ui.notify import for_run

        try:
            notifier = for_run(run, os.environ)
        except NotifyConfigError as err:
            print(f"ds4agent: {err}", file=sys.stderr)
            return 2
        return asyncio.run(run_interactive(agent, notifier))
    return run_lines(agent, sys.stdin, sys.stdout)
