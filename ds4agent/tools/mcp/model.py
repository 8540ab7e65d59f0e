"""The plain facts about MCP servers that the rest of ds4agent reads (no SDK types, cheap to import).

    ServerState      starting / ready / failed / stopped
    RemoteTool       one tool as its server lists it (name, description, schema, hints)
    ServerStatus     a server's configuration, state, failure reason and tools
    McpCallError     a call that produced no result (server gone, timeout, protocol error)
    McpInterrupted   the user interrupted the call (it was cancelled on the server)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
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


# What one server may add to the system prompt. Its tools' descriptions and schemas are rendered
# into the prompt at every start: a server listing a 2 MB description would make every start
# fail ("does not fit the context") until --no-mcp. Descriptions are cut, a tool whose schema
# alone is too large is left out, and a server's tools stop at its budget, each with a notice.
MAX_DESCRIPTION_CHARS = 4096
MAX_SCHEMA_BYTES = 16 * 1024
MAX_SERVER_PROMPT_BYTES = 64 * 1024


def bound_tools(server: str, tools: Sequence[RemoteTool]) -> tuple[tuple[RemoteTool, ...], list[str]]:
    """The tools a server's listing may put in the prompt, and the notices for what it may not."""
    kept: list[RemoteTool] = []
    notices: list[str] = []
    used = 0
    for i, tool in enumerate(tools):
        description = tool.description
        if len(description) > MAX_DESCRIPTION_CHARS:
            notices.append(f"MCP server `{server}`: the description of `{tool.name}` ({len(description):,} "
                           f"characters) was cut to {MAX_DESCRIPTION_CHARS:,}")
            description = description[:MAX_DESCRIPTION_CHARS] + " [description cut]"
        schema_bytes = len(json.dumps(tool.schema, ensure_ascii=False, default=str).encode())
        if schema_bytes > MAX_SCHEMA_BYTES:
            notices.append(f"MCP server `{server}`: tool `{tool.name}` left out: its input schema is "
                           f"{schema_bytes:,} bytes (at most {MAX_SCHEMA_BYTES:,})")
            continue
        size = len(description.encode()) + schema_bytes
        if used + size > MAX_SERVER_PROMPT_BYTES:
            notices.append(f"MCP server `{server}`: {len(tools) - i} of its {len(tools)} tools left out: they "
                           f"would add more than {MAX_SERVER_PROMPT_BYTES // 1024} KiB to the prompt")
            break
        used += size
        kept.append(dataclasses.replace(tool, description=description))
    return tuple(kept), notices
