"""The append-only token transcript (prompt-and-dsml.md §10).

The transcript is the one source of truth of a session: the live KV always holds a prefix of it
(`Session.sync` is the only place they meet), a save writes exactly its tokens, and its rendered
text is the concatenation of its token texts. Only four operations replace it wholesale
(`reset`): a new session (system prefix), a load (the file's payload tokens), compaction, and a
rewind (a prefix of itself, cut just before a user turn).

The turn structure is read back from the ids alone by the protocol's inverse of the renderer
(`ds4agent.protocol.template.split_turns`), so it works the same on a live transcript, a loaded
session and a resumed journal.
"""

from __future__ import annotations

from collections.abc import Iterable

from ds4agent.protocol.tokenizer import EOS, USER


class Transcript:
    """Token ids of the whole session, append-only. `system_len`: tokens of the system prefix."""

    __slots__ = ("ids", "system_len", "system_seen_at")

    def __init__(self, ids: Iterable[int] = (), system_len: int = 0) -> None:
        self.ids: list[int] = list(ids)
        self.system_len = system_len
        # Where the system prompt last appeared: the system prefix, a reminder (worker.py), or a
        # rebuild (load, compaction, rewind count as a fresh start: the next reminder comes a
        # whole interval later).
        self.system_seen_at = len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, token: int) -> None:
        self.ids.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        self.ids.extend(tokens)

    def reset(self, ids: Iterable[int], system_len: int) -> None:
        """Replace the transcript (new session, load, compaction): the only non-append operation."""
        self.ids = list(ids)
        self.system_len = system_len
        self.system_seen_at = len(self.ids)

    def system_seen(self) -> None:
        """The system prompt was just appended again (a reminder)."""
        self.system_seen_at = len(self.ids)

    def snapshot(self) -> tuple[int, ...]:
        return tuple(self.ids)

    @property
    def last(self) -> int | None:
        return self.ids[-1] if self.ids else None

    def at_turn_boundary(self) -> bool:
        """True when a user turn may be appended: right after the system prefix or after an EOS."""
        return len(self.ids) <= self.system_len or self.ids[-1] == EOS

    def has_user_turn(self) -> bool:
        return USER in self.ids[self.system_len:]
