"""The MCP stdio transport reads a server's output in work linear in its size (the SDK's reader
joined the unfinished line with every chunk: quadratic in the length of one message)."""

from __future__ import annotations

import sys

from ds4agent.tools.mcp import McpServers, ServerConfig, mcp_tools
from ds4agent.tools.mcp.stdio import LineBuffer

# A server without the SDK: one JSON-RPC message per line; its one tool answers with `size` bytes.
RAW_SERVER = r"""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid = msg["method"], msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "raw", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "big", "description": "Much text.",
                             "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}}}}]}
    elif method == "tools/call":
        size = msg["params"]["arguments"]["size"]
        result = {"content": [{"type": "text", "text": "ab\ncd\n" * (size // 6)}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
    sys.stdout.flush()
"""


def test_one_long_line_in_many_chunks_is_scanned_and_copied_once():
    total = 20 << 20
    chunk = b"x" * (64 << 10)
    buf = LineBuffer()
    got = []
    for _ in range(total // len(chunk)):
        got += buf.feed(chunk)
    assert got == []
    got += buf.feed(b"\n")
    assert [len(line) for line in got] == [total]
    assert buf.scanned == total + 1 and buf.copied == total  # the SDK's reader copied ~n²/2c: 3.3 GB


def test_lines_split_anywhere_come_out_whole():
    buf = LineBuffer()
    stream = b'{"a": 1}\n\n{"b":\n2}\nlast'
    out = []
    for i in range(len(stream)):
        out += buf.feed(stream[i:i + 1])
    assert out == [b'{"a": 1}', b"", b'{"b":', b"2}"]
    buf = LineBuffer()
    assert buf.feed(stream) == [b'{"a": 1}', b"", b'{"b":', b"2}"] and buf.copied == 0


def test_a_twelve_megabyte_answer_arrives_whole(tmp_path):
    hub = McpServers([ServerConfig("raw", sys.executable, ("-c", RAW_SERVER))], cwd=tmp_path,
                     log_dir=tmp_path / "logs", call_timeout=120)
    hub.start()
    try:
        hub.wait_started(60)
        [tool] = mcp_tools(hub)
        result = hub.call("raw", "big", {"size": 12 << 20}, display_name=tool.name)
        assert result.ok and result.text == "ab\ncd\n" * ((12 << 20) // 6)
    finally:
        hub.close()
