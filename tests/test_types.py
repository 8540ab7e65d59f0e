"""The type check is part of the test command: mypy, as configured in pyproject.toml (the agent
room, the front ends, the engine room, the tools' public API, the command line and its typed
settings, and the worker boundary with no Any), must pass."""

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


def test_the_app_types_its_agent_as_the_facade_not_any():
    # mypy checks the app against the agent's type only if the app names it: with Any every call
    # on the agent would pass unchecked.
    import typing

    from ds4agent.agent.facade import Agent
    from ds4agent.ui import app

    hints = typing.get_type_hints(app.Ds4App.__init__, {**vars(app), "Agent": Agent})
    assert hints["agent"] == Agent | None
