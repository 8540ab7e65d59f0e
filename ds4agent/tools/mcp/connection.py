"""One MCP server over stdio, on the official SDK; with stdio.py (the transport) the only modules
here that import it.

    Connection(config, cwd=..., log_dir=..., start_timeout=..., notify=...)
        await serve()                 spawn, initialise, list the tools (following the cursor), then
                                      wait for `stop`; every failure becomes FAILED with a reason
        await call(tool, args, timeout, display_name) -> Observation
    render_result(name, result) -> Observation      a CallToolResult as the model's observation

Everything in this module runs on the event loop thread of client.McpServers, except status().
The SDK's context managers are entered and left inside serve(), in one task, as anyio requires.
A server that exits shows itself through its stdout closing (the read stream is watched), so a
death between calls is noticed at once, not at the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
from mcp import Client, StdioServerParameters
from mcp import types as mt
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from ds4agent.tools.mcp.config import ServerConfig
from ds4agent.tools.mcp.confine import confined_command
from ds4agent.tools.mcp.model import McpCallError, RemoteTool, ServerState, ServerStatus, bound_tools
from ds4agent.tools.mcp.stdio import stdio_transport
from ds4agent.tools.results import Observation, TextDisplay, error_text

# The SDK logs transport trouble through `logging`; with no handler configured Python would print
# it on stderr, under the UI. What matters reaches the user as a notice instead.
logging.getLogger("mcp").addHandler(logging.NullHandler())

MAX_TOOL_PAGES = 100  # a server whose cursor never ends cannot hang the start
CLIENT_INFO = mt.Implementation(name="ds4agent", version="0.1.0")


def _leaf(err: BaseException) -> BaseException:
    """The first real exception inside the task groups' exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def describe_error(err: BaseException) -> str:
    err = _leaf(err)
    if isinstance(err, MCPError):
        return err.message or f"MCP error {err.code}"
    if isinstance(err, OSError):
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror or err}{where}"
    return str(err) or type(err).__name__


def _remote_tool(server: str, tool: mt.Tool) -> RemoteTool:
    hints = tool.annotations
    return RemoteTool(
        server=server,
        name=tool.name,
        description=tool.description or "",
        schema=dict(tool.input_schema),
        read_only=bool(hints is not None and hints.read_only_hint),
        destructive=bool(hints is not None and hints.destructive_hint),
    )


# ---------------------------------------------------------------------------- results

def _block_line(block: Any) -> str:
    """One line for a content block that is not text: what it is and how large."""
    if isinstance(block, mt.ImageContent | mt.AudioContent):
        size = len(block.data) * 3 // 4  # base64
        return f"[{block.type}: {block.mime_type}, about {size} bytes, not shown]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]"
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        mime = f", {res.mime_type}" if res.mime_type else ""
        if isinstance(res, mt.TextResourceContents):
            size = len(res.text.encode("utf-8"))
        else:
            size = len(res.blob) * 3 // 4
        return f"[resource: {res.uri}{mime}, {size} bytes, not shown]"
    return f"[{getattr(block, 'type', type(block).__name__)} content, not shown]"


def render_result(name: str, result: mt.CallToolResult) -> Observation:
    """The observation: the text blocks as they are (joined by newlines), one line for every other
    block, the structured content as JSON when there is nothing else; the text ends in "\\n" like
    the other tools' observations. isError makes it a tool error the model can act on."""
    parts = [b.text if isinstance(b, mt.TextContent) else _block_line(b) for b in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    body = "\n".join(parts)
    if result.is_error:
        message = body or "the tool reported an error without a message"
        return Observation(error_text(message), ok=False,
                          display=TextDisplay(summary=message.split("\n", 1)[0], body=message))
    if not body:
        return Observation("(no output)\n", display=TextDisplay(summary=f"{name}: no output", body=""))
    text = body if body.endswith("\n") else body + "\n"
    return Observation(text, display=TextDisplay(summary=f"{name}: {body.split(chr(10), 1)[0]}", body=body))


# ---------------------------------------------------------------------------- the transport

class _EndWatch:
    """The transport's read stream, telling `on_end` when it ends: the server's stdout closed,
    which is how a server that exits shows itself between calls."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # read by the SDK's dispatcher when the stream carries one
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EndWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _watched_stdio(params: StdioServerParameters, errlog: TextIO,
                         on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    async with stdio_transport(params, errlog) as (read, write):
        yield _EndWatch(read, on_end), write


def _stderr_tail(path: Path | None) -> str:
    """The last non-empty line the server wrote on stderr (a failing server usually says why)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 2048))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


# ---------------------------------------------------------------------------- one server

class Connection:
    """One server. Every method but status() runs on the event loop's thread."""

    def __init__(self, config: ServerConfig, *, cwd: Path, log_dir: Path | None, start_timeout: float,
                 notify: Callable[[str], None]) -> None:
        self.config = config
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.notify = notify
        self.state = ServerState.STARTING
        self.error = ""
        self.tools: tuple[RemoteTool, ...] = ()
        self.client: Client | None = None
        self.stop = asyncio.Event()  # bound to the loop at its first use, on the loop's thread
        self.stopping = False
        self.started = threading.Event()  # set once the state left STARTING (any thread may wait)
        self.task: asyncio.Task[None] | None = None
        self.log_path = log_dir / f"{config.name}.log" if log_dir is not None else None

    def status(self) -> ServerStatus:
        return ServerStatus(self.config, self.state, self.error, self.tools)

    def unavailable(self) -> str:
        why = f" ({self.error})" if self.error else ""
        return f"the MCP server `{self.config.name}` is not running{why}"

    def fail(self, reason: str) -> None:
        if self.state in (ServerState.FAILED, ServerState.STOPPED):
            return
        tail = _stderr_tail(self.log_path)
        self.error = reason + (f" (stderr: {tail})" if tail and tail not in reason else "")
        was_ready = self.state is ServerState.READY
        self.state = ServerState.FAILED
        self.client = None
        self.started.set()
        self.stop.set()
        what = "stopped" if was_ready else "could not start"
        self.notify(f"MCP server `{self.config.name}` {what}: {self.error}; its tools are not available")

    def _ended(self) -> None:
        if not self.stopping:
            self.fail("the server exited")

    def timed_out(self) -> None:
        """The start timer fired: a server still starting is given up (its task cancelled)."""
        if self.state is ServerState.STARTING and self.task is not None:
            self.fail(f"no answer within {self.start_timeout:g} s")
            self.task.cancel()

    async def serve(self) -> None:
        self.task = asyncio.current_task()
        config = self.config
        command, args, temp = confined_command(config, self.cwd)
        params = StdioServerParameters(command=command, args=args, env=dict(config.env) or None, cwd=self.cwd)
        try:
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path if self.log_path is not None else os.devnull, "w", encoding="utf-8",
                      errors="replace") as errlog:
                # mode="legacy": the initialize handshake every MCP server speaks (the SDK's "auto"
                # mode first sends a probe that older servers may leave unanswered).
                client = Client(_watched_stdio(params, errlog, self._ended), mode="legacy", cache=None,
                                client_info=CLIENT_INFO)
                async with client:
                    tools = await self._list_tools(client)
                    if self.state is ServerState.STARTING:
                        self.tools, self.client, self.state = tools, client, ServerState.READY
                        self.started.set()
                        await self.stop.wait()
        except asyncio.CancelledError:
            pass  # the start timed out (already FAILED) or close() gave up waiting
        except Exception as err:  # every failure of a server is a notice, never a crash
            self.fail(describe_error(err))
        finally:
            self.client = None
            if self.state in (ServerState.STARTING, ServerState.READY):
                self.state = ServerState.STOPPED
            self.started.set()
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)

    async def _list_tools(self, client: Client) -> tuple[RemoteTool, ...]:
        found: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            found += [_remote_tool(self.config.name, t) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        kept, notices = bound_tools(self.config.name, found)
        for notice in notices:
            self.notify(notice)
        return kept

    async def call(self, tool: str, args: dict[str, Any], timeout: float, display_name: str) -> Observation:
        client = self.client
        name = self.config.name
        if client is None or self.state is not ServerState.READY:
            raise McpCallError(self.unavailable())
        try:
            result = await client.call_tool(tool, args, read_timeout_seconds=timeout)
        except MCPError as err:
            if err.code == mt.REQUEST_TIMEOUT:
                raise McpCallError(f"the MCP server `{name}` did not answer within {timeout:g} s") from None
            if err.code == mt.CONNECTION_CLOSED:
                self._ended()
                raise McpCallError(self.unavailable()) from None
            raise McpCallError(f"the MCP server `{name}` refused the call: {describe_error(err)}") from None
        except ValidationError as err:
            raise McpCallError(f"the MCP server `{name}` answered with an invalid result "
                               f"({err.error_count()} validation error(s))") from None
        return render_result(display_name, result)
