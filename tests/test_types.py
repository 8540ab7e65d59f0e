"""The type check is part of the test command: mypy, as configured in pyproject.toml (the agent
room, the engine room, the tools' public API, the command line and its typed settings, and the
worker boundary with no Any), must pass."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_passes_on_the_configured_rooms(tmp_path):
    # A cache of its own per run: a stale shared cache could hide an error another change made.
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("Success: no issues found")
