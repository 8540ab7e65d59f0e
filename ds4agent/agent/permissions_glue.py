"""The bridge between the tools' PermissionPolicy (pure policy) and the UI (questions as events).

The policy decides allow / deny / ask; on ask the worker publishes a PermissionRequest and waits
for `Agent.answer_permission(id, key)`: "y" allow once, "s" allow for this session (when the
policy offers a session scope), "n" deny (an optional message goes to the model). An interrupt
while waiting answers "n". Nothing times out into a "no" or a "yes".

After a bash job, after_run() asks the sandbox's one question for a command it refused (see
PermissionPolicy.escalation) and runs the command again when the user allows it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ds4agent.agent import events as ev
from ds4agent.agent.port import WorkerPort
from ds4agent.tools import BashDisplay, Observation, Tool, run_tool
from ds4agent.tools.mcp import McpTool
from ds4agent.tools.permissions import READ_ONLY_REFUSAL, Answer, Choice, PermissionQuestion, denied_result
from ds4agent.tools.sandbox import availability, git_paths


def start_notices(worker: WorkerPort) -> list[str]:
    """Said once at start: bash commands run without an OS sandbox here."""
    avail = availability()
    if avail.available:
        return []
    then = {"ask": "every command asks before it runs",
            "auto": "--permission auto runs them unconfined, without asking"}.get(worker.policy.mode, "")
    why = avail.detail.removeprefix("none ").strip("()")
    return [f"no OS sandbox for bash commands: {why}" + (f"; {then}" if then else "")]


MODE_TEXT = (
    ("ask", "bash commands and file changes ask first: y once, s for the session (a tool; for bash, "
            "the programs of the command, never an interpreter such as python3), n deny"),
    ("auto", "nothing asks inside the working tree; bash commands still run in the sandbox, and what "
             "it refuses stays refused"),
    ("read-only", "bash, write and edit are refused; reading, searching and listing work"),
)


def explain(mode: str) -> list[str]:
    """/permissions without an argument: every mode (the current one marked), the rule that holds
    in all of them, and what the sandbox does here."""
    lines = [f"permission mode: {mode} (change it with /permissions ask|auto|read-only)"]
    for name, text in MODE_TEXT:
        lines.append(f"{'›' if name == mode else ' '} {name:<9}  {text}")
    lines.append("  every mode: a write outside the working tree or into .git/ asks first, auto included")
    avail = availability()
    if avail.available:
        lines.append(f"sandbox: {avail.detail}: a bash command can write only inside the working tree (not "
                     "its .git/), its own temporary directory and /dev/shm; reading is open. A write the "
                     "sandbox refuses asks once whether to run the command again outside it (ask mode).")
    else:
        why = avail.detail.removeprefix("none ").strip("()")
        lines.append(f"sandbox: none here ({why}): in ask mode every bash command asks before it runs; "
                     "auto runs them unconfined")
    return lines


def permit(worker: WorkerPort, tool: Tool, args: Mapping[str, object]) -> str | None:
    """None when the call may run; else the result text the model gets instead. A tool of an MCP
    server is judged by what it declares about itself (its hints)."""
    name = tool.name
    hints = tool.hints if isinstance(tool, McpTool) else None
    decision = worker.policy.check(name, args, worker.tool_ctx, hints=hints)
    if decision.kind == "allow":
        return None
    if decision.kind == "deny" or decision.question is None:
        return decision.result().text
    answer = _ask(worker, name, decision.question)
    worker.policy.remember(decision.question, answer)
    if answer.allowed:
        _grant_once(worker, decision.question)
        return None
    return denied_result(answer).text


def _grant_once(worker: WorkerPort, q: PermissionQuestion) -> None:
    """A bash command asked about for its writes outside the tree (or into .git/) runs, once,
    without the sandbox rule that would refuse them: the user answered that question already, so
    the sandbox must not refuse the same write and ask a second time."""
    if q.grant == "outside":
        worker.tool_ctx.sandbox.outside_once = True
    elif q.grant == "git":
        worker.tool_ctx.sandbox.git_once = True


def after_run(worker: WorkerPort, name: str, args: Mapping[str, object], result: Observation) -> Observation:
    """After a bash job the sandbox refused something: the one question for that command (run it
    again outside the sandbox; for git metadata, let git write .git/ once or for the session), and
    the second run's result when the user allowed it."""
    # A one-time grant given for this call (_grant_once) never outlives it, even when the call
    # ended before its job started (a bad argument).
    worker.tool_ctx.sandbox.outside_once = worker.tool_ctx.sandbox.git_once = False
    refused = result.sandbox_refusals
    display = result.display
    # (Not after bash_stop: the model ended that command; running it again is not what it asked.)
    if not refused or not isinstance(display, BashDisplay) or name not in ("bash", "bash_status"):
        return result
    q = worker.policy.escalation(display.command, refused, git_paths(str(worker.tool_ctx.cwd)))
    if q is None:
        return result
    answer = _ask(worker, "bash", q)
    if not answer.allowed:
        said = f"; the user says: {answer.message.strip()}" if answer.message.strip() else ""
        return Observation(result.text + f"The user did not allow it outside the sandbox{said}\n", ok=False,
                          display=display)
    grants = worker.tool_ctx.sandbox
    if q.scope == ("git",):
        if answer.choice is Choice.SESSION:
            grants.git_writable = True
            done = "The user allowed git to write its metadata for this session; the command ran again:\n"
        else:
            grants.git_once = True
            done = "The user allowed git to write its metadata this once; the command ran again:\n"
    else:
        grants.outside_once = True
        done = "The user allowed this command outside the sandbox; it ran again:\n"
    rerun = {k: v for k, v in args.items() if k in ("timeout_sec", "refresh_sec")} if name == "bash" else {}
    again = run_tool("bash", {**rerun, "command": display.command}, worker.tool_ctx, worker.tools)
    return Observation(done + again.text, ok=again.ok, display=again.display)


def _ask(worker: WorkerPort, name: str, q: PermissionQuestion) -> Answer:
    """Publish the question, wait for the key: "y" once, "s" session (when offered), else deny."""
    options: list[tuple[str, str]] = [("y", "allow once")]
    if q.session_label:
        options.append(("s", q.session_label))
    options.append(("n", "deny"))
    request = ev.PermissionRequest(
        id=worker.io.new_id("perm"),
        tool=name,
        question=q.title,
        detail=q.preview,
        options=tuple(options),
        preview_kind=q.preview_kind,
        diff=q.diff,
        outside_workspace=bool(q.outside_workspace),
    )
    key, message = worker.io.ask(request)
    if key == "y":
        return Answer.once()
    if key == "s" and q.session_label:
        return Answer.session()
    return Answer.deny(message)


def refused_as_read_only(result: ev.ToolResult) -> bool:
    """Whether a tool result is the read-only mode's refusal (headless says why only then)."""
    return not result.ok and READ_ONLY_REFUSAL in result.text
