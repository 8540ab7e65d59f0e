"""The worker: the DSML tool loop and session commands, run on the Agent's worker thread.

(Stub while the foundation modules land; filled in next.)
"""

from __future__ import annotations

from typing import Any

from ds4agent.agent import events as ev
from ds4agent.agent.settings import AgentSettings


class Worker:
    def __init__(self, engine: Any, store: Any, tools: Any, settings: AgentSettings, *, io: Any,
                 policy: Any = None) -> None:
        self.engine = engine
        self.store = store
        self.tools = tools
        self.settings = settings
        self.io = io
        self.policy = policy

    def startup(self) -> bool:
        raise NotImplementedError

    def emit_status(self) -> None:
        pass

    def list_sessions_event(self) -> ev.SessionList:
        return ev.SessionList("", ())

    def history_event(self, n: int) -> ev.History:
        return ev.History(0, ())

    def set_think_mode(self, mode: str) -> None:
        self.settings.think_mode = mode

    def confirm_leave(self) -> bool:
        return True

    def close(self) -> None:
        pass
