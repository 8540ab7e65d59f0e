"""The busy rule, stated once in the facade: while the worker is busy only /save (deferred) and
/list act; every other command is refused with the same words the front ends show."""

from __future__ import annotations

import threading

from ds4agent.agent import Agent, AgentSettings
from ds4agent.agent import events as ev


def test_idle_only_commands_are_refused_while_the_worker_is_busy(tmp_path):
    gate = threading.Event()

    def loader(progress):
        gate.wait(10)  # the model is still loading: start-up counts as busy
        raise RuntimeError("no model")

    agent = Agent(loader, None, [], AgentSettings(cwd=tmp_path, journal=False))
    agent.start()
    try:
        assert agent.busy
        agent.history(3)
        agent.set_think_mode("nothink")
        agent.set_permission_mode("auto")
        agent.new()
        agent.rewind(1)
        agent.save()
        agent.list_sessions()
        evs = agent.poll_events()
        assert [e.text for e in evs if isinstance(e, ev.Error)] == [
            "command requires the model to be idle: /history",
            "command requires the model to be idle: /nothink",
            "command requires the model to be idle: /permissions",
            "command requires the model to be idle: /new",
            "command requires the model to be idle: /rewind",
        ]
        assert [e.text for e in evs if isinstance(e, ev.Notice)] == ["save scheduled at next safe point"]
        assert [e for e in evs if isinstance(e, ev.SessionList)] == [ev.SessionList("", ())]
        assert agent.settings.permission == "ask" and agent.settings.think_mode == "think"
    finally:
        gate.set()
        agent.shutdown()
