"""The commands the facade hands to the worker thread, as values.

Each command is a frozen dataclass: what it carries is typed, and its user-facing name (the slash
command's, in "/load cannot run: ..." and the busy rule's refusal) and the wording of its
unexpected failure ("new session failed: ...") are stated on the class, once. The facade queues
them (facade.Agent); the worker runs them (Worker.run, one `match`).

This module imports nothing of the worker, so importing the facade stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class _Command:
    """What every command states on its class: `name` (the slash command's) and `failure` (the
    wording of an unexpected failure: the name unless the class says otherwise)."""

    name: ClassVar[str]
    failure: ClassVar[str]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "failure" not in cls.__dict__:
            cls.failure = cls.name


@dataclass(frozen=True)
class Turn(_Command):
    """A user message (typed, or the queue's messages joined when queued is True)."""

    text: str
    queued: bool = False
    name: ClassVar[str] = "turn"


@dataclass(frozen=True)
class Save(_Command):
    """/save [TITLE]."""

    title: str | None = None
    name: ClassVar[str] = "save"


@dataclass(frozen=True)
class LoadSession(_Command):
    """/load PREFIX (a session id prefix, or a .kv path)."""

    prefix: str
    name: ClassVar[str] = "load"


@dataclass(frozen=True)
class NewSession(_Command):
    """/new."""

    name: ClassVar[str] = "new"
    failure: ClassVar[str] = "new session"


@dataclass(frozen=True)
class Compact(_Command):
    """/compact."""

    name: ClassVar[str] = "compact"
    failure: ClassVar[str] = "compaction"


@dataclass(frozen=True)
class Rewind(_Command):
    """/rewind: the list of user turns (number None), or go back to turn `number` (1-based)."""

    number: int | None = None
    mode: str = "both"
    name: ClassVar[str] = "rewind"


@dataclass(frozen=True)
class Fork(_Command):
    """/fork [TITLE] ("" for the default title)."""

    title: str = ""
    name: ClassVar[str] = "fork"


@dataclass(frozen=True)
class DeleteSession(_Command):
    """/del PREFIX."""

    prefix: str
    name: ClassVar[str] = "del"


@dataclass(frozen=True)
class Strip(_Command):
    """/strip PREFIX."""

    prefix: str
    name: ClassVar[str] = "strip"


@dataclass(frozen=True)
class Quit(_Command):
    """/quit: the save question, then the worker ends."""

    name: ClassVar[str] = "quit"


WorkerCommand = Turn | Save | LoadSession | NewSession | Compact | Rewind | Fork | DeleteSession | Strip | Quit
