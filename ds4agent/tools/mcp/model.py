"""The plain facts about MCP servers that the rest of ds4agent reads (no SDK types, cheap to import).

    ServerState      starting / ready / failed / stopped
    RemoteTool       one tool as its server lists it (name, description, schema, hints)
    ServerStatus     a server's configuration, state, failure reason and tools
    McpCallError     a call that produced no result (server gone, timeout, protocol error)
    McpInterrupted   the user interrupted the call (it was cancelled on the server)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ds4agent.tools.mcp.config import ServerConfig


class McpCallError(Exception):
    """A call that did not produce a result; the message is readable and names the server."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class McpInterrupted(McpCallError):
    """The user interrupted the call; it was cancelled on the server."""


class ServerState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class RemoteTool:
    """One tool as its server lists it. `schema` is the input JSON Schema, keys in the server's order."""

    server: str
    name: str
    description: str
    schema: dict[str, Any]
    read_only: bool  # annotations.readOnlyHint (a hint from the server, as the spec says)
    destructive: bool  # annotations.destructiveHint given as true


@dataclass(frozen=True)
class ServerStatus:
    config: ServerConfig
    state: ServerState
    error: str
    tools: tuple[RemoteTool, ...]
