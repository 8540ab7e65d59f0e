"""MCP tools as ds4agent tools: the name the model writes, the arguments it sends, the error for a
tool that is gone.

    mcp_tools(servers) -> list[McpTool]        one Tool per tool of every running server
    McpTool                                     name `server__tool`, the server's description and
                                                schema, hints (read-only / destructive), run()
    missing_tool_text(name, servers) -> str | None     the tool error for a `server__tool` call that
                                                has no tool now (server gone, tool gone)
    tool_name(server, tool) -> str

A tool's name on its server may hold any characters; in ds4agent's registry it is `server__tool`
with every character outside [A-Za-z0-9_-] made '_' (the model writes it inside a DSML invoke);
a name longer than MAX_NAME, or one that cleans up to another tool's name, is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ds4agent.tools.context import ToolContext
from ds4agent.tools.mcp.client import McpServers
from ds4agent.tools.mcp.model import McpCallError, RemoteTool
from ds4agent.tools.permissions import ToolHints
from ds4agent.tools.results import ERROR_PREFIX, Observation, ToolError

SEPARATOR = "__"
MAX_NAME = 128
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_JSON_TYPES = frozenset({"number", "integer", "boolean", "array", "object", "null"})


def tool_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{_UNSAFE.sub('_', tool)}"


def coerce_args(args: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Values the schema types as numbers, booleans, arrays or objects but the model wrote as
    strings (string="true") are read as JSON; a server validating its input would refuse them
    otherwise. Anything that does not parse is sent as written: the server says what is wrong."""
    props = schema.get("properties")
    out = dict(args)
    if not isinstance(props, Mapping):
        return out
    for key, value in args.items():
        spec = props.get(key)
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        kinds = set(kind) if isinstance(kind, list) else {kind}
        if isinstance(value, str) and kinds & _JSON_TYPES and "string" not in kinds:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                pass
    return out


@dataclass
class McpTool:
    """A tool of an MCP server, in the shape of ds4agent's Tool protocol."""

    name: str
    description: str
    schema: dict[str, Any]
    mutates: bool
    hints: ToolHints
    remote: RemoteTool
    servers: McpServers

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        try:
            return self.servers.call(self.remote.server, self.remote.name, coerce_args(args, self.schema),
                                     display_name=self.name, should_stop=ctx.should_stop)
        except McpCallError as err:
            raise ToolError(err.message) from None


def mcp_tools(servers: McpServers) -> list[McpTool]:
    """The tools of the running servers, servers sorted by name, each in its server's order."""
    out: list[McpTool] = []
    seen: set[str] = set()
    for remote in servers.tools():
        name = tool_name(remote.server, remote.name)
        if len(name) > MAX_NAME or name in seen:
            continue
        seen.add(name)
        hints = ToolHints(read_only=remote.read_only, destructive=remote.destructive)
        out.append(McpTool(name, remote.description, remote.schema, not remote.read_only, hints, remote, servers))
    return out


def missing_tool_text(name: str, servers: McpServers | None) -> str | None:
    """For a call to `server__tool` that is not in the registry (a session saved while a server ran,
    loaded without it; a server that died): say why, instead of a bare "unknown tool". Like the
    unknown-tool text it is one of the loop's own results: no trailing newline."""
    server, sep, tool = name.partition(SEPARATOR)
    if not sep or not server or not tool:
        return None
    why = servers.unavailable(server) if servers is not None else None
    if why is None and servers is not None and any(t.server == server for t in servers.tools()):
        why = f"the MCP server `{server}` has no tool `{tool}`"
    if why is None:
        why = f"no MCP server `{server}` is running in this session"
    return f"{ERROR_PREFIX}unknown tool: {name}: {why}"
