"""The MCP server of `ds4agent --demo`: a local stand-in, so the demo shows an MCP tool call (and
the project-file approval before it) without anything installed or reachable.

    python -m ds4agent.agent.demo_server

One read-only tool, `tip(topic)`: a short tip about ds4agent for a topic ("sessions", "keys",
"permissions"); any other topic lists the known ones. It runs over stdio with the official SDK,
exactly as a user's own server would.
"""

from __future__ import annotations

import asyncio

TIPS = {
    "sessions": "/save keeps the conversation as an exact KV-cache snapshot; /load, --resume ID or "
                "--continue bring it back with no prefill; /rewind goes back to an earlier turn.",
    "keys": "Enter sends, Shift+Enter adds a line, Ctrl+C interrupts, Ctrl+T shows thinking, "
            "Ctrl+O opens the last tool card, F1 lists everything.",
    "permissions": "--permission ask (the default) asks before commands and file changes; auto asks "
                   "nothing inside the tree; read-only refuses them. /permissions shows the mode.",
}


def main() -> None:
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    tool = types.Tool(
        name="tip",
        description="A short tip about using ds4agent. Topics: " + ", ".join(sorted(TIPS)) + ".",
        input_schema={"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )

    async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
        topic = str((params.arguments or {}).get("topic", ""))
        text = TIPS.get(topic) or f"no tip about {topic!r}; topics: " + ", ".join(sorted(TIPS))
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=topic not in TIPS)

    server = Server("demo", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(run())


if __name__ == "__main__":
    main()
