"""The real DS4 Flash shape, measured: load, prefill, decode, memory, overhead.

    .venv/bin/python bench/flash_shape.py [--model FILE] [--experts q2|q4] [--ctx 32768]
                                          [--prefill 2048] [--decode 3]

Without --model it writes the Flash-shape test file (`ds4agent make-test-model --config flash`,
about 4 GiB) into a temporary directory and removes it afterwards. One run prints:

* load time to the first token (load_engine + one token);
* prefill tokens/s over --prefill tokens (one chunk on the absolute grid);
* decode ms/token (median of --decode steps);
* where a decoded token's time goes (model.Profile: each section evaluated on its own, its graph
  building in Python counted apart), plus sampling;
* peak resident memory (ru_maxrss) against the memory budget: 1.3 x the file's non-expert bytes
  + the routed-expert bytes actually touched (the file mapping's resident pages at the end) +
  the session state + 2 GiB;
* the decoded token's time against MLX's own cost for the same work: every matrix product and
  routed-expert product a decode step issues, with the same stored weights, timed standalone
  at the same shapes in this run. Target <= 1.5x.

Exits 1 when the peak exceeds the budget or the ratio exceeds 1.5. On this project's 2-core
Linux CPU a 2k-token prefill takes about three minutes with the fast CPU kernels (the default;
with DS4AGENT_KERNELS=reference, the exact path, well over an hour); a smaller --prefill gives a
quicker run, its figure read as tokens/s at that chunk size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import peak_rss  # noqa: E402
from ds4agent.engine import Engine, load_engine  # noqa: E402
from ds4agent.engine import model as model_mod  # noqa: E402
from ds4agent.engine.gguf import GGUFFile  # noqa: E402
from ds4agent.engine.sampler import Sampler  # noqa: E402

GiB = 1 << 30
RATIO_TARGET = 1.5


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of `path` (Linux smaps; 0 elsewhere)."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as fh:
            for line in fh:
                if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                    inside = line.rstrip().endswith(str(path))
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def non_expert_file_bytes(path: Path) -> int:
    with GGUFFile.open(path) as gf:
        return sum(ti.nbytes for ti in gf.tensors.values() if "_exps." not in ti.name)


def decode_products(engine: Engine, n_tokens: int):
    """(label, fn, x) for every matrix / routed-expert product one decode step runs, with the
    engine's own stored weights (model.py's call sites, in order)."""
    c, w = engine.config, engine.weights
    E, n, Q = c.dim, c.hc_count, c.q_lora_rank
    G = c.out_groups
    rng = np.random.default_rng(0)

    def vec(k: int, rows: int = 1) -> mx.array:
        return mx.array(rng.standard_normal((rows, k)).astype(np.float32))

    ids = mx.array(np.arange(c.n_experts_used, dtype=np.int32)[None, :] * 7 % c.n_experts)
    out = []
    for li, lw in enumerate(w.layers):
        a, f = lw.attn, lw.ffn
        r = c.ratios[li]
        for hc in (lw.hc_attn, lw.hc_ffn):
            out.append(("hc", hc.fn, vec(n * E)))
        out += [("attn", a.q_a, vec(E)), ("attn", a.q_b, vec(Q)), ("attn", a.kv, vec(E))]
        if a.out_a:  # reference and GPU sets: one product per group
            out += [("attn", a.out_a[g], vec(a.out_a[g].in_features)) for g in range(G)]
        else:  # the fast CPU set: every group in one call
            grouped_in = mx.array(rng.standard_normal((1, G, a.out_a_all.in_features)).astype(np.float32))
            out.append(("attn", a.out_a_all.grouped, grouped_in))
        out.append(("attn", a.out_b, vec(a.out_b.in_features)))
        if r:
            out += [("comp", a.compressor.kv, vec(E)), ("comp", a.compressor.gate, vec(E))]
        if r == 4:
            ix = a.indexer
            out += [("comp", ix.compressor.kv, vec(E)), ("comp", ix.compressor.gate, vec(E))]
            if n_tokens // 4 > c.indexer_top_k:  # the indexer query runs only once it prunes
                out += [("comp", ix.q_b, vec(Q)), ("comp", ix.proj, vec(E))]
        out.append(("router", f.gate_inp, vec(E)))
        out += [("shared", f.gate_shexp, vec(E)), ("shared", f.up_shexp, vec(E)),
                ("shared", f.down_shexp, vec(c.expert_ffn))]
        for ex, k in ((f.gate_exps, E), (f.up_exps, E), (f.down_exps, c.expert_ffn)):
            x = vec(k) if ex is not f.down_exps else mx.array(
                rng.standard_normal((1, c.n_experts_used, k)).astype(np.float32))
            out.append(("experts", (lambda e: (lambda v: e.gather_matmul(v, ids)))(ex), x))
    out += [("head", w.head.fn, vec(n * E)), ("head", w.output, vec(E))]
    return out


def time_products(products) -> dict[str, float]:
    """Each product standalone: one warm call, then the best of two timed calls (seconds)."""
    by: dict[str, float] = {}
    for label, fn, x in products:
        mx.eval(fn(x))
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            mx.eval(fn(x))
            best = min(best, time.perf_counter() - t)
        by[label] = by.get(label, 0.0) + best
    return by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--experts", choices=("q2", "q4"), default="q2")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=3)
    args = ap.parse_args()

    tmp = None
    path = args.model
    try:
        if path is None:
            tmp = Path(tempfile.mkdtemp(prefix="ds4flash-"))
            path = tmp / f"flash-{args.experts}.gguf"
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ds4agent.cli", "make-test-model", str(path), "--config",
                            "flash", "--experts", args.experts], check=True, stdout=subprocess.DEVNULL)
            print(f"test file      {path.stat().st_size / GiB:.2f} GiB written in {time.perf_counter() - t:.0f} s")
        return run(path, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def run(path: Path, args) -> int:
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    engine = load_engine(path, ctx=args.ctx)
    t_load = time.perf_counter() - t0
    V = engine.config.vocab
    s = engine.new_session()
    s.sync([int(rng.integers(V))])
    t_first = time.perf_counter() - t0
    print(f"load           {t_load:.1f} s; first token after {t_first:.1f} s")

    s.reset()
    prompt = [int(t) for t in rng.integers(0, V, size=args.prefill)]
    t = time.perf_counter()
    s.sync(prompt)
    t_prefill = time.perf_counter() - t
    print(f"prefill        {args.prefill} tokens in {t_prefill:.1f} s: {args.prefill / t_prefill:.2f} tokens/s")

    sampler = Sampler(temperature=1.0, seed=7)  # the agent's defaults (min-p 0.05)
    times = []
    tok = int(np.argmax(s.logits))
    for _ in range(args.decode):
        t = time.perf_counter()
        logits = s.step(tok)
        times.append(time.perf_counter() - t)
        tok = int(np.argmax(logits))
    decode = statistics.median(times)
    print(f"decode         {decode * 1e3:.0f} ms/token (median of {args.decode}: "
          + ", ".join(f"{x * 1e3:.0f}" for x in times) + ")")

    prof = model_mod.Profile()
    t = time.perf_counter()
    model_mod.forward(engine.weights, engine.config, s._state, [tok], last_only=True, profile=prof)
    t_prof = time.perf_counter() - t
    t = time.perf_counter()
    sampler.sample(s.logits)
    t_sample = time.perf_counter() - t
    # The routed-expert backend evaluates inside its call (tile by tile, per CPU worker): all of
    # its time is computation, so its "build" share is not Python graph building.
    evaluates_inside = {"routed experts"}
    total = {k: prof.run[k] + (prof.build[k] if k in evaluates_inside else 0.0) for k in prof.run}
    graph = sum(v for k, v in prof.build.items() if k not in evaluates_inside)
    print(f"where a decoded token's time goes (profiled step {t_prof * 1e3:.0f} ms, each section evaluated "
          "on its own):")
    for name in sorted(total, key=lambda k: -total[k]):
        print(f"  {name:<22}{total[name] * 1e3:9.1f} ms")
    print(f"  {'sampling':<22}{t_sample * 1e3:9.1f} ms")
    print(f"  {'python graph building':<22}{graph * 1e3:9.1f} ms")

    peak = peak_rss()
    touched = mapped_rss(path)
    if sys.platform != "linux":  # no smaps: every routed-expert byte of the file counts as touched
        from ds4agent.engine.memory import memory_plan

        with GGUFFile.open(path) as gf:
            touched = memory_plan(gf.tensors.values(), engine.config, args.ctx).experts
    state_bytes = sum(a.nbytes for a in s._state.arrays())
    non_expert = non_expert_file_bytes(path)
    budget = int(1.3 * non_expert) + touched + state_bytes + 2 * GiB
    mem_ok = peak <= budget
    print(f"peak RSS       {peak / GiB:.2f} GiB vs budget {budget / GiB:.2f} GiB = 1.3 x {non_expert / GiB:.2f} "
          f"GiB non-expert + {touched / GiB:.2f} GiB experts touched + {state_bytes / 2**20:.1f} MiB state "
          f"+ 2 GiB  [{'ok' if mem_ok else 'OVER'}]")

    products = decode_products(engine, len(s.tokens))
    by = time_products(products)
    base = sum(by.values())
    ratio = decode / base
    print(f"MLX's own cost of the same {len(products)} products standalone: {base * 1e3:.0f} ms ("
          + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])) + ")")
    ok = ratio <= RATIO_TARGET
    print(f"decode / MLX   {ratio:.2f}x (target <= {RATIO_TARGET}x)  [{'ok' if ok else 'SLOW'}]")
    return 0 if (ok and mem_ok) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
