import json

from ds4agent.protocol.template import tool_schema_line
from ds4agent.tools import RESULT_CAP_BYTES, Observation, ToolError, default_tools, run_tool
from ds4agent.tools.args import arg_bool, arg_float, arg_int


def test_registry_order_and_schemas_are_stable():
    tools = default_tools()
    assert [t.name for t in tools] == [
        "bash", "bash_status", "bash_stop", "read", "more", "write", "edit", "search", "list", "todo",
    ]
    lines1 = [tool_schema_line(t) for t in tools]
    lines2 = [tool_schema_line(t) for t in default_tools()]
    assert lines1 == lines2
    for t, line in zip(tools, lines1, strict=True):
        assert "\n" not in line
        obj = json.loads(line)
        assert list(obj) == ["name", "description", "parameters"]
        assert obj["name"] == t.name
        params = obj["parameters"]
        assert list(params)[:2] == ["type", "properties"]
        assert set(params["required"]) <= set(params["properties"])


def test_schema_line_format_matches_spec_separators():
    line = tool_schema_line(default_tools()[-2])  # list
    assert line.startswith('{"name": "list", "description": "')
    assert '"parameters": {"type": "object", "properties": {"path": {' in line


def test_unknown_tool_has_no_trailing_newline(ctx):
    r = run_tool("frobnicate", {}, ctx)
    assert r.text == "Tool error: unknown tool: frobnicate"
    assert not r.ok


def test_missing_required_argument(ctx):
    r = run_tool("read", {}, ctx)
    assert r.text == "Tool error: missing required parameter: path\n"
    assert not r.ok


class _Boom:
    name = "boom"
    description = "fails"
    schema = {"type": "object", "properties": {}, "required": []}
    mutates = False

    def __init__(self, exc):
        self.exc = exc

    def run(self, args, ctx):
        raise self.exc


class _Big:
    name = "big"
    description = "large"
    schema = {"type": "object", "properties": {}, "required": []}
    mutates = False

    def run(self, args, ctx):
        return Observation("é" * RESULT_CAP_BYTES)


def test_failures_become_tool_errors(ctx):
    r = run_tool("boom", {}, ctx, tools=[_Boom(ToolError("nope"))])
    assert r.text == "Tool error: nope\n"
    r = run_tool("boom", {}, ctx, tools=[_Boom(PermissionError(13, "Permission denied", "/x"))])
    assert r.text == "Tool error: Permission denied: /x\n"
    r = run_tool("boom", {}, ctx, tools=[_Boom(ValueError("bad"))])
    assert r.text == "Tool error: boom failed: ValueError: bad\n"
    r = run_tool("boom", {}, ctx, tools=[_Boom(KeyError("k"))])
    assert r.text == "Tool error: boom failed: KeyError: 'k'\n"


def test_result_cap_adds_marker_and_stays_under_cap(ctx):
    r = run_tool("big", {}, ctx, tools=[_Big()])
    data = r.text.encode("utf-8")
    assert len(data) <= RESULT_CAP_BYTES
    assert "[tool result truncated: 262144 bytes, showing the first" in r.text
    assert r.text.endswith("]\n")


def test_argument_coercion():
    assert arg_int({"n": "12 "}, "n", 5) == 12
    assert arg_int({"n": 12}, "n", 5) == 12
    assert arg_int({"n": 3.0}, "n", 5) == 3
    assert arg_int({"n": "12abc"}, "n", 5) == 5
    assert arg_int({"n": True}, "n", 5) == 5
    assert arg_int({"n": "0"}, "n", 5, 1, 10) == 1
    assert arg_int({"n": "99"}, "n", 5, 1, 10) == 10
    assert arg_int({}, "n", None) is None
    assert arg_float({"t": "2.5"}, "t", 60.0, 1.0, 3600.0) == 2.5
    assert arg_float({"t": "0.1"}, "t", 60.0, 1.0, 3600.0) == 1.0
    assert arg_float({"t": "x"}, "t", 60.0, 1.0, 3600.0) == 60.0
    for v, want in [("TRUE", True), ("yes", True), ("1", True), (True, True), ("No", False), ("0", False),
                    (False, False)]:
        assert arg_bool({"b": v}, "b", not want) is want
    assert arg_bool({"b": "maybe"}, "b", True) is True


def test_there_is_no_view_image_tool_and_the_readme_says_why():
    """The engine runs text weights only: an image tool would fill the context with bytes the
    model cannot see (README: Images)."""
    from pathlib import Path

    from ds4agent.tools import default_tools

    assert "view_image" not in [t.name for t in default_tools()]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "There is no `view_image` tool: the engine runs DeepSeek V4 Flash's text weights only" in readme
