"""Asking once for a project file that makes the agent run commands (`.mcp.json`'s servers,
`.ds4agent/hooks.json`'s hooks): the answer is remembered by the file's content (Approvals), so
an edited file asks again."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.port import WorkerPort
from ds4agent.tools.mcp import ApprovableFile, Approvals
from ds4agent.tools.mcp.config import McpConfigError


def approve_by_content(worker: WorkerPort, approvals: Approvals, project: ApprovableFile, *, kind: str,
                       label: str, question: str, declined: str) -> bool:
    """The user's answer for this exact file: remembered yes / never, else asked (y, n, d).
    kind: the question's kind (and id prefix); label: how notices name the thing ("MCP", "hook");
    declined: the notice when the answer is not yes."""
    try:
        known = approvals.answer(project)
    except McpConfigError as err:
        worker.io.emit(ev.Notice(f"{label} approvals unreadable, asking again: {err}", "warning"))
        known = None
    if known is not None:
        return known
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id(kind), kind=kind, question=question,
        options=(("y", "yes, for this file"), ("n", "not now"), ("d", "never for this file")),
    ))
    if key in ("y", "d"):
        try:
            approvals.remember(project, key == "y")
        except OSError as err:
            worker.io.emit(ev.Notice(f"{label} approval not remembered: {err.strerror or err}", "warning"))
    if key != "y":
        worker.io.emit(ev.Notice(declined, "warning"))
    return key == "y"
