"""Rewind latency against re-prefilling the same prefix, on the `small` test config.

A session prefills a 4,096-token prefix (one chunk on the fixed grid: ctx 8,192 puts the cap at
4,096), the SnapshotStore keeps that state, and the session moves on (64 more tokens). Then:

  * re-prefill: the fresh session's sync of that prefix (what going back costs without a
    snapshot, and what other agents pay on their next request); once, it takes a minute on CPU;
  * rewind: `store.restore(session, prefix)` + `session.sync(prefix)` (what /rewind runs; it must
    prefill 0 tokens), median of 10.

Also printed: the packed snapshot's bytes against the live state's. The rewound state is checked
to be the prefilled one, array for array. Target (exit status 1 below it): rewind >= 100x faster.
Run: .venv/bin/python bench/rewind.py [--tokens 4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ds4agent.engine import SnapshotStore, load_engine
from ds4agent.testmodels import make_test_model

TARGET = 100.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args(argv)
    n = args.tokens
    with tempfile.TemporaryDirectory() as tmp:
        model = make_test_model(Path(tmp) / "small.gguf", config="small", seed=0)
        engine = load_engine(model, ctx=2 * n)
        rng = np.random.default_rng(0)
        ids = [int(t) for t in rng.integers(0, engine.config.vocab, size=n + 64)]
        prefix = ids[:n]

        s = engine.new_session()
        t0 = time.perf_counter()
        assert s.sync(prefix) == n
        t_prefill = time.perf_counter() - t0
        reference = s.snapshot().state
        store = SnapshotStore(engine)
        store.keep(s)
        s.sync(ids)  # the conversation went on

        def rewind() -> None:
            s.sync(ids)  # back to the later point (no work after the first call: prefix reuse)
            t0 = time.perf_counter()
            store.restore(s, prefix)
            assert s.sync(prefix) == 0
            rewind.times.append(time.perf_counter() - t0)

        rewind.times = []
        for _ in range(10):
            # sync(ids) after a rewind re-prefills 64 tokens: kept out of the measured time.
            rewind()
        t_rewind = statistics.median(rewind.times)
        state = s.snapshot().state
        for a, b in zip(state.arrays(), reference.arrays(), strict=True):
            assert np.array_equal(np.array(a), np.array(b)), "rewound state differs"
    live = sum(a.nbytes for a in reference.arrays())
    packed = store.nbytes()
    ratio = t_prefill / t_rewind
    print(f"small config, {n} tokens: re-prefill {t_prefill * 1e3:.1f} ms, rewind {t_rewind * 1e3:.2f} ms "
          f"-> {ratio:.0f}x faster (target >= {TARGET:.0f}x)")
    print(f"snapshot: {packed / 1e6:.2f} MB packed for a {live / 1e6:.2f} MB live state")
    if ratio < TARGET:
        print(f"FAIL: rewind is only {ratio:.0f}x faster than re-prefill", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
