"""The MCP servers of one agent behind a small synchronous API.

    servers = McpServers(configs, cwd=..., log_dir=..., on_notice=...)
    servers.start()                       spawn every server in the background (returns at once)
    servers.wait_started(timeout)         block until each is ready or has failed (or the timeout)
    servers.tools() -> list[RemoteTool]   the tools of the servers that are up, servers by name
    servers.call(server, tool, args, display_name, should_stop) -> Observation   raises McpCallError
    servers.unavailable(server) -> str | None
    servers.statuses() -> list[ServerStatus]
    servers.close()                       stop them all (stdin closed, then terminated, then killed)

The SDK is asyncio-based; the agent's worker thread is not. One daemon thread runs an event loop
that owns every connection (connection.py: one task per server). The worker thread only submits
coroutines to that loop and waits on their futures, polling the interrupt every 100 ms; an
interrupted call is cancelled, and the SDK tells the server (notifications/cancelled).

Failure is never a crash: a server that cannot be spawned, fails the handshake, does not answer
within the start timeout, or exits later becomes FAILED with a readable reason (its stderr's last
line appended), `on_notice` is told once, and its tools are gone from tools(). A server's stderr
goes to `log_dir/NAME.log`, never to the terminal the UI draws on. The servers are programs the
user configured, run as the user (like an editor's or Claude Code's); the OS sandbox is for the
model's bash jobs, not for them.

Importing this module is cheap; the SDK (a second or more of imports) is loaded when an
McpServers is made, so an agent without MCP servers never pays for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ds4agent.tools.mcp.config import ServerConfig
from ds4agent.tools.mcp.model import McpCallError, McpInterrupted, RemoteTool, ServerState, ServerStatus
from ds4agent.tools.results import Observation

if TYPE_CHECKING:
    from ds4agent.tools.mcp.connection import Connection

START_TIMEOUT = 30.0  # spawn + initialize + the whole tool listing (npx may download first)
CALL_TIMEOUT = 300.0  # one tools/call; a tool that needs longer is better run as a bash job
STOP_TIMEOUT = 8.0  # close(): the SDK's own shutdown waits up to ~4 s per server (all in parallel)
# A cancelled server's cleanup (stdio.py): PROCESS_GRACE for it to exit on its own, then SIGTERM
# and SIGKILL KILL_GRACE apart.
CLEANUP_TIMEOUT = 7.0
POLL = 0.1  # how often a waiting call looks at the interrupt flag

T = TypeVar("T")


def _never() -> bool:
    return False


def _cancel_task(conn: Connection) -> None:
    """On the loop: cancel a server's task (its transport then stops the process tree)."""
    if conn.task is not None:
        conn.task.cancel()


class McpServers:
    """The agent's MCP servers (see the module docstring). The public methods may be called from
    any thread but the loop's own."""

    def __init__(self, servers: Sequence[ServerConfig], *, cwd: Path, log_dir: Path | None = None,
                 on_notice: Callable[[str], None] | None = None, start_timeout: float = START_TIMEOUT,
                 call_timeout: float = CALL_TIMEOUT) -> None:
        from ds4agent.tools.mcp.connection import Connection  # the SDK, only when there are servers

        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self._on_notice = on_notice
        self._loop = asyncio.new_event_loop()
        # asyncio's default handler logs stray task errors to stderr (under the UI): every failure
        # that matters is already a server state or a call's error.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._thread: threading.Thread | None = None
        self._conns: dict[str, Connection] = {
            c.name: Connection(c, cwd=Path(cwd), log_dir=Path(log_dir) if log_dir is not None else None,
                               start_timeout=start_timeout, notify=self._notify)
            for c in servers
        }
        self._tasks: list[concurrent.futures.Future[None]] = []
        self._closed = False

    def _notify(self, message: str) -> None:
        if self._on_notice is not None and not self._closed:
            try:
                self._on_notice(message)
            except Exception:  # a listener's failure must not take the connection down
                pass

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is not None or self._closed:
            return
        self._thread = threading.Thread(target=self._loop.run_forever, name="ds4agent-mcp", daemon=True)
        self._thread.start()
        self._tasks = [self._submit(self._serve(conn)) for conn in self._conns.values()]

    async def _serve(self, conn: Connection) -> None:
        timer = self._loop.call_later(self.start_timeout, conn.timed_out)
        try:
            await conn.serve()
        finally:
            timer.cancel()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def wait_started(self, timeout: float | None = None) -> None:
        """Until no server is still starting (each one is bounded by the start timeout anyway)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for conn in self._conns.values():
            conn.started.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop every server and the loop. Idempotent; bounded by STOP_TIMEOUT + CLEANUP_TIMEOUT."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            self._loop.close()
            return
        for conn in self._conns.values():
            conn.stopping = True
            self._loop.call_soon_threadsafe(conn.stop.set)
            if conn.state is ServerState.STARTING:
                # Still in its handshake, it never reaches the stop event: its task is cancelled on
                # the loop, and the transport's shielded cleanup stops the process tree before the
                # task ends. (Cancelling only the future below would end the wait at once and stop
                # the loop mid-cleanup, leaving a hanging server running after the agent.)
                self._loop.call_soon_threadsafe(_cancel_task, conn)
        _, pending = concurrent.futures.wait(self._tasks, timeout=STOP_TIMEOUT)
        if pending:  # the same for a server stuck in its own shutdown: cancelled on the loop, and
            # its process tree stopped by the transport before the loop stops
            for conn in self._conns.values():
                self._loop.call_soon_threadsafe(_cancel_task, conn)
            concurrent.futures.wait(pending, timeout=CLEANUP_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------------ what is there

    def statuses(self) -> list[ServerStatus]:
        return [conn.status() for conn in self._conns.values()]

    def tools(self) -> list[RemoteTool]:
        """The tools of the running servers: servers sorted by name, each in its own order."""
        out: list[RemoteTool] = []
        for name in sorted(self._conns):
            status = self._conns[name].status()
            if status.state is ServerState.READY:
                out += status.tools
        return out

    def unavailable(self, server: str) -> str | None:
        """Why `server`'s tools cannot be called now (None: it runs, or no such server is configured)."""
        conn = self._conns.get(server)
        if conn is None or conn.state is ServerState.READY:
            return None
        return conn.unavailable()

    # ------------------------------------------------------------------ calls

    def call(self, server: str, tool: str, args: Mapping[str, Any], *, display_name: str = "",
             should_stop: Callable[[], bool] = _never) -> Observation:
        """Run one tool on its server (not from the loop's thread); raises McpCallError, McpInterrupted."""
        conn = self._conns.get(server)
        if conn is None or self._closed or self._thread is None:
            raise McpCallError(f"no MCP server `{server}` is running in this session")
        future = self._submit(conn.call(tool, dict(args), self.call_timeout, display_name or tool))
        # The SDK's timeout ends the call; this backstop only guards against a loop that is stuck.
        deadline = time.monotonic() + self.call_timeout + 5.0
        while True:
            done, _ = concurrent.futures.wait([future], timeout=POLL)
            if done:
                break
            if should_stop():
                future.cancel()
                raise McpInterrupted(f"interrupted by the user; the call to `{tool}` on the MCP server "
                                     f"`{server}` was cancelled")
            if time.monotonic() > deadline:
                future.cancel()
                raise McpCallError(f"the MCP server `{server}` did not answer within {self.call_timeout:g} s")
        try:
            return future.result()
        except McpCallError:
            raise
        except Exception as err:  # anything else the SDK raises is this call's failure, readable
            from ds4agent.tools.mcp.connection import describe_error

            raise McpCallError(f"the call to `{tool}` on the MCP server `{server}` failed: "
                               f"{describe_error(err)}") from None
