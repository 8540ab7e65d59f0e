"""What hooks mean to the loop (the files and the runner: tools/hooks.py).

    start(worker) -> AgentHooks                     at startup: read both files, ask about an
                                                    unapproved project file (remembered by its hash)
    worker.hooks.prompt_submitted(worker, text)     UserPromptSubmit: the text to send, or None
    worker.hooks.before_tool(worker, name, args)    PreToolUse: the refusal the model reads, or None
    worker.hooks.after_tool(worker, name, args, result)   PostToolUse: the result, with feedback
    worker.hooks.stopped(worker, reason)            Stop: may send the model back to work

Exit 2 blocks, and what it blocks is the event's (as in Claude Code):
* UserPromptSubmit: the message is not sent; the hook's stderr tells the user why. Exit 0: its
  stdout, if any, follows the message as context for the model.
* PreToolUse: the call does not run (no permission question either); the model reads
  `Tool call blocked by a hook: REASON` as its result.
* PostToolUse: the call has run; REASON follows its result, for the model to act on.
* Stop (the turn ended, not by an interrupt): REASON goes to the model as the next message, so it
  continues (a test hook that fails sends it back to fix the tests). At most MAX_CONTINUATIONS in
  a row, and the hook's input says `stop_hook_active` when the turn was one of those.
Any other status, a timeout or a hook that cannot start blocks nothing: a warning says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ds4agent.agent import events as ev
from ds4agent.agent.approval import approve_by_content
from ds4agent.agent.port import WorkerPort
from ds4agent.tools import Observation
from ds4agent.tools.hooks import HookConfig, HookFile, HookRun, load_hooks, run_hook
from ds4agent.tools.mcp import Approvals
from ds4agent.tools.mcp.config import project_root

APPROVALS_FILE = "hooks-approvals.json"
# A Stop hook may send the model back to work this many times in a row, then the turn ends.
MAX_CONTINUATIONS = 3
BLOCKED_PREFIX = "Tool call blocked by a hook: "
STOP_LEAD = "A Stop hook sent you back to work:"


class AgentHooks:
    """The hooks in force and the Stop hook's state (how many continuations in a row)."""

    def __init__(self, config: HookConfig | None = None, root: Path | None = None) -> None:
        self.config = config if config is not None else HookConfig()
        self.root = root if root is not None else Path.cwd()  # where hooks run: the tree's root
        self.continuations = 0
        self._feedback: str | None = None  # the message the last Stop hook queued

    def _run(self, worker: WorkerPort, event: str, payload: dict[str, Any], tool: str = "") -> list[HookRun]:
        """Every matching hook, in order (user's, then project's), until one blocks."""
        runs: list[HookRun] = []
        hooks = self.config.matching(event, tool)
        if not hooks:
            return runs
        base = {"hook_event_name": event, "cwd": str(worker.settings.cwd),
                "session_id": worker.conv.identity.session_id, "permission_mode": worker.settings.permission}
        for hook in hooks:
            worker.trace.line(f"hook {event} {hook.command!r}")
            run = run_hook(hook, {**base, **payload}, self.root, sockets=worker.tool_ctx.sockets,
                           should_stop=worker.io.should_stop)
            runs.append(run)
            if run.status not in (0, 2):
                why = run.error or f"exit status {run.status}"
                detail = f": {run.reason.splitlines()[0]}" if run.reason else ""
                worker.io.emit(ev.Notice(f"{event} hook `{hook.command}` failed ({why}){detail}", "warning"))
            if run.blocked:
                break
        return runs

    def prompt_submitted(self, worker: WorkerPort, text: str) -> str | None:
        if self._feedback is not None and text == self._feedback:
            self._feedback = None  # the Stop hook's own message: no UserPromptSubmit for it
            return text
        self.continuations = 0
        self._feedback = None
        runs = self._run(worker, "UserPromptSubmit", {"prompt": text})
        if runs and runs[-1].blocked:
            why = runs[-1].reason or "no reason given"
            worker.io.emit(ev.Error(f"message blocked by a UserPromptSubmit hook: {why}"))
            worker.io.emit(ev.TurnEnded(ev.TurnEnd.BLOCKED, error=why))
            return None
        context = "\n\n".join(r.stdout.strip() for r in runs if r.status == 0 and r.stdout.strip())
        return f"{text}\n\n{context}" if context else text

    def before_tool(self, worker: WorkerPort, name: str, args: Mapping[str, object]) -> str | None:
        runs = self._run(worker, "PreToolUse", {"tool_name": name, "tool_input": dict(args)}, name)
        if not runs or not runs[-1].blocked:
            return None
        why = runs[-1].reason or "no reason given"
        worker.io.emit(ev.Notice(f"PreToolUse hook blocked {name}: {why}", "warning"))
        return BLOCKED_PREFIX + why

    def after_tool(self, worker: WorkerPort, name: str, args: Mapping[str, object], result: Observation) -> Observation:
        runs = self._run(worker, "PostToolUse", {"tool_name": name, "tool_input": dict(args),
                                                 "tool_response": {"ok": bool(result.ok), "text": result.text}}, name)
        if not runs or not runs[-1].blocked or not runs[-1].reason:
            return result
        sep = "" if result.text.endswith("\n") else "\n"
        return replace(result, text=f"{result.text}{sep}[PostToolUse hook: {runs[-1].reason}]\n")

    def stopped(self, worker: WorkerPort, reason: str) -> None:
        if reason in ("interrupted", "blocked") or worker.io.stopping():
            return
        active = self.continuations > 0
        runs = self._run(worker, "Stop", {"reason": reason, "stop_hook_active": active})
        if not runs or not runs[-1].blocked:
            self.continuations = 0
            return
        if self.continuations >= MAX_CONTINUATIONS:
            worker.io.emit(ev.Notice(f"Stop hook asked to continue {MAX_CONTINUATIONS + 1} times in a row; "
                                     "the turn ends here", "warning"))
            self.continuations = 0
            return
        self.continuations += 1
        self._feedback = f"{STOP_LEAD}\n{runs[-1].reason or 'continue the task'}"
        worker.io.emit(ev.Notice("a Stop hook sent the model back to work"))
        worker.io.submit(self._feedback)


def start(worker: WorkerPort) -> AgentHooks:
    """The hooks in force: the user's and the project's (that one only once approved)."""
    s = worker.settings
    config = load_hooks(s.cwd, s.user_config_dir())
    for problem in config.errors:
        worker.io.emit(ev.Notice(f"hooks: {problem}", "warning"))
    project = config.project
    if project is not None and project.hooks:
        config = replace(config, use_project=_approve(worker, s.user_config_dir(), project))
    n = len(config.hooks())
    if n:
        worker.io.emit(ev.Notice(f"hooks: {n} in force"))
    return AgentHooks(config, project_root(s.cwd))


def _approve(worker: WorkerPort, config_dir: Path, project: HookFile) -> bool:
    """The user's answer for this exact file (asked once, remembered by its SHA-256)."""
    listed = "; ".join(f"{h.event}: {h.command}" for h in project.hooks)
    return approve_by_content(
        worker, Approvals(config_dir, APPROVALS_FILE), project,
        kind="hooks", label="hook",
        question=f"This project's {project.path} runs commands as hooks ({listed}). Use them?",
        declined=f"the hooks of {project.path} are not used")
