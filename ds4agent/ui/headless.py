"""Headless mode: `ds4agent -p PROMPT` runs one task to completion without a UI.

* The answer streams to stdout; tool activity (calls, results, notices, errors) goes to stderr.
* `--json`: instead, every agent event is one JSON line on stdout (agent/events.py names and
  fields; `{"type": "TextDelta", "text": ...}`), flushed per event, for scripts.
* Permissions: `--permission auto` runs everything, `read-only` refuses bash and file changes.
  `ask` (the default) asks on the terminal when stdin and stderr are TTYs; without a terminal
  nothing could answer, so it falls back to read-only and says so on stderr (a script that
  wants changes must say `--permission auto` explicitly).
* The crash journal and the "resume?" offer are off (the prompt is on the command line), and
  nothing is saved.
* Exit status: 0 when the model finished its answer; 1 on an error or an incomplete answer
  (token cap, a sampled stop token, an unterminated tool call); 130 when interrupted (Ctrl+C).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ds4agent.agent import events as ev

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
                if key == "n":
                    err.write("message for the model (optional): ")
                    err.flush()
                    message = inp.readline().strip()
                return key, message

    return ask


def run(agent: Any, prompt: str, *, out: TextIO, err: TextIO, json_mode: bool = False,
        ask: Callable[[ev.PermissionRequest], tuple[str, str]] | None = None,
        timeout: float | None = None, save: bool = False) -> int:
    """Start `agent`, run `prompt` as one task, stream events, return the exit status.
    save: save the session when the turn ends (a task continued with --continue / --resume, so
    the next --continue goes on from here)."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    status = EXIT_FAIL
    submitted = False
    at_line_start = True
    wrote = False
    # What the current round produced: a round that only thought before the token cap leaves
    # stdout empty, and the verdict must say where the budget went.
    round_text = round_thought = False
    agent.start()

    def to_err(text: str) -> None:
        # On a terminal both streams share the screen: end the answer's open line first, or the
        # line written here is glued onto it.
        nonlocal at_line_start
        if not json_mode and not at_line_start:
            out.write("\n")
            out.flush()
            at_line_start = True
        err.write(text)
        err.flush()

    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                to_err("ds4agent: timed out\n")
                return EXIT_FAIL
            try:
                e = agent.events.get(timeout=0.1)
            except Exception:  # queue.Empty
                if not agent.running:
                    return status
                continue
            if json_mode:
                out.write(json.dumps(ev.event_to_dict(e), ensure_ascii=False) + "\n")
                out.flush()
            if isinstance(e, ev.Ready):
                if not agent.submit(prompt):
                    to_err("ds4agent: the prompt is empty\n")
                    return EXIT_FAIL
                submitted = True
            elif isinstance(e, ev.PermissionRequest):
                if ask is None:
                    agent.answer_permission(e.id, "n", "no one can answer permission questions in this run")
                else:
                    key, message = ask(e)
                    agent.answer_permission(e.id, key, message)
            elif isinstance(e, ev.Question):
                agent.answer_permission(e.id, "n")
            elif isinstance(e, ev.Error):
                to_err(f"ds4agent: {e.text}\n")
                if e.fatal:
                    return EXIT_FAIL
            elif isinstance(e, ev.Exited):
                return status if submitted else EXIT_FAIL
            elif isinstance(e, ev.TurnEnded):
                if e.reason == "done":
                    status = EXIT_OK
                elif e.reason == "interrupted":
                    status = EXIT_INTERRUPTED
                else:
                    status = EXIT_FAIL
                    if not json_mode:
                        why = ""
                        if e.reason == "token_cap" and round_thought and not round_text:
                            why = (": thinking used the round's whole token budget before any answer "
                                   "(raise --tokens, or use --nothink)")
                        to_err(f"ds4agent: the answer is incomplete ({e.reason.replace('_', ' ')}){why}\n")
                if not json_mode and not at_line_start:
                    out.write("\n")
                    out.flush()
                if save and not _save(agent, err):
                    status = EXIT_FAIL
                return status
            elif isinstance(e, ev.RoundStarted):
                round_text = round_thought = False
            elif isinstance(e, ev.ThinkingDelta):
                round_thought = True
            if json_mode:
                continue
            if isinstance(e, ev.TextDelta):
                text = e.text if wrote else e.text.lstrip()  # no blank lines before the answer
                if text:
                    wrote = round_text = True
                    out.write(text)
                    out.flush()
                    at_line_start = text.endswith("\n")
            elif isinstance(e, ev.ToolCallEnd):
                to_err(f"⏺ {_summary(e.name, e.args)}\n")
            elif isinstance(e, ev.ToolResult):
                mark = "✓" if e.ok else "✗"
                to_err(f"  {mark} {_first_line(e.text)}\n")
            elif isinstance(e, ev.ToolCallInvalid):
                to_err(f"  ✗ [{'invalid tool call: ' if e.kind == 'error' else ''}{e.reason}]\n")
            elif isinstance(e, ev.CompactionStarted):
                to_err(f"[compacting context: {e.reason}]\n")
            elif isinstance(e, ev.Notice) and e.level == "warning":
                to_err(f"ds4agent: {e.text}\n")
    except KeyboardInterrupt:
        agent.interrupt()
        return EXIT_INTERRUPTED
    finally:
        agent.shutdown()
        err.flush()


def _save(agent: Any, err: TextIO, timeout: float = 600.0) -> bool:
    """Save the session now and wait for the outcome (a line on stderr either way)."""
    import queue

    agent.save()
    while True:
        try:
            e = agent.events.get(timeout=timeout)
        except queue.Empty:
            err.write("ds4agent: save failed: timed out\n")
            return False
        if isinstance(e, ev.SessionSaved):
            err.write(f"ds4agent: saved session {e.short_id} ({e.tokens} tokens)\n")
            return True
        if isinstance(e, ev.Error):
            err.write(f"ds4agent: {e.text}\n")
            return False


def main(args: Any) -> int:
    """Entry point from ds4agent/cli.py (args.model_path is resolved; flags as cli.py defines)."""
    from ds4agent.agent.facade import Agent
    from ds4agent.agent.wiring import build_from_args

    err = sys.stderr
    try:
        loader, store, tools, settings = build_from_args(args)
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
    if settings.permission == "ask":
        if sys.stdin.isatty() and sys.stderr.isatty():
            ask = terminal_asker(err, sys.stdin)
        else:
            err.write("ds4agent: no terminal to ask permission questions on: running read-only "
                      "(use --permission auto to allow commands and file changes)\n")
            settings.permission = "read-only"
    agent = Agent(loader, store, tools, settings)
    return run(agent, args.prompt, out=sys.stdout, err=err, json_mode=bool(getattr(args, "json_events", False)),
               ask=ask, save=bool(settings.resume))
