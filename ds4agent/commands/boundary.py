"""The error boundary of the file-writing subcommands (make-test-model, dump-logits, convert)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from ds4agent.engine.errors import EngineError, ModelFileError


def run_file_command(action: Callable[[], str], *, failure: str) -> int:
    """`action()` does the work and returns the success line for stdout. A bad model file
    (ModelFileError) is exit 1, any other readable EngineError exit 2 (bad input); an OSError is
    exit 1 with `failure` ("cannot write OUT") and the system's reason. One line on stderr, never
    a traceback."""
    try:
        line = action()
    except ModelFileError as err:
        # The model file itself is bad (truncated, a wrong tensor type or shape, a missing
        # tensor, or too big for this machine): exit 1, as a failed file operation.
        print(f"ds4agent: {err}", file=sys.stderr)
        return 1
    except EngineError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"ds4agent: {failure}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(line)
    return 0
