"""A local stand-in for the two web MCP servers of README's example (docs/examples/mcp-web.json),
so the example config is tested without the network: the same tool names and parameters, canned
answers. Run over stdio with the official SDK:

    python tests/tools/mcp_web_standin.py fetch     fetch(url, max_length=5000): a page as text
    python tests/tools/mcp_web_standin.py search    brave_web_search(query, count=10): result lines
"""

from __future__ import annotations

import asyncio
import sys

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

PAGES = {"https://example.com/": "Example Domain\n\nThis domain is for use in illustrative examples in documents."}
RESULTS = {"python 3.13 release date": ["Python 3.13.0 was released on 7 October 2024 - https://www.python.org/"]}

TOOLS = {
    "fetch": types.Tool(
        name="fetch",
        description="Fetches a URL from the internet and extracts its contents as markdown.",
        input_schema={"type": "object", "properties": {"url": {"type": "string"},
                                                       "max_length": {"type": "integer"}}, "required": ["url"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    "search": types.Tool(
        name="brave_web_search",
        description="Performs a web search using the Brave Search API.",
        input_schema={"type": "object", "properties": {"query": {"type": "string"}, "count": {"type": "number"}},
                      "required": ["query"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
}


def main(kind: str) -> None:
    tool = TOOLS[kind]

    async def list_tools(ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "fetch":
            page = PAGES.get(str(args.get("url")))
            if page is None:
                return types.CallToolResult(content=[types.TextContent(text=f"Failed to fetch {args.get('url')}")],
                                            is_error=True)
            return types.CallToolResult(content=[types.TextContent(text=page[: int(args.get("max_length", 5000))])])
        hits = RESULTS.get(str(args.get("query", "")).lower(), [])
        return types.CallToolResult(content=[types.TextContent(text="\n".join(hits) or "No results.")])

    server = Server(kind, version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1])
