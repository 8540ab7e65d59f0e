from pathlib import Path

import pytest

from ds4agent.tools import ToolContext, run_tool


class Stop:
    """A should_stop flag a test can flip."""

    def __init__(self) -> None:
        self.value = False

    def __call__(self) -> bool:
        return self.value


@pytest.fixture
def stop() -> Stop:
    return Stop()


@pytest.fixture
def ctx(tmp_path: Path, stop: Stop):
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    c = ToolContext(cwd=work, should_stop=stop, output_dir=out)
    yield c
    c.close()


@pytest.fixture
def call(ctx):
    def _call(name: str, **args):
        return run_tool(name, args, ctx)

    return _call


class Hung(BaseException):
    """Raised by `within` when a call runs past its bound. A BaseException, so run_tool's catch-all
    (which turns every Exception into a tool error) cannot swallow it."""


@pytest.fixture
def within():
    """`with within(seconds): ...` fails the test (instead of hanging the run) when the block
    blocks or spins longer than `seconds`: SIGALRM interrupts blocking opens and the regex engine."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def guard(seconds: float):
        def fire(signum, frame):
            raise Hung(f"still running after {seconds} s")

        old = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    return guard
