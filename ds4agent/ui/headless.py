"""Headless mode: `ds4agent -p PROMPT` runs one task to completion without a UI.

* The answer streams to stdout; tool activity (calls, results, notices, errors) goes to stderr.
* `--json`: instead, every agent event is one JSON line on stdout (agent/events.py names and
  fields; `{"type": "TextDelta", "text": ...}`), flushed per event, for scripts.
* Permissions: `--permission auto` runs everything, `read-only` refuses bash and file changes.
  `ask` (the default) asks on the terminal when stdin and stderr are TTYs; without a terminal
  nothing could answer, so it falls back to read-only and says so on stderr (a script that
  wants changes must say `--permission auto` explicitly). `--help` says the same.
* The crash journal and the "resume?" offer are off (the prompt is on the command line), and
  nothing is saved, except a task that continues a session (--resume ID / --continue): that
  session gets the task's turns and is saved again at the end, which stderr says when it loads.
* Exit status: 0 when the model finished its answer; 1 on an error or an incomplete answer
  (token cap, a sampled stop token, an unterminated tool call); 130 when interrupted (Ctrl+C).
"""

from __future__ import annotations

import json
import queue
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ds4agent.agent import events as ev
from ds4agent.agent.permissions_glue import refused_as_read_only
from ds4agent.agent.settings import AgentRun
from ds4agent.ui import dispatch, toolview
from ds4agent.ui.fmt import terminal_safe

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_INTERRUPTED = 130


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _summary(name: str, args: dict) -> str:
    for key in ("command", "path", "query", "job"):
        if key in args:
            return f"{name} {_first_line(str(args[key]))}"
    return name


BASH_TOOLS = ("bash", "bash_status", "bash_stop")


def result_lines(e: ev.ToolResult) -> str:
    """A tool result on stderr: ✓/✗ and its first line; for a command, its exit status, and when
    it failed the last line of its output and the sandbox's reason (a refused write), so a
    failure says why without the --json stream."""
    failed = toolview.result_failed(e.name, e.ok, e.text, e.display)
    mark = "✗" if failed or not e.ok else "✓"
    if e.name not in BASH_TOOLS or e.display is None:
        return f"  {mark} {_first_line(e.text)}\n"
    lines = [f"  {mark} {toolview.result_status(e.name, e.ok, e.text, e.display, e.elapsed)}"]
    if failed:
        output = [ln for ln in str(toolview.field(e.display, "output", default="")).splitlines() if ln.strip()]
        if output:
            lines.append(f"    {_first_line(output[-1])}")
    lines += [f"    {_first_line(ln)}" for ln in e.text.splitlines() if ln.startswith("sandbox: ")]
    return "\n".join(lines) + "\n"


def terminal_asker(err: TextIO, inp: TextIO) -> Callable[[ev.PermissionRequest], tuple[str, str]]:
    """Ask a permission question on the terminal (stderr + stdin)."""

    def ask(req: ev.PermissionRequest) -> tuple[str, str]:
        err.write(f"\n{req.question}\n")
        if req.detail:
            err.write(req.detail.rstrip("\n") + "\n")
        keys = "/".join(k for k, _ in req.options)
        for k, label in req.options:
            err.write(f"  {k}: {label}\n")
        while True:
            err.write(f"[{keys}] ")
            err.flush()
            line = inp.readline()
            if not line:
                return "n", ""
            key = line.strip().lower()[:1]
            if key in {k for k, _ in req.options}:
                message = ""
                if key in ("n", "m"):  # m (a plan sent back with comments) is a deny with a message
                    key = "n"
                    err.write("message for the model (optional): ")
                    err.flush()
                    message = inp.readline().strip()
                return key, message

    return ask


class _Run:
    """One headless task: the event handlers of the two tables and the state they share.

    `control` handles what decides the run (start, questions, errors, the turn's end) in both
    modes, and returns an exit status when the run is over; `display` shows the answer and the
    tool activity, in text mode only (--json writes every event as it is instead)."""

    def __init__(self, agent: Any, prompt: str, *, out: TextIO, err: TextIO, json_mode: bool,
                 ask: Callable[[ev.PermissionRequest], tuple[str, str]] | None, save: bool) -> None:
        self.agent = agent
        self.prompt = prompt
        self.out = out
        self.out_is_terminal = bool(getattr(out, "isatty", lambda: False)())
        self.err = err
        self.json_mode = json_mode
        self.ask = ask
        self.save = save
        self.status = EXIT_FAIL
        self.submitted = False
        # A run that continues a session (--resume / --continue) until it is loaded: if the load
        # fails or is declined, the task stops instead of running (and saving) in a fresh session.
        self.resuming = save
        self.read_only_fallback = False  # run(): say why at the first refusal (once)
        self.at_line_start = True
        self.wrote = False
        # What the current round produced: a round that only thought before the token cap leaves
        # stdout empty, and the verdict must say where the budget went.
        self.round_text = self.round_thought = False
        self.control: dispatch.EventTable[int | None] = dispatch.EventTable({
            ev.Ready: self._ready, ev.PermissionRequest: self._permission, ev.Question: self._question,
            ev.Error: self._error, ev.Exited: self._exited, ev.TurnEnded: self._turn_ended,
            ev.RoundStarted: self._round_started, ev.ThinkingDelta: self._thinking,
            ev.SessionLoaded: self._loaded, ev.ToolResult: self._tool_result,
        })
        self.display: dispatch.EventTable[None] = dispatch.EventTable({} if json_mode else {
            ev.TextDelta: self._text,
            ev.ToolCallEnd: lambda e, n: self.to_err(f"⏺ {_summary(e.name, e.args)}\n"),
            ev.ToolResult: lambda e, n: self.to_err(result_lines(e)),
            ev.ToolCallInvalid: lambda e, n: self.to_err(
                f"  ✗ [{'invalid tool call: ' if e.kind == 'error' else ''}{e.reason}]\n"),
            ev.CompactionStarted: lambda e, n: self.to_err(f"[compacting context: {e.reason}]\n"),
            ev.SubagentStarted: lambda e, n: self.to_err(f"⎇ subagent: {_first_line(e.goal)}\n"),
            ev.SubagentEnded: lambda e, n: self.to_err(
                f"  ⎇ subagent {e.reason} ({e.rounds} rounds, {e.generated} tokens): {_first_line(e.summary)}\n"),
            ev.Notice: self._notice,
        })

    def to_err(self, text: str) -> None:
        # On a terminal both streams share the screen: end the answer's open line first, or the
        # line written here is glued onto it.
        if not self.json_mode and not self.at_line_start:
            self.out.write("\n")
            self.out.flush()
            self.at_line_start = True
        self.err.write(terminal_safe(text))
        self.err.flush()

    def handle(self, e: ev.Event) -> int | None:
        """Handle one event; the exit status once the run is over, else None."""
        if self.json_mode:
            self.out.write(json.dumps(ev.event_to_dict(e), ensure_ascii=False) + "\n")
            self.out.flush()
        status = self.control.dispatch(e)
        if status is None:
            self.display.dispatch(e)
        return status

    # ------------------------------------------------------------------ control
    def _ready(self, e: ev.Ready, n: int) -> int | None:
        name, _, args = self.prompt.strip().partition(" ")
        custom = getattr(self.agent, "custom_commands", None)
        if name.startswith("/") and custom is not None and name[1:] in {c.name for c in custom()[0]}:
            # `-p "/review src/x.py"`: a custom command's prompt, as typed in the app
            if not self.agent.run_command(name[1:], args):
                return EXIT_FAIL
            self.submitted = True
            return None
        if not self.agent.submit(self.prompt):
            self.to_err("ds4agent: the prompt is empty\n")
            return EXIT_FAIL
        self.submitted = True
        return None

    def _permission(self, e: ev.PermissionRequest, n: int) -> None:
        if e.tool == "plan" and self.ask is None:
            # The plan is the run's answer (already on stdout): nobody approves it here, and a
            # message would send it back for another round.
            self.agent.answer_permission(e.id, "n")
        elif self.ask is None:
            self.agent.answer_permission(e.id, "n", "no one can answer permission questions in this run")
        else:
            key, message = self.ask(e)
            self.agent.answer_permission(e.id, key, message)

    def _question(self, e: ev.Question, n: int) -> None:
        self.agent.answer_permission(e.id, "n")

    def _tool_result(self, e: ev.ToolResult, n: int) -> None:
        if self.read_only_fallback and refused_as_read_only(e):
            self.read_only_fallback = False
            self.to_err("ds4agent: no terminal to ask permission questions on: running read-only "
                        "(use --permission auto to allow commands and file changes)\n")

    def _loaded(self, e: ev.SessionLoaded, n: int) -> None:
        self.resuming = False
        if self.save:
            self.to_err(f"ds4agent: continuing session {e.short_id}: this task's turns are added to it, "
                        "and it is saved again when the task ends\n")

    def _error(self, e: ev.Error, n: int) -> int | None:
        self.to_err(f"ds4agent: {e.text}\n")
        if self.resuming:
            self.to_err("ds4agent: cannot continue: the session did not load; nothing was run\n")
            return EXIT_FAIL
        return EXIT_FAIL if e.fatal else None

    def _exited(self, e: ev.Exited, n: int) -> int:
        return self.status if self.submitted else EXIT_FAIL

    def _turn_ended(self, e: ev.TurnEnded, n: int) -> int:
        if e.reason == "done":
            self.status = EXIT_OK
        elif e.reason == "interrupted":
            self.status = EXIT_INTERRUPTED
        else:
            self.status = EXIT_FAIL
            if not self.json_mode:
                why = ""
                if e.reason == "token_cap" and self.round_thought and not self.round_text:
                    why = (": thinking used the round's whole token budget before any answer "
                           "(raise --tokens, or use --nothink)")
                self.to_err(f"ds4agent: the answer is incomplete ({e.reason.replace('_', ' ')}){why}\n")
        if not self.json_mode and not self.at_line_start:
            self.out.write("\n")
            self.out.flush()
        if self.save and not _save(self.agent, self.err):
            self.status = EXIT_FAIL
        return self.status

    def _round_started(self, e: ev.RoundStarted, n: int) -> None:
        self.round_text = self.round_thought = False

    def _thinking(self, e: ev.ThinkingDelta, n: int) -> None:
        self.round_thought = True

    # ------------------------------------------------------------------ display (text mode)
    def _text(self, e: ev.TextDelta, n: int) -> None:
        text = e.text if self.wrote else e.text.lstrip()  # no blank lines before the answer
        if text:
            self.wrote = self.round_text = True
            # On a terminal the answer is shown, not acted on; piped, it stays as the model wrote it.
            self.out.write(terminal_safe(text) if self.out_is_terminal else text)
            self.out.flush()
            self.at_line_start = text.endswith("\n")

    def _notice(self, e: ev.Notice, n: int) -> None:
        if e.level == "warning":
            self.to_err(f"ds4agent: {e.text}\n")


def run(agent: Any, prompt: str, *, out: TextIO, err: TextIO, json_mode: bool = False,
        ask: Callable[[ev.PermissionRequest], tuple[str, str]] | None = None,
        timeout: float | None = None, save: bool = False, read_only_fallback: bool = False) -> int:
    """Start `agent`, run `prompt` as one task, stream events, return the exit status.
    save: save the session when the turn ends (a task continued with --continue / --resume, so
    the next --continue goes on from here); read_only_fallback: the run is read-only because no
    terminal could answer questions, which is said once a tool call is refused for it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    task = _Run(agent, prompt, out=out, err=err, json_mode=json_mode, ask=ask, save=save)
    task.read_only_fallback = read_only_fallback
    agent.start()
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                task.to_err("ds4agent: timed out\n")
                return EXIT_FAIL
            try:
                e = agent.events.get(timeout=0.1)
            except queue.Empty:
                if not agent.running:
                    return task.status
                continue
            status = task.handle(e)
            if status is not None:
                return status
    except KeyboardInterrupt:
        agent.interrupt()
        return EXIT_INTERRUPTED
    finally:
        agent.shutdown()
        err.flush()


def _save(agent: Any, err: TextIO, timeout: float = 600.0) -> bool:
    """Save the session now and wait for the outcome (a line on stderr either way)."""
    agent.save()
    while True:
        try:
            e = agent.events.get(timeout=timeout)
        except queue.Empty:
            err.write("ds4agent: save failed: timed out\n")
            return False
        if isinstance(e, ev.SessionSaved):
            err.write(f"ds4agent: saved session {e.short_id} ({e.tokens} tokens), now with this task's turns\n")
            return True
        if isinstance(e, ev.Error):
            err.write(f"ds4agent: {e.text}\n")
            return False


def main(agent_run: AgentRun) -> int:
    """Entry point from ds4agent/cli.py (agent_run.model_path is resolved; agent_run.prompt is the task)."""
    from ds4agent.agent.facade import Agent
    from ds4agent.agent.wiring import build_from_run

    err = sys.stderr
    prompt = agent_run.prompt
    if prompt is None:
        raise ValueError("headless needs the run's prompt (-p)")
    try:
        loader, store, tools, settings, mcp = build_from_run(agent_run)
    except Exception as exc:  # e.g. the KV directory cannot be created
        err.write(f"ds4agent: {exc}\n")
        return EXIT_FAIL
    settings.journal = False
    if settings.resume == "":
        err.write("ds4agent: --resume needs a session id prefix with -p (there is no picker)\n")
        return EXIT_FAIL
    try:
        # Checked before the model loads: a task that cannot continue must not start afresh.
        from ds4agent.agent.sessionops import requested_session

        target = requested_session(store, settings)
        if target is not None and store is not None:
            settings.resume, settings.continue_session = store.resolve(target).id, False
    except Exception as exc:  # SessionOpError, KVCStoreError: readable
        err.write(f"ds4agent: cannot continue: {exc}\n")
        return EXIT_FAIL
    ask = None
    read_only_fallback = False
    if settings.permission == "ask":
        if sys.stdin.isatty() and sys.stderr.isatty():
            ask = terminal_asker(err, sys.stdin)
        else:
            settings.permission = "read-only"
            read_only_fallback = True
    agent = Agent(loader, store, tools, settings, mcp=mcp)
    return run(agent, prompt, out=sys.stdout, err=err, json_mode=agent_run.json_events,
               ask=ask, save=bool(settings.resume), read_only_fallback=read_only_fallback)
