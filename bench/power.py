"""The duty cycle /power sets, measured: busy share of the wall time while decoding on the micro
model at each power level (the device computes only between rests, so busy share ~ N%).

busy = time spent outside DutyCycle's sleeps; the ratio busy/wall is printed per level with the
tokens/s, and the tokens are checked equal to full power's. Exit status 1 when a level's measured
share is more than 10 points off. Run: .venv/bin/python bench/power.py [--tokens 40]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ds4agent.engine import DutyCycle, generate, load_engine  # noqa: E402
from ds4agent.engine.sampler import Sampler  # noqa: E402
from ds4agent.testmodels.writer import make_test_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = load_engine(make_test_model(Path(tmp) / "micro.gguf", "micro", seed=5), ctx=256, chunk=16)
        prompt = list(range(1, 65))
        reference = None
        bad = False
        for power in (100, 75, 50, 25):
            slept = [0.0]

            def sleep(s: float, slept: list[float] = slept) -> None:
                slept[0] += s
                time.sleep(s)

            duty = DutyCycle(power, sleep=sleep)
            s = engine.new_session()
            t0 = time.monotonic()
            s.sync(prompt, duty=duty)
            out = list(generate(s, Sampler(temperature=0.0), max_tokens=args.tokens, duty=duty))
            wall = time.monotonic() - t0
            share = 100.0 * (wall - slept[0]) / wall
            reference = reference or out
            same = out == reference
            bad |= not same or abs(share - power) > 10
            print(f"power {power:3d}%: busy {share:5.1f}% of {wall:6.3f}s, "
                  f"{len(out) / wall:7.1f} tok/s, tokens {'same' if same else 'DIFFER'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
