"""`ds4agent info`: the model's facts (engine/info.py), then whether bash commands run in an OS sandbox."""

from __future__ import annotations

from typing import Any


def main(args: Any) -> int:
    from ds4agent.engine import info
    from ds4agent.tools.sandbox import availability

    code = info.main(args)
    if code == 0:
        print(availability().describe())
    return code
