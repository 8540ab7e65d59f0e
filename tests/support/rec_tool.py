"""RecTool: a tool double that records its calls (the agent and UI tests' stand-in for real tools)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ds4agent.tools import Observation


@dataclass
class RecTool:
    """A tool that records its calls and returns `text` (or what `fn` returns)."""

    name: str
    text: str = "ok\n"
    fn: Callable[[Mapping[str, Any]], str] | None = None
    mutates: bool = False
    description: str = "A test tool."
    schema: dict = field(default_factory=lambda: {"type": "object", "properties": {"x": {"type": "string"}}})
    calls: list[dict] = field(default_factory=list)

    def run(self, args: Mapping[str, Any], ctx: Any) -> Observation:
        self.calls.append(dict(args))
        return Observation(self.fn(args) if self.fn else self.text)
