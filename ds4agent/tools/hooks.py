"""Hooks: the user's and the project's commands run at points of the agent's loop.

    load_hooks(cwd, config_dir) -> HookConfig      both files, read (errors as readable lines)
    HookConfig.matching(event, tool="") -> list[Hook]
    run_hook(hook, payload, root, sockets=(), should_stop=None) -> HookRun

Two files, the same format: `hooks.json` in ds4agent's user config directory (the user's hooks)
and `.ds4agent/hooks.json` at the working tree's root (the project's). The format is Claude Code's
`hooks` map, so a hook written for it reads the same JSON here:

    {"hooks": {"PreToolUse": [{"matcher": "bash|write",
                               "hooks": [{"type": "command", "command": "./check.sh", "timeout": 30}]}],
               "PostToolUse": [...], "UserPromptSubmit": [...], "Stop": [...]}}

(an entry may also name `command` and `timeout` directly, without the inner `hooks` list). The
matcher is a regular expression that must match the whole tool name (`*`, "" or none: every
tool); it applies to the tool events only.

A hook is a shell command (`/bin/sh -c`), run in the working tree's root inside the same OS
boundary as a bash job (tools/sandbox.py: it writes only beneath the tree and its own temp
directory), with the event as one JSON object on stdin. Its exit status decides: 0 goes on, 2
blocks (what it means per event is the agent's: agent/hooks.py), anything else is a failure that
blocks nothing; it is stopped after its timeout (default 60 s) or when the user interrupts. The
project's file is a program that came with a checkout: the agent uses it only once the user
approved that exact content (as for `.mcp.json`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ds4agent.tools.mcp.config import ApprovableFile, project_root
from ds4agent.tools.sandbox import Boundary, availability, wrap
from ds4agent.tools.sandbox_settings import job_environment

HOOKS_FILE = "hooks.json"
PROJECT_DIR = ".ds4agent"
EVENTS = ("PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop")
TOOL_EVENTS = ("PreToolUse", "PostToolUse")
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
BLOCK = 2  # the exit status that blocks (Claude Code's convention)
# What is kept of a hook's stdout and stderr (a reason is a line or two; the rest is cut).
MAX_OUTPUT = 16 * 1024
MAX_CONFIG_BYTES = 1 << 20
_POLL = 0.05


class HookConfigError(Exception):
    """A hooks file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Hook:
    event: str
    command: str
    matcher: str = ""  # a regular expression for the tool name ("" = every tool)
    timeout: float = DEFAULT_TIMEOUT
    source: str = "user"  # "user" | "project"

    def matches(self, tool: str) -> bool:
        if self.matcher in ("", "*"):
            return True
        try:
            return re.fullmatch(self.matcher, tool) is not None
        except re.error:
            return False  # refused when read (load_hooks); never matches


@dataclass(frozen=True)
class HookFile(ApprovableFile):
    """One hooks file and its hooks."""

    hooks: tuple[Hook, ...]


@dataclass(frozen=True)
class HookConfig:
    user: HookFile | None = None
    project: HookFile | None = None
    errors: tuple[str, ...] = ()
    use_project: bool = False  # the project's file was approved (the agent sets it)

    def hooks(self) -> tuple[Hook, ...]:
        user = self.user.hooks if self.user is not None else ()
        project = self.project.hooks if self.project is not None and self.use_project else ()
        return user + project

    def matching(self, event: str, tool: str = "") -> list[Hook]:
        return [h for h in self.hooks() if h.event == event and (event not in TOOL_EVENTS or h.matches(tool))]


@dataclass(frozen=True)
class HookRun:
    """How one hook ended. status: its exit status (None when it did not finish: timeout,
    interrupt, could not start; `error` says which)."""

    hook: Hook
    status: int | None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    seconds: float = 0.0

    @property
    def blocked(self) -> bool:
        return self.status == BLOCK

    @property
    def reason(self) -> str:
        """What the hook said (stderr, else stdout), for the model or the user."""
        return (self.stderr.strip() or self.stdout.strip())[:MAX_OUTPUT]


def _entries(doc: Any, where: str, source: str, errors: list[str]) -> list[Hook]:
    table = doc.get("hooks") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        errors.append(f"{where}: no \"hooks\" object")
        return []
    out: list[Hook] = []
    for event, entries in table.items():
        if event not in EVENTS:
            errors.append(f"{where}: unknown hook event {event!r} (known: {', '.join(EVENTS)})")
            continue
        if not isinstance(entries, list):
            errors.append(f"{where}: {event} must be a list")
            continue
        for entry in entries:
            if not isinstance(entry, dict):
                errors.append(f"{where}: an entry of {event} is not an object")
                continue
            matcher = entry.get("matcher", "")
            if not isinstance(matcher, str):
                errors.append(f"{where}: {event}: matcher must be text")
                continue
            try:
                re.compile(matcher if matcher not in ("", "*") else "")
            except re.error as err:
                errors.append(f"{where}: {event}: bad matcher {matcher!r}: {err}")
                continue
            inner = entry.get("hooks", [entry] if "command" in entry else None)
            if not isinstance(inner, list):
                errors.append(f"{where}: {event}: an entry needs \"hooks\" or \"command\"")
                continue
            for item in inner:
                hook = _hook(item, event, matcher, source)
                if isinstance(hook, str):
                    errors.append(f"{where}: {event}: {hook}")
                else:
                    out.append(hook)
    return out


def _hook(item: Any, event: str, matcher: str, source: str) -> Hook | str:
    """A Hook, or why the entry is not one."""
    if not isinstance(item, dict):
        return "a hook is not an object"
    if item.get("type", "command") != "command":
        return f"hook type {item.get('type')!r} is not supported (only \"command\")"
    command = item.get("command")
    if not isinstance(command, str) or not command.strip():
        return "a hook needs a non-empty \"command\""
    timeout = item.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT:
        return f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}] (got {timeout!r})"
    return Hook(event, command, matcher, float(timeout), source)


def read_hook_file(path: Path, root: Path, source: str, errors: list[str]) -> HookFile | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        errors.append(f"{path}: cannot read: {err.strerror or err}")
        return None
    if len(data) > MAX_CONFIG_BYTES:
        errors.append(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        errors.append(f"{path}: not valid JSON: {err}")
        return None
    hooks = _entries(doc, str(path), source, errors)
    return HookFile(path, root, hashlib.sha256(data).hexdigest(), tuple(hooks))


def load_hooks(cwd: Path, config_dir: Path) -> HookConfig:
    errors: list[str] = []
    root = project_root(cwd)
    user = read_hook_file(config_dir / HOOKS_FILE, root, "user", errors)
    project = read_hook_file(root / PROJECT_DIR / HOOKS_FILE, root, "project", errors)
    return HookConfig(user, project, tuple(errors))


@dataclass
class _Output:
    data: bytearray = field(default_factory=bytearray)

    def text(self) -> str:
        return bytes(self.data[:MAX_OUTPUT]).decode("utf-8", "replace")


def run_hook(hook: Hook, payload: Mapping[str, Any], root: Path, *, sockets: tuple[str, ...] = (),
             should_stop: Callable[[], bool] | None = None) -> HookRun:
    """Run one hook inside the job boundary around `root`, the payload as JSON on its stdin."""
    t0 = time.monotonic()
    temp = tempfile.mkdtemp(prefix="ds4agent-hook-")
    argv = ["/bin/sh", "-c", hook.command]
    if availability().available:
        argv = wrap(argv, Boundary(os.path.realpath(root), temp, False, sockets))
    env = {**job_environment(os.environ, sockets), "TMPDIR": temp, "DS4AGENT_HOOK_EVENT": hook.event}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=str(root), env=env, start_new_session=True, close_fds=True)
    except OSError as err:
        shutil.rmtree(temp, ignore_errors=True)
        return HookRun(hook, None, error=f"could not start: {err.strerror or err}")
    try:
        return _wait(hook, proc, json.dumps(payload, ensure_ascii=False).encode("utf-8"), should_stop, t0)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _wait(hook: Hook, proc: subprocess.Popen[bytes], data: bytes, should_stop: Callable[[], bool] | None,
          t0: float) -> HookRun:
    """Feed stdin, collect both outputs (threads: a hook that writes much must not block on a full
    pipe), stop the hook's whole process group at its timeout or an interrupt."""
    import threading

    outs = (_Output(), _Output())

    def pump(stream: Any, out: _Output) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            if len(out.data) < MAX_OUTPUT:
                out.data += chunk

    def feed() -> None:
        try:
            proc.stdin.write(data)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass  # the hook does not read its input: that is its choice

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=pump, args=(proc.stdout, outs[0]), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, outs[1]), daemon=True)]
    for t in threads:
        t.start()
    error = ""
    while proc.poll() is None:
        if time.monotonic() - t0 > hook.timeout:
            error = f"timed out after {hook.timeout:g} s"
        elif should_stop is not None and should_stop():
            error = "interrupted"
        if error:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            break
        time.sleep(_POLL)
    for t in threads[1:]:
        t.join(1.0)
    status = None if error else proc.returncode
    return HookRun(hook, status, outs[0].text(), outs[1].text(), error, round(time.monotonic() - t0, 3))
