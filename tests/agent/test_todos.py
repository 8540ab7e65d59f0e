"""The model's task list through the agent: published live, and carried by the transcript through
save/load and rewind; a new session starts without one; headless JSON streams it."""

from __future__ import annotations

import io
import json

from ds4agent.agent import events as ev
from ds4agent.sessions.store import SessionStore
from ds4agent.tools import default_tools
from ds4agent.tools.todo import TodoItem
from ds4agent.ui import headless
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _todo(items):
    return reply("", think="t", calls=[("todo", {"items": items})])


A = (TodoItem("read", "in_progress"), TodoItem("fix", "pending"))
B = (TodoItem("read", "done"), TodoItem("fix", "in_progress"))


def test_live_updates_then_save_load_and_rewind_restore_the_list(tmp_path):
    store = SessionStore(tmp_path / "kv")
    h = AgentHarness.build(tmp_path / "one", [_todo("[>] read\n[ ] fix"), reply("Started.", think=""),
                                              _todo("[x] read\n[>] fix"), reply("Fixing.", think="")],
                           tools=default_tools(), store=store, answer=lambda e: "n")  # n: /new does not save
    evs = h.turn("do it")
    assert [e.items for e in of(evs, ev.TodoList)] == [A]
    evs = h.turn("go on")
    assert [e.items for e in of(evs, ev.TodoList)] == [B]
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    # Rewind to before turn 2: the list is the one turn 1 left.
    evs = h.command(lambda: h.agent.rewind(2, "chat"))
    assert [e.items for e in of(evs, ev.TodoList)] == [A]
    # A new session has none.
    evs = h.command(h.agent.new)
    assert [e.items for e in of(evs, ev.TodoList)] == [()]
    h.stop()
    # Another run loads the saved session: the list comes back with it.
    h2 = AgentHarness.build(tmp_path / "two", [], tools=default_tools(), store=store)
    evs = h2.command(lambda: h2.agent.load(saved.short_id))
    assert of(evs, ev.SessionLoaded) and [e.items for e in of(evs, ev.TodoList)] == [B]
    h2.stop()


def test_an_unchanged_list_is_not_published_again_and_a_failed_call_keeps_it(tmp_path):
    h = AgentHarness.build(tmp_path, [_todo("[>] read\n[ ] fix"), _todo("oops"), reply("ok", think="")],
                           tools=default_tools())
    evs = h.turn("do it")
    assert [e.items for e in of(evs, ev.TodoList)] == [A]  # the bad call changed nothing
    assert [r.ok for r in of(evs, ev.ToolResult)] == [True, False]
    assert h.worker.conv.todo_list == A
    h.stop()


def test_headless_json_streams_the_list(tmp_path):
    agent = AgentHarness.build(tmp_path, [_todo("[>] read\n[ ] fix"), reply("ok", think="")],
                               tools=default_tools(), start=False).agent
    out, err = io.StringIO(), io.StringIO()
    assert headless.run(agent, "go", out=out, err=err, json_mode=True, timeout=30) == 0
    todo = [x for x in map(json.loads, out.getvalue().splitlines()) if x["type"] == "TodoList"]
    assert todo == [{"type": "TodoList", "items": [{"text": "read", "status": "in_progress"},
                                                   {"text": "fix", "status": "pending"}]}]
