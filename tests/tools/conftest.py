from pathlib import Path

import pytest

from ds4agent.tools import ToolContext, run_tool
from tests.support import timeouts


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


@pytest.fixture
def within():
    """`with within(seconds): ...`: the block fails the test instead of hanging the run."""
    return timeouts.within
