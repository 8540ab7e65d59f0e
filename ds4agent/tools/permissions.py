"""Who may do what: the permission policy the agent consults before every tool call.

Pure policy: it never prompts and never runs a tool. The agent calls

    decision = policy.check(tool_name, args, ctx)
    allow -> run the tool
    deny  -> give the model decision.result()            ("Tool error: ...")
    ask   -> send decision.question to the UI as an event, wait for an Answer, then
             policy.remember(question, answer); once/session -> run the tool,
             deny -> give the model denied_result(answer)

Modes (the command line's --permission):
* ask (default): bash, write and edit ask; the user answers allow once / allow for this session /
  deny (with an optional message for the model). A session answer covers the tool (write, edit) or,
  for bash, the programs the command runs ("allow `pytest …` commands"). Writes outside the working
  directory or into a `.git/` directory (hooks and config run code) always ask, even when the tool or
  the program was allowed for the session, and offer no session scope: for bash that means a
  command whose redirections, tee/cp/mv/rm/install/dd of=/find -delete/... targets or git settings
  go there (tools/shellscan.py reads them; a command it cannot read is never covered either).
* auto: no questions (the reference agent's behaviour); bash jobs still run inside the OS sandbox,
  and what it refuses stays refused (nobody is asked).
* read-only: write, edit and bash are refused with a tool error the model can act on.
* plan: the same refusals, worded for planning (agent/plan.py): the model investigates and
  answers with a plan the user approves before anything changes.

Reading tools (read, more, search, list, bash_status, bash_stop) never ask: stopping a job the
model started or looking at files changes nothing.

Tools from MCP servers (check(..., hints=ToolHints(...))): a tool that declares itself read-only
(readOnlyHint) is treated like a reading tool in every mode. Any other one asks in ask mode (allow
once / allow that tool for this session / deny, the arguments shown), is refused in read-only mode,
and runs without a question in auto mode unless it declares itself destructive (destructiveHint).
The hints are the server's word, not a guarantee; the user chose to configure the server.

The OS sandbox (tools/sandbox.py) bounds what every bash job can do, whatever the answers: the
questions decide what to ask, the sandbox what can happen. When it refused something, escalation()
gives the one question for that command: run it again outside the sandbox (once), or, when only
git metadata was refused, let git write `.git/` (hooks included) once or for the session. Where
there is no sandbox, every bash command asks and no session answer covers a program. A command
over 64 KiB is asked about without being read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ds4agent.tools.args import arg_str
from ds4agent.tools.context import ToolContext
from ds4agent.tools.files import approve, plan_change
from ds4agent.tools.results import DiffDisplay, Observation, TextDisplay, ToolError, error_text
from ds4agent.tools.sandbox import Refusal, availability
from ds4agent.tools.shellscan import command_programs, scan

__all__ = ["Answer", "Choice", "Decision", "PermissionPolicy", "PermissionQuestion", "ToolHints", "command_programs",
           "denied_result"]

MODES = ("ask", "auto", "read-only", "plan")
READ_ONLY_REFUSAL = "is not allowed in read-only mode"  # in every read-only refusal (headless reads it)
PLAN_REFUSAL = "is not allowed in plan mode"
_PLAN_NEXT = "investigate with read, search and list, then answer with your plan for the user to approve"
FILE_TOOLS = frozenset({"write", "edit"})
ASKING_TOOLS = FILE_TOOLS | {"bash"}
MAX_SCANNED_COMMAND = 64 * 1024  # longer commands are asked about as they are, never read


def git_metadata_question(git_dirs: tuple[str, ...] = ()) -> str:
    """The question that lets git write its metadata: it names the directories the grant opens
    (found when the session's first job started, never from what a job wrote since)."""
    where = ", ".join(git_dirs) if git_dirs else ".git/"
    return (f"Allow git to write its metadata ({where})? That also lets commands write git hooks and "
            "settings, which run code on later git commands.")

@dataclass(frozen=True)
class ToolHints:
    """What a tool from an MCP server declares about itself (hints, as the MCP spec calls them)."""

    read_only: bool = False
    destructive: bool = False


class Choice(StrEnum):
    ONCE = "once"
    SESSION = "session"
    DENY = "deny"


@dataclass(frozen=True)
class Answer:
    choice: Choice
    message: str = ""  # deny only: passed on to the model

    @classmethod
    def once(cls) -> Answer:
        return cls(Choice.ONCE)

    @classmethod
    def session(cls) -> Answer:
        return cls(Choice.SESSION)

    @classmethod
    def deny(cls, message: str = "") -> Answer:
        return cls(Choice.DENY, message)

    @property
    def allowed(self) -> bool:
        return self.choice is not Choice.DENY


@dataclass(frozen=True)
class PermissionQuestion:
    """What the UI shows: a title, the command or diff, and the session choice's label (None: no
    session choice is offered, only allow once / deny)."""

    tool: str
    title: str
    preview: str
    preview_kind: Literal["command", "diff", "arguments"]
    session_label: str | None
    scope: tuple[str, ...] = ()
    outside_workspace: bool = False
    path: str | None = None  # absolute target of a write/edit
    diff: DiffDisplay | None = None
    # What allowing a bash command lifts from the sandbox for that one run: "outside" (no sandbox),
    # "git" (git metadata writable), "" nothing. Set when the question was about those very writes,
    # so that the sandbox does not refuse them and ask a second time.
    grant: Literal["", "outside", "git"] = ""


@dataclass(frozen=True)
class Decision:
    kind: Literal["allow", "deny", "ask"]
    reason: str = ""
    question: PermissionQuestion | None = None

    @property
    def allowed(self) -> bool:
        return self.kind == "allow"

    def result(self) -> Observation:
        """The tool result for a denied call."""
        return _refusal(self.reason)


ALLOW = Decision("allow")


def denied_result(answer: Answer) -> Observation:
    """What the model reads when the user said no (with the user's message, if any)."""
    msg = "permission denied by the user"
    if answer.message.strip():
        msg += f"; the user says: {answer.message.strip()}"
    return _refusal(msg)


def _refusal(reason: str) -> Observation:
    """A refused call: the error text for the model, the reason alone for a UI (no body: nothing ran)."""
    return Observation(error_text(reason), ok=False, display=TextDisplay(summary=reason, body=""))


def _program_label(programs: tuple[str, ...]) -> str:
    names = [f"`{p} …`" for p in programs]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"allow {joined} commands for this session"


# Programs that run whatever code they are given (a script, -c, -e, stdin): "allow `python3 …` for
# this session" would allow everything, so their commands are never covered by a session answer.
INTERPRETERS = re.compile(r"(python|pypy|ruby|perl|php|lua|node|nodejs|deno|bun|bash|sh|zsh|dash|ksh|mksh|fish|"
                          r"tclsh|wish|pwsh|osascript|rscript|julia|env|xargs|sudo|doas|nohup|timeout|"
                          r"nice|exec|eval|uv|uvx|npx|pipx|poetry)[0-9.]*", re.IGNORECASE)


def is_interpreter(program: str) -> bool:
    """Whether a session answer for `program` would let any code run (see INTERPRETERS)."""
    return INTERPRETERS.fullmatch(os.path.basename(program)) is not None


def _risky_question(command: str, risky: tuple[str, ...]) -> PermissionQuestion:
    """A command whose scan found writes outside the tree or into .git/. The answer is the one
    question for it: allowing runs it without the sandbox part that would refuse those writes
    (scope "outside": no sandbox at all; "git": git metadata writable), once."""
    shown = "; ".join(risky[:3]) + (f"; and {len(risky) - 3} more" if len(risky) > 3 else "")
    outside = not all(r.endswith("inside .git/)") or r.startswith("git config (") for r in risky)
    if outside:
        title = f"Run this shell command outside the sandbox (it can then write anywhere)? It writes to {shown}."
    else:
        title = f"Run this shell command with git metadata writable? It writes to {shown}."
    return PermissionQuestion(tool="bash", title=title, preview=command, preview_kind="command", session_label=None,
                    outside_workspace=outside, grant="outside" if outside else "git")


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


@dataclass
class PermissionPolicy:
    mode: str = "ask"
    allowed_tools: set[str] = field(default_factory=set)
    allowed_programs: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown permission mode {self.mode!r}; use one of: {', '.join(MODES)}")

    def check(self, tool_name: str, args: Mapping[str, Any], ctx: ToolContext, *,
              hints: ToolHints | None = None) -> Decision:
        """Never raises: a call that cannot even be checked (a path with a NUL byte, an input the
        readers choke on) is refused with the reason, which is the safe side of every doubt.
        hints: given for a tool of an MCP server (None: one of ds4agent's own tools)."""
        ctx.approved = None  # an approval covers only the call checked just before it runs
        try:
            if hints is not None:
                return self._check_external(tool_name, args, hints)
            return self._decide(tool_name, args, ctx)
        except ToolError as err:
            return Decision("deny", err.message)
        except Exception as err:  # noqa: BLE001 - see the docstring
            return Decision("deny", f"{tool_name} refused: its permission check failed "
                                    f"({type(err).__name__}: {err})")

    def _decide(self, tool_name: str, args: Mapping[str, Any], ctx: ToolContext) -> Decision:
        if tool_name not in ASKING_TOOLS or (self.mode == "auto" and tool_name == "bash"):
            return ALLOW  # (auto: bash jobs are held by the sandbox alone)
        if self.mode == "plan":
            what = "no commands can be run" if tool_name == "bash" else "no file can be changed"
            return Decision("deny", f"{tool_name} {PLAN_REFUSAL}: {what} while planning; {_PLAN_NEXT}")
        if self.mode == "read-only":
            if tool_name == "bash":
                return Decision("deny", f"bash {READ_ONLY_REFUSAL}: no commands can be run in "
                                        "this session; use read, search and list instead")
            return Decision("deny", f"{tool_name} {READ_ONLY_REFUSAL}: files cannot be "
                                    "changed in this session")
        if tool_name == "bash":
            return self._check_bash(args, ctx)
        return self._check_file(tool_name, args, ctx)

    def _check_bash(self, args: Mapping[str, Any], ctx: ToolContext) -> Decision:
        command = arg_str(args, "command") or ""
        if len(command) > MAX_SCANNED_COMMAND:
            return Decision("ask", question=PermissionQuestion(
                tool="bash", title=f"Run this shell command ({len(command)} characters, too long to read)?",
                preview=command, preview_kind="command", session_label=None))
        if not availability().available:
            # Nothing bounds what the command does: the user sees each one.
            return Decision("ask", question=PermissionQuestion(
                tool="bash", title="Run this shell command? (no OS sandbox here: it can write anywhere)",
                preview=command, preview_kind="command", session_label=None))
        found = scan(command, ctx.cwd, ctx.should_stop)
        programs = found.programs if found is not None else ()
        risky = found.risky_writes if found is not None else ()
        if risky:
            return Decision("ask", question=_risky_question(command, risky))
        if "bash" in self.allowed_tools:
            return ALLOW
        if programs and all(p in self.allowed_programs for p in programs):
            return ALLOW
        # A session answer for an interpreter (python3, node, sh, ...) would cover any code at all:
        # each such command asks on its own.
        per_program = bool(programs) and not any(is_interpreter(p) for p in programs)
        q = PermissionQuestion(
            tool="bash",
            title="Run this shell command?",
            preview=command,
            preview_kind="command",
            session_label=_program_label(programs) if per_program else None,
            scope=("bash", *programs) if per_program else (),
        )
        return Decision("ask", question=q)

    def _check_file(self, tool_name: str, args: Mapping[str, Any], ctx: ToolContext) -> Decision:
        path = arg_str(args, "path")
        if path is None or not path.strip():
            return ALLOW  # the tool itself reports the missing path; nothing can be written
        target = ctx.abs_key(path)  # ToolError for a NUL byte: refused by check()
        root = os.path.realpath(ctx.cwd)
        outside = not _inside(target, root)
        # Hooks and config in .git/ run code on the next git command: never covered by a session answer.
        in_git = not outside and ".git" in os.path.relpath(target, root).split(os.sep)
        # The tool holds its run to what is judged here: this real path (a directory swapped for a
        # link afterwards cannot move the write elsewhere) and, when asked, the diff shown.
        # Outside the tree and in .git/ every mode asks: no sandbox holds the file tools there.
        if (self.mode == "auto" or tool_name in self.allowed_tools) and not outside and not in_git:
            approve(ctx, tool_name, args, target)
            return ALLOW
        try:
            change = plan_change(tool_name, args, ctx)
        except ToolError:
            # The call would fail without touching the file (guard refusal, no match, ...): let it
            # run so the model gets the specific error; there is nothing for the user to approve
            # (and should it succeed by the time it runs, it is refused: nobody was asked).
            approve(ctx, tool_name, args, target, planned_ok=False)
            return ALLOW
        approve(ctx, tool_name, args, target, change)
        diff = change.diff()
        verb = "Create" if change.creates else ("Overwrite" if tool_name == "write" else "Edit")
        where = " (outside the working directory)" if outside else " (inside .git/)" if in_git else ""
        q = PermissionQuestion(
            tool=tool_name,
            title=f"{verb} {path}{where}?",
            preview=diff.unified,
            preview_kind="diff",
            session_label=None if outside or in_git else
            f"allow {tool_name} in the working directory for this session",
            scope=() if outside or in_git else ("tool", tool_name),
            outside_workspace=outside,
            path=target,
            diff=diff,
        )
        return Decision("ask", question=q)

    def _check_external(self, tool_name: str, args: Mapping[str, Any], hints: ToolHints) -> Decision:
        if hints.read_only:
            return ALLOW
        if self.mode == "plan":
            return Decision("deny", f"{tool_name} {PLAN_REFUSAL}: this MCP tool does not declare itself "
                                    f"read-only; {_PLAN_NEXT}")
        if self.mode == "read-only":
            return Decision("deny", f"{tool_name} is not allowed in read-only mode: this MCP tool does not "
                                    "declare itself read-only")
        if tool_name in self.allowed_tools or (self.mode == "auto" and not hints.destructive):
            return ALLOW
        what = "MCP tool" if not hints.destructive else "MCP tool (it declares itself destructive)"
        q = PermissionQuestion(
            tool=tool_name,
            title=f"Allow the {what} `{tool_name}`?",
            preview=json.dumps(dict(args), indent=2, ensure_ascii=False, default=str),
            preview_kind="arguments",
            session_label=f"allow `{tool_name}` for this session",
            scope=("tool", tool_name),
        )
        return Decision("ask", question=q)

    def escalation(self, command: str, refused: tuple[Refusal, ...],
                   git_dirs: tuple[str, ...] = ()) -> PermissionQuestion | None:
        """The question after the sandbox refused part of a command (None: nobody is asked, in
        auto and read-only modes the boundary simply holds)."""
        if self.mode != "ask" or not refused:
            return None
        if all(r.in_git for r in refused):
            return PermissionQuestion(tool="bash", title=git_metadata_question(git_dirs), preview=command, preview_kind="command",
                            session_label="allow git metadata writes for this session", scope=("git",))
        paths = ", ".join(r.path for r in refused[:3]) + (" and more" if len(refused) > 3 else "")
        return PermissionQuestion(tool="bash", title=f"The sandbox refused writing to {paths}. Run this command again "
                        "outside the sandbox (it can then write anywhere)?", preview=command,
                        preview_kind="command", session_label=None, outside_workspace=True,
                        scope=("outside",))

    def remember(self, question: PermissionQuestion, answer: Answer) -> None:
        """Record a session answer; once and deny leave nothing behind."""
        if answer.choice is not Choice.SESSION or not question.scope:
            return
        kind, *names = question.scope
        if kind == "bash":
            self.allowed_programs.update(names)
        elif kind == "tool":
            self.allowed_tools.update(names)

    def reset(self) -> None:
        """Forget every session answer."""
        self.allowed_tools.clear()
        self.allowed_programs.clear()
