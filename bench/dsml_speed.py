"""Benchmark: per-token cost of the DSML parser + greedy classifier on a realistic round.

Prints the parser's cost per token next to a baseline (the loop's unavoidable work: fetch the token's bytes
and decode them), and the ratio of the agent's per-token budget (20 us of total loop overhead) to the
parser's cost. Exits 1 when the parser alone exceeds the budget (ratio < 1).
Run: .venv/bin/python bench/dsml_speed.py
"""

from __future__ import annotations

import sys
import time

from ds4agent.protocol.dsml import DsmlParser
from ds4agent.protocol.template import assistant_output_pieces, render
from ds4agent.protocol.tokenizer import Tokenizer

BUDGET_US = 20.0


def main() -> int:
    tok = Tokenizer.load()
    code = "def f(x):\n    return [i for i in range(x) if i % 2 == 0]  # <comment> & </b>\n" * 40
    calls = [("write", {"path": "src/x.py", "content": code}),
             ("bash", {"command": "pytest -q tests/ && echo ok", "timeout": 120, "env": {"A": "1", "B": [1, 2]}})]
    ids = render(assistant_output_pieces(reasoning="Let me think about <this> carefully. " * 100,
                                         text="Here is the change:\n" + "Some <b>text</b> with `x < y`.\n" * 30,
                                         calls=calls, think_mode="think", eos=False), tok)
    token_bytes = tok.token_bytes

    def baseline() -> float:
        t = time.perf_counter()
        for i in ids:
            token_bytes(i).decode("utf-8", "replace")
        return time.perf_counter() - t

    def parser() -> float:
        t = time.perf_counter()
        p = DsmlParser(thinking=True, tokenizer=tok)
        for i in ids:
            p.feed(i, token_bytes(i))
            _ = p.in_syntax
        assert p.outcome.kind == "done"
        return time.perf_counter() - t

    base = min(baseline() for _ in range(5)) / len(ids) * 1e6
    cost = min(parser() for _ in range(5)) / len(ids) * 1e6
    ratio = BUDGET_US / cost
    print(f"tokens={len(ids)} baseline={base:.2f} us/token parser={cost:.2f} us/token "
          f"budget={BUDGET_US:.0f} us/token ratio={ratio:.2f} (target >= 1)")
    return 0 if ratio >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
