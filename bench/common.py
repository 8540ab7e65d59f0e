"""What more than one benchmark measures the same way."""

from __future__ import annotations

import resource
import sys


def peak_rss() -> int:
    """This process's peak resident set, in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024
