"""Textual messages posted at the event boundary (see bridge.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from ds4agent.agent import events as ev

if TYPE_CHECKING:  # the facade is imported by the app's main() only (the first paint does not wait)
    from ds4agent.agent.facade import Agent


class AgentEvents(Message):
    """A coalesced batch of agent events, in order: (event, raw events merged into it)."""

    def __init__(self, batch: list[tuple[ev.Event, int]]) -> None:
        super().__init__()
        self.batch = batch


class AgentReady(Message):
    """The agent object exists and its worker started (the model may still be loading)."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent


class AgentFailed(Message):
    """Building the agent failed before its worker could report anything (one readable line)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
