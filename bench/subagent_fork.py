"""Time to first token of a subagent forked from the live KV state, against a fresh session's.

What the `task` tool does (agent/subagent.py): the parent session holds N tokens of conversation;
the subagent is a new Session rewound to the parent's snapshot (an O(1) reference to immutable
arrays) that prefills only its brief, then samples. Any agent that sends its context to a model
server instead pays a fresh prefill of the whole conversation for each subagent. Per context size:

  * fresh: a new session prefills N + brief tokens, then the first token is read (argmax of the
    logits): time to first token from nothing (the parent's own prefill of N, plus the brief);
  * fork: snapshot of the parent (holding N) -> new session -> rewind -> sync(N + brief) (only the
    brief is prefilled) -> first token;
  * memory: the exported state's bytes of the parent at N and of the fork after its brief: the
    fork's cost is one more session state (it shares the parent's arrays until they diverge, and
    its own rows are what its steps add).

Checked: the fork's logits equal the fresh session's bit for bit (same tokens, same chunk grid)
and the parent's state is unchanged by the fork. Target (exit status 1 below it): the fork's
first token at least 10x sooner than the fresh one at every size.

Model: a `make-test-model` config (default `small`: real vocabulary, width 512, 4 layers; `tiny`
for a quick run). Prefilling 32k tokens of `small` on a CPU takes minutes.
Run: .venv/bin/python bench/subagent_fork.py [--config small] [--sizes 4096,32768]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ds4agent.engine import load_engine
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import Tokenizer
from ds4agent.testmodels import make_test_model

TARGET = 10.0
BRIEF = ("You are now a subagent: a copy of the assistant above, forked to do one task for it.\n\nTask:\n"
         "find where the session files are written and summarise the format.")


def _payload_bytes(session) -> int:
    payload = session.export_state()
    total = np.asarray(payload.logits).nbytes
    for layer in payload.layers:
        total += sum(np.asarray(v).nbytes for v in vars(layer).values() if v is not None)
    return int(total)


def _conversation(tok: Tokenizer, n: int) -> list[int]:
    """n tokens of plausible text (the model's weights are random; only the count matters)."""
    words = "the session store writes each file atomically beside its index and a title trailer ".split()
    ids: list[int] = []
    i = 0
    while len(ids) < n:
        ids += tok.encode_untrusted(" ".join(words[(i + k) % len(words)] for k in range(64)))
        i += 7
    return ids[:n]


def measure(engine, tok: Tokenizer, n: int) -> dict[str, float]:
    prefix = _conversation(tok, n)
    brief = template.render(template.user_turn_pieces(BRIEF, think_mode="think"), tok)
    fresh = engine.new_session()
    t0 = time.perf_counter()
    fresh.sync(prefix)
    parent_state = fresh.snapshot()  # the parent: holding the conversation
    fresh.sync(prefix + brief)
    first_fresh = int(np.argmax(fresh.logits))
    t_fresh = time.perf_counter() - t0

    parent = engine.new_session()
    parent.rewind(parent_state)
    before = np.asarray(parent.export_state().layers[0].raw).copy()
    t0 = time.perf_counter()
    child = engine.new_session()
    child.rewind(parent.snapshot())
    prefilled = child.sync(prefix + brief)
    first_fork = int(np.argmax(child.logits))
    t_fork = time.perf_counter() - t0

    if prefilled != len(brief):
        raise SystemExit(f"the fork prefilled {prefilled} tokens, expected only the brief ({len(brief)})")
    if first_fork != first_fresh or not np.array_equal(child.logits, fresh.logits):
        raise SystemExit("the fork's logits differ from the fresh session's")
    if not np.array_equal(np.asarray(parent.export_state().layers[0].raw), before):
        raise SystemExit("the fork changed the parent's state")
    return {"tokens": n, "brief": len(brief), "fresh_s": t_fresh, "fork_s": t_fork,
            "parent_bytes": _payload_bytes(parent), "fork_bytes": _payload_bytes(child)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small", help="make-test-model config (small, tiny)")
    ap.add_argument("--sizes", default="4096,32768", help="context sizes in tokens, comma-separated")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    tok = Tokenizer.load()
    worst = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_test_model(Path(tmp) / f"{args.config}.gguf", config=args.config, seed=0)
        engine = load_engine(model, ctx=max(sizes) + 1024)
        print(f"model: {args.config} test config; device: {getattr(engine, 'device', None) and engine.device.label}")
        print(f"{'context':>8} {'brief':>6} {'fresh TTFT':>11} {'fork TTFT':>10} {'speed-up':>9} "
              f"{'parent state':>13} {'fork state':>11}")
        for n in sizes:
            r = measure(engine, tok, n)
            ratio = r["fresh_s"] / r["fork_s"]
            worst = min(worst, ratio)
            print(f"{n:>8} {r['brief']:>6} {r['fresh_s']:>10.3f}s {r['fork_s']:>9.3f}s {ratio:>8.0f}x "
                  f"{r['parent_bytes'] / 2**20:>10.1f} MiB {r['fork_bytes'] / 2**20:>8.1f} MiB", flush=True)
    ok = worst >= TARGET
    print(f"target: fork first token >= {TARGET:g}x sooner than a fresh prefill: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
