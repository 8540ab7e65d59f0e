"""The real DS4 Flash shape in CI: one Flash-shape test file per test run.

Every test here runs in the xdist group "flash" (pyproject's `--dist loadgroup` puts the group on
one worker), so at most one Flash-shape process (~11 GiB resident) runs at a time on a 23 GiB
machine. The file (about 4 GiB: ds4's tensor table with random weights in shared data regions,
`ds4agent make-test-model --config flash`) is written once per worker run and removed at the end,
whatever happened (pytest keeps old temp directories; a 4 GiB file must not stay behind).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DS4AGENT = [sys.executable, "-m", "ds4agent.cli"]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.xdist_group("flash"))


@pytest.fixture(scope="session")
def flash_file(tmp_path_factory) -> Path:
    given = os.environ.get("DS4AGENT_TEST_FLASH_FILE")
    if given:  # a developer's file written once (`make-test-model --config flash`): used, never removed
        yield Path(given)
        return
    folder = tmp_path_factory.mktemp("flash")
    path = folder / "flash-q2.gguf"
    try:  # whatever happens (a failed or killed write leaves its temp file), the folder goes
        r = subprocess.run([*DS4AGENT, "make-test-model", str(path), "--config", "flash", "--experts", "q2"],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def flash_env(tmp_path: Path) -> dict[str, str]:
    """The UI tests' isolated environment (own HOME, history, state dirs; no stray model or KV
    settings), unbuffered so a reader sees each line as the agent prints it. The agent computes
    on the kernel set a user's CPU gets (the fast set), not the exact reference the suite pins
    for the engine's own tests (tests/conftest.py): this is the product at full shape, and the
    reference's properties at full shape are test_flash_shape.py's engine test (a few dozen
    tokens cost minutes on the reference, seconds on the fast set)."""
    from ds4agent.engine.device import KERNELS_ENV
    from tests.ui.test_tmux import _env

    return {**_env(tmp_path), "PYTHONUNBUFFERED": "1", KERNELS_ENV: "cpu"}
