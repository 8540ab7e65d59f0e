"""Tools from the user's Model Context Protocol servers, called like ds4agent's own tools.

Public names (import them from here):
    load_config(cwd, config_dir=None) -> McpConfig   `.mcp.json` of the working tree + the user's file
    McpConfig, ServerConfig, ProjectFile, Approvals  the configuration; the project-file approvals
    ApprovableFile                                    what an approval is remembered by (the file's hash)
    default_config_dir(), default_log_dir()           ds4agent's config / server log directories
    McpServers                                        the running servers (a background event loop
                                                      behind a synchronous API)
    ServerState, ServerStatus, RemoteTool             what a server is doing, what it offers
    McpCallError, McpInterrupted                      a call that produced no result
    McpTool, mcp_tools(servers)                       the servers' tools as Tool objects
    missing_tool_text(name, servers)                  the error for a call to a tool that is gone

Modules: config.py (files, validation, approvals), model.py (plain facts), client.py (the loop
thread and the synchronous API), connection.py (the SDK: one server; render_result), tool.py
(names, argument coercion). Nothing here imports the agent. Importing this package does not
import the SDK: that happens when an McpServers is made.
"""

from ds4agent.tools.mcp.client import McpServers
from ds4agent.tools.mcp.config import (
    ApprovableFile,
    Approvals,
    McpConfig,
    ProjectFile,
    ServerConfig,
    default_config_dir,
    default_log_dir,
    load_config,
)
from ds4agent.tools.mcp.model import McpCallError, McpInterrupted, RemoteTool, ServerState, ServerStatus
from ds4agent.tools.mcp.tool import McpTool, mcp_tools, missing_tool_text

__all__ = [
    "ApprovableFile",
    "Approvals",
    "McpCallError",
    "McpConfig",
    "McpInterrupted",
    "McpServers",
    "McpTool",
    "ProjectFile",
    "RemoteTool",
    "ServerConfig",
    "ServerState",
    "ServerStatus",
    "default_config_dir",
    "default_log_dir",
    "load_config",
    "mcp_tools",
    "missing_tool_text",
]
