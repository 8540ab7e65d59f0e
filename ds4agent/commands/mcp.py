"""`ds4agent mcp list`: the MCP servers the agent would start here, whether they start, their tools.

Reads the user's `mcp.json` (ds4agent's config directory) and the working tree's `.mcp.json`,
starts every server the agent would start (a project file only once it was approved: that
question is asked by the agent at its start, never here), waits for each, prints what it offers
under the names the model sees (`server__tool`), then stops them. Plain text, the same in a pipe.
Exit status 1 when a configuration entry is invalid or a server fails to start, else 0.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ds4agent.commands.settings import McpSettings
from ds4agent.tools.mcp import (
    Approvals,
    McpConfig,
    McpServers,
    ServerState,
    default_log_dir,
    load_config,
    mcp_tools,
)
from ds4agent.tools.mcp.config import McpConfigError


def _project_line(config: McpConfig) -> tuple[str, bool]:
    """The project file's line and whether its servers are started."""
    project = config.project
    if project is None:
        return "project: no .mcp.json in the working tree", False
    try:
        answer = Approvals(config.config_dir).answer(project)
    except McpConfigError:
        answer = None
    state = {True: "approved", False: "refused for this file",
             None: "not approved yet: ds4agent asks when it starts in this directory"}[answer]
    return f"project: {project.path} ({state})", answer is True


def _hints(read_only: bool, destructive: bool) -> str:
    return " [read-only]" if read_only else " [destructive]" if destructive else ""


def list_servers(cwd: Path, config_dir: Path | None, timeout: float, out: TextIO,
                 log_dir: Path | None = None) -> int:
    """The report on `out`; the exit status. config_dir / log_dir None: ds4agent's own."""
    config = load_config(cwd, config_dir)
    status = 0
    user_file = config.user_path if config.user_path is not None and config.user_path.exists() else None
    out.write(f"user:    {user_file if user_file is not None else f'no {config.user_path}'}\n")
    line, use_project = _project_line(config)
    out.write(line + "\n")
    for problem in config.errors:
        out.write(f"error:   {problem}\n")
        status = 1
    servers = config.servers(use_project)
    if not use_project and config.project is not None:
        for s in config.project.servers:
            if s.name not in {x.name for x in servers}:
                out.write(f"\n{s.name} (project): not started: the project file is not approved\n"
                          f"  command: {s.command_line()}\n")
    if not servers:
        if not (config.project and config.project.servers):
            out.write("\nno MCP servers configured\n")
        return status
    hub = McpServers(servers, cwd=cwd, log_dir=log_dir or default_log_dir(), start_timeout=timeout)
    try:
        hub.start()
        hub.wait_started(timeout + 5.0)
        tools = mcp_tools(hub)
        for st in hub.statuses():
            out.write(f"\n{st.config.name} ({st.config.source}): ")
            if st.state is ServerState.READY:
                mine = [t for t in tools if t.remote.server == st.config.name]
                out.write(f"started, {len(mine)} tool{'' if len(mine) == 1 else 's'}\n")
            else:
                out.write(f"failed to start: {st.error or st.state.value}\n")
                status = 1
            out.write(f"  command: {st.config.command_line()}\n")
            for t in tools:
                if t.remote.server == st.config.name:
                    first = t.description.strip().split("\n", 1)[0]
                    out.write(f"  {t.name}{_hints(t.hints.read_only, t.hints.destructive)}"
                              f"{': ' + first if first else ''}\n")
    finally:
        hub.close()
    return status


def main(settings: McpSettings) -> int:
    return list_servers(Path.cwd(), None, settings.timeout, sys.stdout)
