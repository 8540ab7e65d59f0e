"""The agent's side of MCP servers: the project-file question, starting, joining, stopping.

    start(worker)   at startup, before the model loads: warn about configuration errors, ask about
                    an unapproved project `.mcp.json` (remembered by the file's hash), then spawn
                    the servers in the background (they start while the model loads)
    join(worker)    before the system prompt is rendered: wait for the servers (each bounded by
                    its start timeout), say which ones serve how many tools
    tools(worker)   the MCP tools now callable (the running servers' tools)
    stop(worker)    at exit

The tool set is fixed where the system prefix is rendered (start, /new, compaction): a server
that comes up late joins at the next /new, and one that dies mid-session leaves its tools in the
prompt, where calls to them get a tool error that says the server is not running.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ds4agent.agent import events as ev
from ds4agent.agent.approval import approve_by_content
from ds4agent.agent.port import WorkerPort
from ds4agent.tools.mcp import (
    Approvals,
    McpConfig,
    McpServers,
    McpTool,
    ServerState,
    default_log_dir,
    mcp_tools,
)

if TYPE_CHECKING:
    from ds4agent.tools.mcp import ProjectFile

# The worker waits at most this long beyond the model load for servers still starting, looking
# this often whether the user sent a message meanwhile.
JOIN_TIMEOUT = 30.0
JOIN_POLL = 0.2


def _approve(worker: WorkerPort, config: McpConfig, project: ProjectFile) -> bool:
    listed = "; ".join(f"`{s.name}`: {s.command_line()}" for s in project.servers)
    return approve_by_content(
        worker, Approvals(config.config_dir), project, kind="mcp", label="MCP",
        question=f"This project's {project.path.name} starts MCP servers ({listed}). Start them?",
        declined=f"the MCP servers of {project.path} are not started")


def start(worker: WorkerPort) -> None:
    config = worker.mcp_config
    if config is None:
        return
    for problem in config.errors:
        worker.io.emit(ev.Notice(f"MCP configuration: {problem}", "warning"))
    project = config.project
    use_project = project is not None and bool(project.servers) and _approve(worker, config, project)
    servers = config.servers(use_project)
    if not servers:
        return
    io = worker.io

    def notice(text: str) -> None:
        io.emit(ev.Notice(text, "warning"))

    hub = McpServers(servers, cwd=worker.settings.cwd, log_dir=config.log_dir or default_log_dir(),
                     on_notice=notice)
    worker.mcp = hub
    hub.start()


def join(worker: WorkerPort) -> None:
    hub = worker.mcp
    if hub is None:
        return
    # A slow or hanging server holds the start at most JOIN_TIMEOUT, and says so in the status
    # line; a message the user sends meanwhile ends the wait (the server joins at the next /new).
    deadline = time.monotonic() + JOIN_TIMEOUT
    while time.monotonic() < deadline and not worker.io.has_queued():
        waiting = [s.config.name for s in hub.statuses() if s.state is ServerState.STARTING]
        if not waiting:
            break
        worker.set_state(ev.State.LOADING, detail=f"waiting for MCP server {', '.join(waiting)} "
                                                  "(send a message to go on without it)")
        hub.wait_started(min(JOIN_POLL, max(0.0, deadline - time.monotonic())))
    ready = []
    for status in hub.statuses():
        if status.state is ServerState.READY:
            ready.append(f"{status.config.name} ({len(status.tools)} tool{'' if len(status.tools) == 1 else 's'})")
        elif status.state is ServerState.STARTING:
            worker.io.emit(ev.Notice(f"MCP server `{status.config.name}` is still starting; its tools join "
                                     "with the next /new session", "warning"))
    if ready:
        worker.io.emit(ev.Notice("MCP servers: " + ", ".join(ready)))


def tools(worker: WorkerPort) -> list[McpTool]:
    return mcp_tools(worker.mcp) if worker.mcp is not None else []


def stop(worker: WorkerPort) -> None:
    hub, worker.mcp = worker.mcp, None
    if hub is not None:
        hub.close()
