"""The MCP client on real subprocesses: the fixture server (tests/tools/mcp_fixture_server.py, written
with the SDK) over stdio. One set of servers for the whole module, started once: a working one, one
that exits after its first call, one that exits at start with a message on stderr, and a command
that does not exist."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from ds4agent.tools import ToolContext, run_tool
from ds4agent.tools.mcp import (
    McpCallError,
    McpServers,
    ServerConfig,
    ServerState,
    mcp_tools,
    missing_tool_text,
)

pytestmark = pytest.mark.xdist_group("mcp-client")  # one worker starts the module's servers

FIXTURE = str(Path(__file__).with_name("mcp_fixture_server.py"))
CALL_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    work = tmp_path_factory.mktemp("mcp-work")
    notices: list[str] = []
    configs = [
        ServerConfig("fixture", sys.executable, (FIXTURE,)),
        ServerConfig("mortal", sys.executable, (FIXTURE, "--exit-after-calls", "1")),
        ServerConfig("broken", sys.executable, ("-c", "import sys; print('missing API key', file=sys.stderr); "
                                                "sys.exit(3)")),
        ServerConfig("absent", str(work / "no-such-program")),
    ]
    hub = McpServers(configs, cwd=work, log_dir=work / "logs", on_notice=notices.append,
                     call_timeout=CALL_TIMEOUT)
    hub.start()
    hub.wait_started(60)
    yield hub, work, notices
    hub.close()


def _status(hub, name):
    return next(s for s in hub.statuses() if s.config.name == name)


def _ctx(work, stop=lambda: False):
    return ToolContext(cwd=work, should_stop=stop)


def test_a_working_server_lists_every_page_of_tools_with_their_hints(servers):
    hub, _, _ = servers
    status = _status(hub, "fixture")
    assert status.state is ServerState.READY and status.error == ""
    # The fixture lists one tool per page: both arrive only if the cursor was followed.
    assert [(t.name, t.read_only, t.destructive) for t in status.tools] == [
        ("lookup", True, False), ("write_note", False, True)]
    assert status.tools[0].schema["required"] == ["key"]


def test_failing_servers_are_notices_with_the_reason_and_offer_no_tools(servers):
    hub, _, notices = servers
    broken, absent = _status(hub, "broken"), _status(hub, "absent")
    assert broken.state is ServerState.FAILED and broken.tools == ()
    assert "missing API key" in broken.error  # the last line of its stderr
    assert absent.state is ServerState.FAILED and "No such file or directory" in absent.error
    assert sum("MCP server `broken` could not start" in n for n in notices) == 1
    assert sum("MCP server `absent` could not start" in n for n in notices) == 1
    assert not any(t.server in ("broken", "absent") for t in hub.tools())
    assert missing_tool_text("broken__x", hub) == (
        f"Tool error: unknown tool: broken__x: the MCP server `broken` is not running ({broken.error})")


def test_tools_are_named_server__tool_servers_sorted_by_name(servers):
    hub, _, _ = servers
    names = [t.name for t in mcp_tools(hub) if t.remote.server in ("fixture", "mortal")]
    assert names[:2] == ["fixture__lookup", "fixture__write_note"]
    tool = mcp_tools(hub)[0]
    assert tool.mutates is False and tool.hints.read_only
    assert tool.description == "Look up a colour's hex value."


def test_a_call_is_routed_and_its_content_becomes_the_observation(servers):
    hub, work, _ = servers
    tools = mcp_tools(hub)
    result = run_tool("fixture__lookup", {"key": "red"}, _ctx(work), tools)
    assert (result.ok, result.text) == (True, "#ff0000\n")
    picture = run_tool("fixture__lookup", {"key": "image"}, _ctx(work), tools)
    assert picture.text == "a picture:\n[image: image/png, about 6 bytes, not shown]\n"


def test_is_error_is_a_tool_error(servers):
    hub, work, _ = servers
    result = run_tool("fixture__lookup", {"key": "blue"}, _ctx(work), mcp_tools(hub))
    assert (result.ok, result.text) == (False, "Tool error: no colour named blue\n")


def test_the_writing_tool_writes_in_the_working_directory(servers):
    hub, work, _ = servers
    result = run_tool("fixture__write_note", {"path": "note.txt", "text": "hello"}, _ctx(work), mcp_tools(hub))
    assert result.text == "wrote note.txt\n"
    assert (work / "note.txt").read_text() == "hello"


def test_a_number_written_as_a_string_is_sent_as_a_number(servers):
    hub, work, _ = servers
    # delay is a "number" in the schema: "0" would make the server's sleep fail on a string.
    result = run_tool("fixture__lookup", {"key": "green", "delay": "0"}, _ctx(work), mcp_tools(hub))
    assert result.text == "#00ff00\n"


def test_a_slow_call_is_cancelled_by_the_interrupt_and_the_server_stays_usable(servers):
    hub, work, _ = servers
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    result = run_tool("fixture__lookup", {"key": "red", "delay": 30}, _ctx(work, stop.is_set), mcp_tools(hub))
    assert result.ok is False
    assert result.text == ("Tool error: interrupted by the user; the call to `lookup` on the MCP server "
                           "`fixture` was cancelled\n")
    assert run_tool("fixture__lookup", {"key": "red"}, _ctx(work), mcp_tools(hub)).text == "#ff0000\n"


def test_a_call_that_outlives_the_timeout_is_a_tool_error(servers):
    hub, work, _ = servers
    result = run_tool("fixture__lookup", {"key": "red", "delay": 10}, _ctx(work), mcp_tools(hub))
    assert result.text == f"Tool error: the MCP server `fixture` did not answer within {CALL_TIMEOUT:g} s\n"


def test_a_server_that_exits_becomes_a_notice_and_its_tools_disappear(servers):
    hub, work, notices = servers
    assert any(t.name == "mortal__lookup" for t in mcp_tools(hub))
    first = run_tool("mortal__lookup", {"key": "red"}, _ctx(work), mcp_tools(hub))
    assert first.text == "#ff0000\n"
    deadline = time.monotonic() + 30
    while _status(hub, "mortal").state is ServerState.READY and time.monotonic() < deadline:
        time.sleep(0.05)
    status = _status(hub, "mortal")
    assert status.state is ServerState.FAILED and "the server exited" in status.error
    assert sum("MCP server `mortal` stopped" in n for n in notices) == 1
    assert not any(t.remote.server == "mortal" for t in mcp_tools(hub))
    # A tool object taken before the server died (a round's tool list) fails cleanly too.
    with pytest.raises(McpCallError) as err:
        hub.call("mortal", "lookup", {"key": "red"})
    assert err.value.message.startswith("the MCP server `mortal` is not running (the server exited")
    assert missing_tool_text("mortal__lookup", hub).startswith(
        "Tool error: unknown tool: mortal__lookup: the MCP server `mortal` is not running")
