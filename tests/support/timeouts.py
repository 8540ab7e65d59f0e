"""A bound on how long a test's block may run, so a regression hangs nothing: `with within(s):`."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Hung(BaseException):
    """Raised by `within` when a call runs past its bound. A BaseException, so run_tool's catch-all
    (which turns every Exception into a tool error) cannot swallow it."""


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail the test (instead of hanging the run) when the block blocks or spins longer than
    `seconds`: SIGALRM interrupts blocking opens and long computations."""

    def fire(signum, frame):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
