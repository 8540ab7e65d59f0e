"""The agent's side of the one decode loop: the engine's `generate` plus the interrupt flag.

An assistant round (worker.py) and a compaction summary (compaction.py) both generate through
`TokenStream`, which reads `ds4agent.engine.generate` (the decode primitive: it samples on the
device and computes the next step while the caller works on a token). The caller reads the
tokens in a `for` loop and decides what each one means; it ends generation by leaving the loop,
and the token it stopped at is never kept in the session (its step was in flight and is dropped;
the next sync runs it if the transcript keeps it). So an EOS, a stop token or the close of a
DSML block costs no model step that is kept.

    stream = TokenStream(session, sampler, limit=cap, greedy=lambda: parser.in_syntax,
                         should_stop=io.should_stop)
    for token in stream:
        ...            # break to stop: this token is not in the session
    stream.interrupted  # True when should_stop() ended it
    stream.force(ids)   # the next tokens are these ids, not sampled (the agent writes them itself)

should_stop() is asked as each token arrives; a token that arrives after it said so is dropped,
as if the interrupt had come before the token was sampled.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from ds4agent.engine import generate

if TYPE_CHECKING:
    from ds4agent.engine import DutyCycle, Sampler, Session


def _never() -> bool:
    return False


class TokenStream:
    __slots__ = ("_session", "_sampler", "_limit", "_greedy", "_should_stop", "_forced", "_duty",
                 "interrupted")

    def __init__(self, session: Session, sampler: Sampler, *, limit: int, greedy: Callable[[], bool],
                 should_stop: Callable[[], bool] = _never, duty: DutyCycle | None = None) -> None:
        self._session = session  # (tests: a double speaking the same decode seam)
        self._sampler = sampler
        self._limit = limit
        self._greedy = greedy  # asked before every token: argmax while it says so
        self._should_stop = should_stop
        self._forced: deque[int] = deque()
        self._duty = duty  # rests between tokens at a power below 100 (engine/duty.py)
        self.interrupted = False

    def force(self, tokens: Iterable[int]) -> None:
        """Hand out these ids next instead of sampling. A forced token is stepped, counted against
        the limit and interruptible exactly like a sampled one: the transcript cannot tell them
        apart, and the model conditions on it as on its own output."""
        self._forced.extend(tokens)

    def _next_forced(self) -> int | None:
        return self._forced.popleft() if self._forced else None

    def __iter__(self) -> Iterator[int]:
        should_stop = self._should_stop
        # closing(): leaving this loop early ends the engine's generator at once (it drops its
        # in-flight step and settles the session), not whenever it is collected.
        with contextlib.closing(generate(self._session, self._sampler, max_tokens=self._limit,
                                         greedy=self._greedy, forced=self._next_forced,
                                         duty=self._duty)) as tokens:
            for token in tokens:
                if should_stop():
                    self.interrupted = True
                    return
                yield token
