"""DutyCycle: cap how much of the time the device computes, by resting between units of work.

    duty = DutyCycle(50)        # compute at most half the time
    duty.begin()                # work starts now (idle time before it is not work)
    ...one prefill chunk or one decoded token...
    duty.pause()                # sleeps as long as the work since the last mark took

`pause()` measures the busy time since the last mark (begin or pause) and sleeps
busy * (100 - percent) / percent, so over a run the device computes `percent`% of the wall time
and a laptop stays cool. The work itself is untouched: the same tokens come out at any percent.
At 100 it never sleeps and never reads the clock, so full power costs nothing.

Why a marked start: the time between two runs (the user typing) is not work, and counting it
would make the first pause of the next run sleep for as long as the user was away.

The clock and the sleep are injectable so tests check the arithmetic without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .errors import EngineError

FULL_POWER = 100


def check_percent(percent: int) -> int:
    """The percent as an int in 1..100, or EngineError saying what is allowed."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= FULL_POWER:
        raise EngineError(f"power must be a whole number from 1 to {FULL_POWER} (got {percent!r})")
    return percent


class DutyCycle:
    def __init__(self, percent: int = FULL_POWER, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self.percent = check_percent(percent)
        self._mark = 0.0

    @property
    def percent(self) -> int:
        return self._percent

    @percent.setter
    def percent(self, value: int) -> None:
        # Settable between runs and during one (the worker applies /power at once): the next
        # pause uses the new ratio.
        self._percent = check_percent(value)
        self._mark = self._clock()  # a mark left from full power (never kept) is not a start

    def begin(self) -> None:
        """Work starts now: the time since the last mark was idle, not busy."""
        if self._percent < FULL_POWER:
            self._mark = self._clock()

    def pause(self) -> float:
        """Rest after a unit of work in proportion to its busy time; returns the seconds slept."""
        if self._percent >= FULL_POWER:
            return 0.0
        busy = max(0.0, self._clock() - self._mark)
        rest = busy * (FULL_POWER - self._percent) / self._percent
        if rest > 0:
            self._sleep(rest)
        self._mark = self._clock()
        return rest
