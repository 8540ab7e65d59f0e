"""Agent loop overhead per generated token, with an engine that costs nothing.

A scripted engine (tests/support/scripted_engine.py) "generates" a ~20,000-token turn instantly:
five rounds of reasoning + visible text, four of them ending in a DSML tool call with a long
string payload, the last one a plain answer. An oracle sampler returns the scripted token
without scanning the logits (argmax over 129,280 logits is the sampler's cost, not the loop's).
What remains per token is the agent's own work: the greedy classifier, the stream parser,
event objects on the thread-safe queue, the transcript append, the status rate limiter, and the
engine double's O(1) bookkeeping (measured separately and subtracted).

Measured side by side in one run:
  * loop: the worker's wall time for the turn (TurnEnded.seconds) / generated tokens;
  * engine double: stepping a bare scripted session through the same tokens;
  * bare decode: Tokenizer.token_bytes for every token (the least any loop must do per token).

Target: loop overhead < 20 us/token, the median of --repeats turns (exit status 1 above).
Run: .venv/bin/python bench/loop_overhead.py
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ds4agent.agent import events as ev  # noqa: E402
from ds4agent.protocol.tokenizer import EOS, Tokenizer  # noqa: E402
from tests.support.agent_harness import AgentHarness  # noqa: E402
from tests.support.scripted_engine import ScriptedEngine, reply  # noqa: E402

TARGET_US = 20.0


class OracleSampler:
    """Returns the token the scripted session offers (its one-hot logit), in O(1)."""

    def __init__(self, worker) -> None:
        self.worker = worker

    key = None  # the decode generator evaluates the key with each token; none here

    def draw(self, logits, *, greedy: bool = False):
        import mlx.core as mx

        return mx.array(self.worker.session._hot, dtype=mx.int32)

    def reseed(self, seed=None) -> None:
        pass


class EchoTool:
    name = "note"
    description = "Store a note."
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    mutates = False

    def run(self, args, ctx):
        from ds4agent.tools import Observation

        return Observation(f"stored {len(args.get('text', ''))} chars\n")


def prose(n_tokens: int, seed: int) -> str:
    words = ["the", "parser", "reads", "a", "token", "and", "then", "checks", "state", "of",
             "block", "value", "code", "line", "file", "test", "runs", "fast", "with", "care"]
    out = []
    for i in range(n_tokens):
        out.append(words[(i * 7 + seed) % len(words)])
        if i % 17 == 16:
            out.append("\n")
    return " ".join(out)


def build_script(total: int) -> list[list[int]]:
    rounds = 5
    per = total // rounds
    script = []
    for r in range(rounds - 1):
        payload = prose(per // 4, r + 100)
        script.append(reply(prose(per // 3, r), think=prose(per // 3, r + 50),
                            calls=[("note", {"text": payload})]))
    script.append(reply(prose(per // 2, 9), think=prose(per // 2, 10)))
    return script


def one_turn(tok: Tokenizer, script: list[list[int]], all_tokens: list[int]) -> dict:
    """One scripted turn through the agent, then the engine double and the bare decode over the
    same tokens: the three times the overhead is computed from (None where the turn failed)."""
    tmp = Path(tempfile.mkdtemp(prefix="ds4agent-bench-"))
    try:
        engine = ScriptedEngine(script, ctx=200_000, chunk=4096)
        h = AgentHarness.build(tmp, engine=engine, tools=[EchoTool()], seed=1)
        h.worker.sampler = OracleSampler(h.worker)
        h.agent.submit("Please take notes.")
        # A UI drains the queue concurrently; do the same (cheaply) so the queue does not grow.
        end = None
        n_events = 0
        deadline = time.monotonic() + 300
        while end is None and time.monotonic() < deadline:
            for e in h.agent.poll_events():
                n_events += 1
                if isinstance(e, ev.TurnEnded):
                    end = e
            time.sleep(0.01)
        h.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if end is None or end.reason != "done":
        print(f"turn did not finish cleanly: {end}", file=sys.stderr)
        return {}

    # The engine double alone, over the same tokens.
    bare = ScriptedEngine([all_tokens], ctx=200_000).new_session()
    bare.sync([0, 128804, 128821])
    t0 = time.perf_counter()
    for t in all_tokens:
        bare.step(t)
    double_s = time.perf_counter() - t0

    # Bare tokenizer decode of the same tokens.
    tb = tok.token_bytes
    t0 = time.perf_counter()
    for t in all_tokens:
        tb(t)
    decode_s = time.perf_counter() - t0
    n = len(all_tokens)
    return {"generated": end.generated, "loop_s": end.seconds, "double_s": double_s, "decode_s": decode_s,
            "events": n_events, "overhead_us": (end.seconds - double_s * end.generated / n) / end.generated * 1e6,
            "bare": bare}


def decode_seam_us(all_tokens: list[int]) -> float:
    """engine.generate alone over a fresh double, same tokens, the oracle's draw: what the decode
    seam (sampling dispatch, the double's lazy logits, the step hand-off) costs per token without
    the agent. The loop overhead above counts it (only the double's `step` is subtracted): this
    line says how much of the figure is the engine's side of the seam."""
    import mlx.core as mx

    from ds4agent.engine import generate

    session = ScriptedEngine([all_tokens], ctx=200_000).new_session()
    session.sync([0, 128804, 128821])

    class Oracle:
        key = None

        def draw(self, logits, *, greedy: bool = False):
            return mx.array(session._hot, dtype=mx.int32)

    n = 0
    t0 = time.perf_counter()
    for _ in generate(session, Oracle(), max_tokens=len(all_tokens) - 1, greedy=lambda: False,
                      forced=lambda: None):
        n += 1
    return (time.perf_counter() - t0) / max(n, 1) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=20_000, help="approximate tokens generated in the turn")
    p.add_argument("--repeats", type=int, default=5,
                   help="turns measured; the verdict is on their median (one turn is under a second, "
                        "and a shared machine's jitter moves a single figure by +-30 %%)")
    args = p.parse_args()
    tok = Tokenizer.load()
    script = build_script(args.tokens)
    all_tokens = [t for r in script for t in r]
    if EOS not in all_tokens:
        print("script has no EOS", file=sys.stderr)
        return 2
    turns = []
    for _ in range(max(1, args.repeats)):
        turn = one_turn(tok, script, all_tokens)
        if not turn:
            return 2
        turns.append(turn)
    turns.sort(key=lambda t: t["overhead_us"])
    mid = turns[len(turns) // 2]
    n = len(all_tokens)
    generated, loop_s, double_s, decode_s = mid["generated"], mid["loop_s"], mid["double_s"], mid["decode_s"]
    per_tok_us = mid["overhead_us"]
    decode_us = decode_s / n * 1e6

    seam_us = decode_seam_us(all_tokens)
    # For scale (not part of the loop's overhead): the real sampler on a full logit row.
    from ds4agent.engine import Sampler

    row = mid["bare"].logits.copy()
    sampler = Sampler(seed=1)
    t0 = time.perf_counter()
    for _ in range(200):
        sampler.sample(row, greedy=True)
    greedy_us = (time.perf_counter() - t0) / 200 * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        sampler.sample(row)
    sample_us = (time.perf_counter() - t0) / 200 * 1e6

    print(f"tokens generated: {generated} in 5 rounds (4 tool calls), events: {mid['events']}")
    print(f"loop overhead of each of {len(turns)} turns: "
          + ", ".join(f"{t['overhead_us']:.2f}" for t in turns) + " us/token (the median below)")
    print(f"agent loop:        {generated / loop_s:12,.0f} tok/s  ({loop_s * 1e6 / generated:6.2f} us/token, "
          f"engine double included)")
    print(f"engine double:     {n / double_s:12,.0f} tok/s  ({double_s * 1e6 / n:6.2f} us/token)")
    print(f"bare decode:       {n / decode_s:12,.0f} tok/s  ({decode_us:6.2f} us/token)")
    print(f"loop overhead:     {per_tok_us:6.2f} us/token  = {per_tok_us / decode_us:5.1f}x bare decode "
          f"(median of {len(turns)} turns; target < {TARGET_US:.0f} us/token)")
    double_us = double_s * 1e6 / n
    print(f"  of which the engine's decode seam (engine.generate over the double, the oracle sampler; "
          f"measured alone): {seam_us - double_us:.2f} us/token; the agent's own work: "
          f"{per_tok_us - (seam_us - double_us):.2f} us/token")
    print(f"for scale, the real sampler over {row.size:,} logits: argmax {greedy_us:.1f} us, "
          f"min-p sample {sample_us:.1f} us (model-side cost, not counted above)")
    return 0 if per_tok_us < TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
