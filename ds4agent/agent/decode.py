"""The one decode loop: sample a token, hand it out, step the session with it; repeat.

An assistant round (worker.py) and a compaction summary (compaction.py) both generate through
`TokenStream`. The caller reads the tokens in a `for` loop and decides what each one means; it
ends generation by leaving the loop, and the token it stopped at is never evaluated (the session
is stepped with a token only when the caller asks for the next one). So an EOS, a stop token or
the close of a DSML block costs no model step.

    stream = TokenStream(session, sampler, limit=cap, greedy=lambda: parser.in_syntax,
                         should_stop=io.should_stop)
    for token in stream:
        ...            # break to stop before this token is evaluated
    stream.interrupted  # True when should_stop() ended it (before the next token was sampled)
    stream.force(ids)   # the next tokens are these ids, not sampled (the agent writes them itself)

Narrow on purpose (session, sampling, a generator), so it can move into the engine as its decode
primitive without changing its callers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol


class Stepping(Protocol):
    """The two things decoding needs of a session: the current logits and one step."""

    @property
    def logits(self) -> object: ...

    def step(self, token: int) -> object: ...


class Sampling(Protocol):
    def sample(self, logits: object, *, greedy: bool = False) -> int: ...


def _never() -> bool:
    return False


class TokenStream:
    __slots__ = ("_session", "_sampler", "_limit", "_greedy", "_should_stop", "_forced", "interrupted")

    def __init__(self, session: Stepping, sampler: Sampling, *, limit: int, greedy: Callable[[], bool],
                 should_stop: Callable[[], bool] = _never) -> None:
        self._session = session
        self._sampler = sampler
        self._limit = limit
        self._greedy = greedy  # asked before every token: argmax while it says so
        self._should_stop = should_stop
        self._forced: deque[int] = deque()
        self.interrupted = False

    def force(self, tokens: Iterable[int]) -> None:
        """Hand out these ids next instead of sampling. A forced token is stepped, counted against
        the limit and interruptible exactly like a sampled one: the transcript cannot tell them
        apart, and the model conditions on it as on its own output."""
        self._forced.extend(tokens)

    def __iter__(self) -> Iterator[int]:
        session = self._session
        sample = self._sampler.sample
        greedy = self._greedy
        should_stop = self._should_stop
        logits = session.logits
        for _ in range(self._limit):
            if should_stop():
                self.interrupted = True
                return
            forced = self._forced
            token = forced.popleft() if forced else sample(logits, greedy=greedy())
            yield token
            logits = session.step(token)
