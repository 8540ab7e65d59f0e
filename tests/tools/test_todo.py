"""The todo tool: the whole list each call, checkbox lines (or a JSON array), and its result text
read back as the same list."""

from __future__ import annotations

import pytest

from ds4agent.tools import ToolContext, default_tools, run_tool
from ds4agent.tools.todo import MAX_ITEMS, TodoDisplay, TodoItem, items_from_result, render


@pytest.fixture
def ctx(tmp_path):
    return ToolContext(cwd=tmp_path)


def test_checkbox_lines_set_the_list_and_the_result_reads_back(ctx):
    r = run_tool("todo", {"items": "[x] read the parser\n- [>] fix   the bug\n\n[ ] run the tests\n"}, ctx)
    assert r.ok
    assert r.text == "Todo list (1/3 done):\n[x] read the parser\n[>] fix the bug\n[ ] run the tests\n"
    items = (TodoItem("read the parser", "done"), TodoItem("fix the bug", "in_progress"),
             TodoItem("run the tests", "pending"))
    assert r.display == TodoDisplay(items)
    assert items_from_result(r.text) == items
    assert run_tool("todo", {"items": ""}, ctx).text == "Todo list: empty\n"
    assert items_from_result("Todo list: empty\n") == ()
    assert items_from_result("Edited f.txt\n") is None


def test_a_json_array_is_read_too(ctx):
    r = run_tool("todo", {"items": [{"content": "a", "status": "completed"}, {"text": "b", "status": "in progress"},
                                    {"text": "c"}]}, ctx)
    assert r.text == "Todo list (1/3 done):\n[x] a\n[>] b\n[ ] c\n"
    assert run_tool("todo", {"items": '[{"text": "a", "status": "done"}]'}, ctx).text == "Todo list (1/1 done):\n[x] a\n"


@pytest.mark.parametrize(("items", "error"), [
    ("fix it", "Tool error: todo line 1 has no checkbox: start each task with [ ] (pending), [>] (in progress) or "
               "[x] (done); got 'fix it'\n"),
    ("[ ] a\n[x]   ", "Tool error: todo line 2 has a checkbox but no task text\n"),
    ([{"text": "a", "status": "maybe"}], "Tool error: todo item 1 has an unknown status 'maybe' (use pending, "
                                          "in_progress, done)\n"),
    ("\n".join(["[ ] t"] * (MAX_ITEMS + 1)), f"Tool error: todo takes at most {MAX_ITEMS} tasks (got 51); group "
                                             "the small ones\n"),
])
def test_malformed_lists_are_readable_errors(ctx, items, error):
    assert run_tool("todo", {"items": items}, ctx).text == error
    assert run_tool("todo", {}, ctx).text.startswith("Tool error: todo requires items")


def test_long_text_is_one_clipped_line_and_the_tool_is_last_and_reading():
    item = render((TodoItem("x" * 300, "pending"),))
    tool = default_tools()[-1]
    assert tool.name == "todo" and tool.mutates is False
    r = run_tool("todo", {"items": "[ ] " + "word " * 100}, ToolContext(cwd="."))
    (only,) = items_from_result(r.text)
    assert len(only.text) == 200 and only.text.endswith("…")
    assert item.startswith("Todo list (0/1 done):\n[ ] xxx")
