"""`ds4agent pull [NAME] [--dir DIR] [--token TOKEN]`: ds4's weights from the Hugging Face Hub.

The download is models/pull.py's; this prints: the notes and huggingface_hub's progress bars go
to stderr, the final path is the last line on stdout (absolute: ready to paste into --model).
Without NAME: the list of flavours, their sizes and RAM advice, and what is already here.
"""

from __future__ import annotations

import os
import sys

from ds4agent.models.errors import PullError
from ds4agent.models.pull import ProgressBar, listing, pull

from .settings import PullSettings


def _note(line: str) -> None:
    print(line, file=sys.stderr)


def _bar(desc: str, total: int, initial: int) -> ProgressBar:
    from huggingface_hub.utils import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                file=sys.stderr)


def _confirm(problem: str, yes: bool) -> bool:
    """Download anyway? --yes says so; on a terminal the user is asked; else no."""
    if yes:
        print(f"ds4agent: warning: {problem} (downloading anyway: --yes)", file=sys.stderr)
        return True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print(f"ds4agent: {problem}. Download it anyway? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def main(settings: PullSettings) -> int:
    if not settings.name:
        print(listing(settings.directory))
        return 0
    try:
        path = pull(settings.name, directory=settings.directory, token=settings.token, report=_note, progress=_bar,
                    confirm=lambda problem: _confirm(problem, settings.yes))
    except PullError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the disk filled up or the directory went away mid-download
        where = f" ({err.filename})" if err.filename else ""
        print(f"ds4agent: pull failed: {err.strerror or err}{where}; the bytes written so far are "
              "kept, run the same command again to continue", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nds4agent: pull interrupted; run the same command again to continue where it stopped",
              file=sys.stderr)
        return 130
    print(os.path.abspath(path))
    return 0
