"""The stdio transport to an MCP server: newline-delimited JSON-RPC over the server's stdin/stdout,
with a reader whose work grows linearly with the output.

Why not the SDK's stdio_client: its reader joins the unfinished line with every chunk the pipe
delivers (`(buffer + chunk).split("\\n")`), so one message of n bytes arriving in chunks of c
bytes costs about n²/2c bytes of copying: a tool answering with 50 MB stalled for minutes.
LineBuffer keeps an unfinished line as a list of parts and looks only at each new chunk.

    LineBuffer()                   feed(chunk) -> complete lines (bytes, without "\\n");
                                   .scanned / .copied count the bytes looked at and joined
    stdio_transport(params, errlog)
        async context manager -> (read stream, write stream) of SessionMessages, what the SDK's
        Client takes. On exit: stdin closed, the server given PROCESS_GRACE seconds to exit, then
        its process group terminated (SIGTERM, SIGKILL after KILL_GRACE), every wait bounded.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any, TextIO

import anyio
from mcp import StdioServerParameters
from mcp import types as mt
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

PROCESS_GRACE = 2.0  # for the server to exit on its own once its stdin is closed
KILL_GRACE = 2.0  # between SIGTERM and SIGKILL, and for the kill to be seen
_POLL = 0.01


class LineBuffer:
    """Splits a byte stream into lines; each byte is scanned once and copied at most once."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.scanned = 0
        self.copied = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self.scanned += (end if end >= 0 else len(chunk)) - start + (1 if end >= 0 else 0)
            if end < 0:
                break
            piece = chunk[start:end]
            if self._parts:
                self._parts.append(piece)
                piece = b"".join(self._parts)
                self.copied += len(piece)
                self._parts.clear()
            lines.append(piece)
            start = end + 1
        if start < len(chunk):
            self._parts.append(chunk[start:])
        return lines


def _message(line: bytes, params: StdioServerParameters) -> SessionMessage | Exception:
    """One line as a message; a line that is not JSON-RPC is passed on as the error it is."""
    try:
        text = line.decode(params.encoding, params.encoding_error_handler)
        return SessionMessage(mt.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError as err:
        return err


async def _exited(process: Any, seconds: float) -> bool:
    # returncode, not wait(): a child of the server holding the pipes open would make wait() hang.
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(_POLL)
    return process.returncode is not None


async def _close(stream: Any) -> None:
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.aclose()


@contextlib.asynccontextmanager
async def stdio_transport(params: StdioServerParameters, errlog: TextIO) -> AsyncIterator[tuple[Any, Any]]:
    process = await anyio.open_process(
        [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
        cwd=params.cwd, env=get_default_environment() | (params.env or {}),
        start_new_session=True,  # its own process group: the whole tree is stopped at the end
    )
    to_session, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, from_session = anyio.create_memory_object_stream[Any](0)
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def read() -> None:
        lines = LineBuffer()
        session_open = True
        with contextlib.suppress(OSError, anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with to_session:
                async for chunk in stdout:
                    # Once the session is gone the output is still read (and dropped): a server
                    # blocked on a full pipe could not see its stdin close and exit.
                    for line in lines.feed(chunk) if session_open else ():
                        try:
                            await to_session.send(_message(line, params))
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            session_open = False
                            break

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await stdin.send(data.encode(params.encoding, params.encoding_error_handler))
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await _close(to_session)  # the server cannot be written to: the session sees the end

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            # Whatever cancelled the caller, the server is stopped: every wait below is bounded.
            with anyio.CancelScope(shield=True):
                await _close(read_stream)
                await _close(write_stream)
                await _close(stdin)
                if not await _exited(process, PROCESS_GRACE):
                    with contextlib.suppress(OSError, ProcessLookupError):
                        await terminate_posix_process_tree(process, KILL_GRACE)
                    await _exited(process, KILL_GRACE)
                await _close(stdout)
            tg.cancel_scope.cancel()
