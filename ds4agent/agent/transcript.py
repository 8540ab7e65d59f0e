"""The append-only token transcript (prompt-and-dsml.md §10) and the turn structure read back from it.

The transcript is the one source of truth of a session: the live KV always holds a prefix of it
(`Session.sync` is the only place they meet), a save writes exactly its tokens, and its rendered
text is the concatenation of its token texts. Only four operations replace it wholesale
(`reset`): a new session (system prefix), a load (the file's payload tokens), compaction, and a
rewind (a prefix of itself, cut just before a user turn).

`turns()` reads the structure back from the ids alone (no side tables), so it works the same on
a live transcript, a loaded session and a resumed journal: every `<｜User｜>` opens a turn, its
`<｜Assistant｜>` ends the user part, and the assistant output runs to the next EOS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ds4agent.protocol.tokenizer import ASSISTANT, END_THINK, EOS, THINK, USER


class Transcript:
    """Token ids of the whole session, append-only. `system_len`: tokens of the system prefix."""

    __slots__ = ("ids", "system_len")

    def __init__(self, ids: Iterable[int] = (), system_len: int = 0) -> None:
        self.ids: list[int] = list(ids)
        self.system_len = system_len

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


@dataclass(frozen=True)
class Turn:
    """One `<｜User｜>` turn read back from ids: user part, then the assistant output (EOS excluded).

    think_token: THINK or END_THINK (the token right after `<｜Assistant｜>`), or None when missing;
    complete: the assistant output ended with EOS.
    """

    start: int  # index of the <｜User｜> token
    user: tuple[int, ...]
    think_token: int | None
    output: tuple[int, ...]
    complete: bool


def split_turns(ids: Sequence[int], start: int = 0) -> list[Turn]:
    """All user turns of `ids[start:]`, in order."""
    turns: list[Turn] = []
    n = len(ids)
    i = start
    while i < n and ids[i] != USER:
        i += 1
    while i < n:
        begin = i
        j = i + 1
        while j < n and ids[j] not in (ASSISTANT, USER):
            j += 1
        user = tuple(ids[i + 1 : j])
        if j >= n or ids[j] == USER:  # a user part with no assistant (cut or malformed)
            turns.append(Turn(begin, user, None, (), False))
            i = j
            continue
        k = j + 1
        think = ids[k] if k < n and ids[k] in (THINK, END_THINK) else None
        if think is not None:
            k += 1
        m = k
        while m < n and ids[m] != EOS and ids[m] != USER:
            m += 1
        complete = m < n and ids[m] == EOS
        turns.append(Turn(begin, user, think, tuple(ids[k:m]), complete))
        i = m + 1 if complete else m
        while i < n and ids[i] != USER:
            i += 1
    return turns
