"""Slash commands typed in a UI, mapped onto the Agent facade (agent-reference.md §3)."""

from __future__ import annotations

from typing import Any

from ds4agent.agent import events as ev

HELP = """commands:
  /help              this list
  /save              save the session (deferred to the end of the turn when busy)
  /load PREFIX       restore a saved session by id prefix (alias /switch)
  /list              list saved sessions, newest first
  /new               start a new session (asks to save unsaved turns)
  /history [N]       show the last N user turns (default 3)
  /compact           summarise the conversation now to free context
  /think MODE        think | nothink | think-max for later turns
  /quit, /exit       leave (asks to save unsaved turns)
keys: Enter send (queues while busy), Esc/Ctrl+C interrupt, Ctrl+X pull back a queued message"""

# Commands that run while the model is busy (the reference allows /help, /save, /list; ds4agent
# also lets /history and /think through: both are cheap reads or flag flips that never touch the
# live KV, so they cannot disturb a running turn).
BUSY_OK = {"help", "save", "list", "history", "think"}


def dispatch(agent: Any, line: str) -> bool:
    """Run `line` if it is a slash command; False when it is ordinary text to submit."""
    from ds4agent.engine.template import trim  # lazily: see Agent.submit

    line = trim(line)
    if not line.startswith("/") or line.startswith("//"):
        return False
    name, _, rest = line[1:].partition(" ")
    name = name.lower()
    rest = trim(rest)
    if name not in BUSY_OK and name in _TABLE and agent.busy:
        agent.emit(ev.Error(f"command requires the model to be idle: /{name}"))
        return True
    fn = _TABLE.get(name)
    if fn is None:
        agent.emit(ev.Error(f"unknown command: /{name}"))
        return True
    fn(agent, rest)
    return True


def _load(agent: Any, rest: str, name: str = "load") -> None:
    if not rest:
        agent.emit(ev.Error(f"usage: /{name} <sha-prefix>"))
        return
    agent.load(rest.split()[0])


def _history(agent: Any, rest: str) -> None:
    try:
        n = int(rest) if rest else 3
    except ValueError:
        n = 3  # non-numeric -> 3, as the reference
    agent.history(n)


def _think(agent: Any, rest: str) -> None:
    agent.set_think_mode(rest or "think")


_TABLE = {
    "help": lambda agent, rest: agent.emit(ev.Notice(HELP)),
    "save": lambda agent, rest: agent.save(),
    "load": _load,
    "switch": lambda agent, rest: _load(agent, rest, "switch"),
    "list": lambda agent, rest: agent.list_sessions(),
    "new": lambda agent, rest: agent.new(),
    "history": _history,
    "compact": lambda agent, rest: agent.compact(),
    "think": _think,
    "quit": lambda agent, rest: agent.quit(),
    "exit": lambda agent, rest: agent.quit(),
}
