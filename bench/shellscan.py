"""Benchmark: the shell scan and the policy check on hostile commands, at 16 KiB and 64 KiB.

Linear work takes about 4x as long at four times the size; the script prints each shape's two
times and their ratio, and exits 1 when a ratio passes 8 (quadratic work would give about 16) or a
64 KiB command takes over a second.
Run: .venv/bin/python bench/shellscan.py
"""

from __future__ import annotations

import os
import sys
import time

from ds4agent.tools import ToolContext
from ds4agent.tools.permissions import PermissionPolicy

SHAPES = {
    "long word": lambda n: "echo " + "x" * n,
    "braces": lambda n: "echo " + "{a,b}" * (n // 5),
    "many commands": lambda n: "a;" * (n // 2),
    "sed w/": lambda n: "sed '" + "w/" * (n // 2) + "' f",
    "parentheses": lambda n: "(" * (n // 10) + "echo" + ")" * (n // 10),
    "quotes": lambda n: "echo " + "'a'\"b\"" * (n // 6),
}


def _time(command: str) -> float:
    policy, ctx = PermissionPolicy("ask"), ToolContext(cwd=os.getcwd())
    t0 = time.perf_counter()
    policy.check("bash", {"command": command}, ctx)
    return time.perf_counter() - t0


def main() -> int:
    bad = False
    for name, make in SHAPES.items():
        small, large = _time(make(16 * 1024)), _time(make(64 * 1000))
        ratio = large / max(small, 1e-6)
        flag = " <- too slow" if ratio > 8 or large > 1.0 else ""
        bad |= bool(flag)
        print(f"{name:14s} 16 KiB {small * 1e3:8.2f} ms   64 KB {large * 1e3:8.2f} ms   x{ratio:5.1f}{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
