"""The tool table and the one way to run a call.

    Tool                                      protocol: name, description, schema, mutates, run(args, ctx)
    default_tools(edit_upto) -> list[Tool]    the fixed, stable registry order (the system prompt's bytes;
                                              ds4agent.protocol.template.tool_schema_line renders each line)
    run_tool(name, args, ctx, tools=None)     never raises: every failure becomes a "Tool error: ..." result
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ds4agent import utf8
from ds4agent.tools.bash import BashStatusTool, BashStopTool, BashTool
from ds4agent.tools.context import ToolContext
from ds4agent.tools.files import EditTool, MoreTool, ReadTool, WriteTool
from ds4agent.tools.listing import ListTool
from ds4agent.tools.results import (
    ERROR_PREFIX,
    RESULT_CAP_BYTES,
    Observation,
    TextDisplay,
    ToolError,
    error_result,
)
from ds4agent.tools.search import SearchTool
from ds4agent.tools.todo import TodoTool


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    schema: dict  # JSON Schema of the parameters, keys in the order they are rendered
    mutates: bool  # writes files or runs commands (the permission policy asks about these)

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation: ...


def default_tools(edit_upto: bool = False) -> list[Tool]:
    """The registry, in the fixed order that the system prompt's tools block renders (byte-stable).
    edit_upto (--edit-upto): the edit tool describes HEAD[upto]TAIL selection."""
    return [
        BashTool(),
        BashStatusTool(),
        BashStopTool(),
        ReadTool(),
        MoreTool(),
        WriteTool(),
        EditTool(upto=edit_upto),
        SearchTool(),
        ListTool(),
        TodoTool(),
    ]


def _cap(text: str) -> str:
    """Cut a result over 128 KiB at a UTF-8 boundary and say so (the baseline cut silently)."""
    data = text.encode("utf-8")
    if len(data) <= RESULT_CAP_BYTES:
        return text
    marker = f"\n[tool result truncated: {len(data)} bytes, showing the first {{kept}}]\n"
    budget = RESULT_CAP_BYTES - len(marker.format(kept=RESULT_CAP_BYTES))
    kept = utf8.cut(data, budget).decode("utf-8")
    return kept + marker.format(kept=len(kept.encode("utf-8")))


def run_tool(
    name: str, args: Mapping[str, Any], ctx: ToolContext, tools: Iterable[Tool] | None = None
) -> Observation:
    """Run one call. Never raises for the model's mistakes or the file system's refusals.

    Unknown tool -> `Tool error: unknown tool: NAME` without a trailing newline: it is one of the
    texts the loop produces itself (prompt-and-dsml.md §9). Everything else that fails becomes
    `Tool error: MESSAGE\\n` like the baseline observations.
    """
    registry = {t.name: t for t in (tools if tools is not None else default_tools())}
    tool = registry.get(name)
    if tool is None:
        text = f"{ERROR_PREFIX}unknown tool: {name}"
        return Observation(text, ok=False, display=TextDisplay(summary=f"unknown tool: {name}", body=""))
    try:
        result = tool.run(dict(args), ctx)
    except ToolError as exc:
        for path, lineno, raw in exc.shown:
            ctx.seen.record(path, [(lineno, raw)])
        result = error_result(exc.message)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        result = error_result(f"{exc.strerror or exc}{where}")
    except Exception as exc:  # the contract: nothing escapes into the agent loop
        # A bug or an absurd input must not take the agent down; the model sees a readable line.
        result = error_result(f"{name} failed: {type(exc).__name__}: {exc}")
    result.text = _cap(result.text)
    return result
