"""`ds4agent convert SRC OUT`: the official DeepSeek-V4-Flash safetensors -> an MLX directory.

The conversion is the engine's (engine/convert.py); this prints its progress to stderr and the
result line to stdout.
"""

from __future__ import annotations

import sys

from ds4agent.engine.convert import convert

from .boundary import run_file_command
from .settings import ConvertSettings


def main(settings: ConvertSettings) -> int:
    def action() -> str:
        out = convert(settings.source, settings.out, progress=lambda m: print(f"converting {m}", file=sys.stderr))
        return f"wrote {out}"

    return run_file_command(action, failure=f"cannot convert into {settings.out}")
