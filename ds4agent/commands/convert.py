"""`ds4agent convert SRC OUT`: the official DeepSeek-V4-Flash safetensors -> an MLX directory.

The conversion is the engine's (engine/convert.py); this prints its progress to stderr and the
result line to stdout.
"""

from __future__ import annotations

import argparse
import sys

from ds4agent.engine.convert import convert

from .boundary import run_file_command


def main(args: argparse.Namespace) -> int:
    def action() -> str:
        out = convert(args.source, args.out, progress=lambda m: print(f"converting {m}", file=sys.stderr))
        return f"wrote {out}"

    return run_file_command(action, failure=f"cannot convert into {args.out}")
