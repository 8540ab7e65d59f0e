"""A small MCP server for the tests, written with the official SDK, run as a subprocess over stdio.

    python tests/tools/mcp_fixture_server.py [--exit-after-calls N]

Tools (listed one per page, so the client has to follow the cursor):
    lookup(key, delay=0)       read-only: the value of `key` ("red" -> "#ff0000"); "image" adds an
                               image block, an unknown key is an isError result; delay=seconds first
    write_note(path, text)     destructive: writes `text` to `path` (relative to the server's cwd)
--exit-after-calls N: the process exits shortly after answering its Nth call (a server that dies
between calls).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

VALUES = {"red": "#ff0000", "green": "#00ff00"}

TOOLS = [
    types.Tool(
        name="lookup",
        description="Look up a colour's hex value.",
        input_schema={"type": "object", "properties": {"key": {"type": "string"}, "delay": {"type": "number"}},
                      "required": ["key"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="write_note",
        description="Write a note to a file.",
        input_schema={"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                      "required": ["path", "text"]},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
    ),
]


def main() -> None:
    exit_after = int(sys.argv[sys.argv.index("--exit-after-calls") + 1]) if "--exit-after-calls" in sys.argv else 0
    calls = 0

    async def list_tools(ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        index = int(params.cursor) if params is not None and params.cursor else 0
        more = index + 1 < len(TOOLS)
        return types.ListToolsResult(tools=[TOOLS[index]], next_cursor=str(index + 1) if more else None)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        nonlocal calls
        calls += 1
        if exit_after and calls >= exit_after:
            asyncio.get_running_loop().call_later(0.3, os._exit, 7)  # after this answer is sent
        args = params.arguments or {}
        if params.name == "lookup":
            await asyncio.sleep(float(args.get("delay", 0)))
            key = str(args.get("key", ""))
            if key == "image":
                return types.CallToolResult(content=[
                    types.TextContent(text="a picture:"),
                    types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
                ])
            if key not in VALUES:
                return types.CallToolResult(content=[types.TextContent(text=f"no colour named {key}")],
                                            is_error=True)
            return types.CallToolResult(content=[types.TextContent(text=VALUES[key])])
        if params.name == "write_note":
            Path(str(args["path"])).write_text(str(args["text"]), encoding="utf-8")
            return types.CallToolResult(content=[types.TextContent(text=f"wrote {args['path']}")])
        raise ValueError(f"unknown tool {params.name}")

    server = Server("fixture", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    print("fixture server starting", file=sys.stderr, flush=True)
    asyncio.run(run())


if __name__ == "__main__":
    main()
