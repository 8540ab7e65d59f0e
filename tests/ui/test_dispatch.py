"""The shared tables of the front ends: events -> handlers (dispatch.py), slash commands -> agent calls."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from ds4agent.agent import RUNS_WHILE_BUSY
from ds4agent.agent import events as ev
from ds4agent.ui import commands
from ds4agent.ui.dispatch import EventTable


def test_event_table_dispatches_by_type_then_base_class():
    seen = []
    table = EventTable({ev.Notice: lambda e, n: seen.append(("notice", e.text, n)) or "n",
                        ev.Event: lambda e, n: seen.append(("any", type(e).__name__, n)) or "a"})
    assert table.dispatch(ev.Notice("hi"), 2) == "n"
    assert table.dispatch(ev.Exited(0)) == "a"
    assert seen == [("notice", "hi", 2), ("any", "Exited", 1)]
    assert EventTable({ev.Notice: lambda e, n: 1}).dispatch(ev.Exited(0)) is None
    with pytest.raises(TypeError, match="not an agent event type"):
        EventTable({str: lambda e, n: None})


def _event_types():
    return {c for _, c in inspect.getmembers(ev, inspect.isclass)
            if issubclass(c, ev.Event) and c is not ev.Event and dataclasses.is_dataclass(c)}


def test_the_tui_has_a_handler_for_every_agent_event():
    from ds4agent.ui.app import Ds4App

    app = Ds4App(agent=object())
    missing = sorted(t.__name__ for t in _event_types() if t not in app._event_table)
    assert missing == []


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


@pytest.mark.parametrize(("line", "call"), [
    ("/save", ("save", None)), ("/save  My title ", ("save", "My title")), ("/list", ("list_sessions",)),
    ("/switch ab12", ("load", "ab12")), ("/history", ("history", 3)), ("/history 900", ("history", 200)),
    ("/new", ("new",)), ("/compact", ("compact",)), ("/rewind", ("rewind_points",)),
    ("/rewind 2 code", ("rewind", 2, "code")), ("/fork", ("fork", "")), ("/think", ("set_think_mode", "think")),
    ("/nothink", ("set_think_mode", "nothink")), ("/permissions auto", ("set_permission_mode", "auto")),
    ("/power 40", ("set_power", 40)), ("/power", ("set_power", None)), ("/exit", ("quit",)),
])
def test_each_command_makes_its_agent_call(line, call):
    agent = _Recorder()
    commands.call_agent(commands.prepare(line, busy=False), agent)
    assert agent.calls == [call]


def test_power_needs_a_whole_number_and_runs_while_busy():
    with pytest.raises(commands.CommandError, match="^/power needs a whole number"):
        commands.prepare("/power half", busy=False)
    agent = _Recorder()
    commands.call_agent(commands.prepare("/power 10", busy=True), agent)
    assert agent.calls == [("set_power", 10)]


def test_steer_takes_text_and_runs_while_busy():
    agent = _Recorder()
    commands.call_agent(commands.prepare("/steer use the v2 API instead", busy=True), agent)
    assert agent.calls == [("steer", "use the v2 API instead")]


def test_the_busy_rule_shown_is_the_agents():
    assert {c.name for c in commands.COMMANDS if c.runs_while_busy} == set(RUNS_WHILE_BUSY) == {"help", "save", "list", "power", "steer"}
    with pytest.raises(commands.CommandError, match="^command requires the model to be idle: /switch$"):
        commands.prepare("/switch ab", busy=True)
    with pytest.raises(commands.CommandError, match="^usage: /rewind"):
        commands.call_agent(commands.prepare("/rewind x", busy=False), _Recorder())
    with pytest.raises(commands.CommandError, match="cannot run: the agent could not start"):
        commands.prepare("/new", busy=False, failed_start=True)
