"""How the user runs this program, for the hints it prints (`… --resume ID`, the no-model
message): each must work when typed as printed.

One fact that the models room (the no-model message) and the UI (the exit line) both need, so it
lives on the ground floor like fsutil. Pure standard library.

    program() -> "ds4agent" when that name on PATH runs this very program (the venv activated,
                 or a pipx/system install), else the path it was started by
                 (".venv/bin/ds4agent": the Quick start without `activate`)
"""

from __future__ import annotations

import os
import shutil
import sys

NAME = "ds4agent"


def program(argv0: str | None = None, path: str | None = None) -> str:
    """The command to print in a hint. `argv0` and `path` default to this process's sys.argv[0]
    and $PATH (tests pass their own). `python -m ds4agent.cli` keeps the plain name: the module
    path is no command, and whoever runs it that way knows how to run it again."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != NAME:
        return NAME
    found = shutil.which(NAME, path=path)
    try:
        if found is not None and os.path.samefile(found, argv0):
            return NAME
    except OSError:  # argv0 no longer there, or not a file: say what was run
        pass
    return argv0 if os.sep in argv0 else NAME
