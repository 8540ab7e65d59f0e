"""Decode shaped for the GPU: today's step loop against the decode generator, side by side.

Model: the `small` test config (4 layers, the real 129,280-token vocabulary) with ds4's q2
routed-expert layout (IQ2_XXS gate/up, Q2_K down: real GGUF blocks, as in the Flash file), or
the Flash test file with `--flash PATH` (made by `ds4agent make-test-model --config flash`).

"today" = Session.step on the CPU kernel set with the logits sampled on the host (the decode
before the generator); "now" = engine.generate on the GPU kernel set (DS4AGENT_KERNELS=gpu, the
default on a GPU; on a CPU-only machine it runs on the CPU device, which is how CI checks it).
The other two cells (generator on the CPU kernel set, step loop on the GPU one) are printed too,
so each change's share is visible. Measured in one run:

  * device->host reads per decoded token (engine/hostread counts every one);
  * MLX primitives per decoded token and per layer: the nodes of one token's graph (forward and,
    for the generator, the sampler's graph) counted in `mx.export_to_dot` output; where a host
    read cuts the token into pieces, each piece is exported as the read happens and counted.
    The count is what is dispatched: an mx.compile'd function shows in the export as its fused
    kernels (one node each) plus every op it could not fuse (reductions, matmuls, gathers,
    slices), and mx.fast kernels that have no CPU implementation show as the ops they fall back
    to on the CPU device;
  * overlap: the generator with a consumer that spends as long per token as building a token's
    graph takes (it sleeps: on a small machine a spinning consumer would steal the cores the
    CPU device computes on), against the same decode with an idle consumer;
  * tokens/s of the step loop and of the generator, greedy, same tokens (checked).

Targets (exit status 1 when one is missed): reads per token on the GPU kernel set <= 1;
primitives per token at least 30% fewer than today; overlap wall time within 1.15x of idle;
identical tokens.

Run: .venv/bin/python bench/decode.py [--tokens 32] [--prompt 64] [--repeats 5] [--flash PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import peak_rss  # noqa: E402
from ds4agent.engine import generate, hostread, load_engine  # noqa: E402
from ds4agent.engine.config import test_config  # noqa: E402
from ds4agent.engine.device import forced_kernel_set  # noqa: E402
from ds4agent.engine.model import build  # noqa: E402
from ds4agent.engine.sampler import Sampler  # noqa: E402

READS_TARGET = 1.0
PRIMITIVES_TARGET = 0.70  # now / today
OVERLAP_TARGET = 1.15


def _count_dot(arrays) -> int:
    arrays = [a for a in arrays if isinstance(a, mx.array)]
    if not arrays:
        return 0
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *arrays)
        return len(re.findall(r"shape=rectangle", Path(f.name).read_text()))


def primitives_per_token(engine, session, *, with_sampler: bool) -> int:
    """Nodes of one decoded token's graph (pieces cut by host reads included)."""
    counted = [0]

    def on_read(a):
        counted[0] += _count_dot([a])

    state = session.snapshot().state
    hostread.set_read_hook(on_read)
    try:
        if with_sampler:
            tok = Sampler(temperature=1.0, seed=0).draw(state.logits)
        else:
            tok = mx.array(np.array([int(np.argmax(session.logits))], np.int32))
        logits, layers = build(engine.weights, engine.config, state, tok.reshape(1).astype(mx.int32),
                               last_only=True)
        outs = [logits, tok] + [a for lay in layers for a in lay.arrays()]
        counted[0] += _count_dot(outs)
    finally:
        hostread.set_read_hook(None)
    # The graph is dropped unevaluated: counting needs only its nodes (at the Flash shape on a
    # CPU, evaluating the GPU kernel set's token costs about a minute).
    return counted[0]


def graph_build_seconds(engine, session, reps: int = 5) -> float:
    """Python time to build one decode step's graph (nothing evaluated inside: the generator's
    case on the GPU kernel set), median of `reps` (the first build also traces the compiled
    kernels). Each graph is dropped unevaluated, as the time to build it is all that is asked;
    on the CPU kernel set the host reads inside evaluate the layers up to each read anyway."""
    state = session.snapshot().state
    tok = Sampler(temperature=0.0).draw(state.logits)
    mx.eval(tok)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        build(engine.weights, engine.config, state, tok.reshape(1), last_only=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def resumed(engine, prefilled):
    """A fresh session holding the prompt: rewound to the one prefilled snapshot (O(1)), so every
    run starts from the same state without prefilling again (at the Flash shape on a CPU, a
    prefill costs as much as several decoded tokens)."""
    s = engine.new_session()
    s.rewind(prefilled)
    return s


def step_loop(engine, prefilled, n):
    s = resumed(engine, prefilled)
    sampler = Sampler(temperature=0.0)
    out = [sampler.sample(s.logits)]
    before = hostread.reads()
    t0 = time.perf_counter()
    for _ in range(n):
        out.append(sampler.sample(s.step(out[-1])))
    dt = time.perf_counter() - t0
    return out, n / dt, (hostread.reads() - before) / n, s


def generator(engine, prefilled, n, consumer_s: float = 0.0):
    s = resumed(engine, prefilled)
    gen = generate(s, Sampler(temperature=0.0), max_tokens=n + 2)
    out = [next(gen)]
    before = hostread.reads()
    t0 = time.perf_counter()
    for _ in range(n):
        out.append(next(gen))
        if consumer_s:
            time.sleep(consumer_s)  # the consumer's work on this token (parse, events)
    dt = time.perf_counter() - t0
    gen.close()
    return out, n / dt, (hostread.reads() - before) / n, s


def progress(kernel_set: str, what: str, value) -> None:
    """One figure as soon as it is measured: a Flash-shape run on a CPU takes many minutes, and
    a run cut short should still have shown what it measured."""
    print(f"  [{kernel_set}] {what}: {value}", file=sys.stderr, flush=True)


def run_cell(path, ctx, prompt, n, kernel_set, repeats):
    with forced_kernel_set(kernel_set):
        t0 = time.perf_counter()
        engine = load_engine(path, ctx=ctx)
        progress(kernel_set, "load (s)", f"{time.perf_counter() - t0:.1f}")
        ref = engine.new_session()
        t0 = time.perf_counter()
        ref.sync(prompt)
        prefilled = ref.snapshot()
        progress(kernel_set, "prefill (s)", f"{time.perf_counter() - t0:.1f}")
        row = {"kernels": kernel_set, "layers": engine.config.n_layers}
        row["prims_step"] = primitives_per_token(engine, ref, with_sampler=False)
        progress(kernel_set, "primitives / token, step loop", row["prims_step"])
        row["prims_gen"] = primitives_per_token(engine, ref, with_sampler=True)
        progress(kernel_set, "primitives / token, generator", row["prims_gen"])
        row["build_s"] = graph_build_seconds(engine, ref)
        progress(kernel_set, "graph building / token (ms)", f"{row['build_s'] * 1e3:.1f}")
        step_loop(engine, prefilled, 1)  # warm-up (compiled kernels, caches)
        row["step_tokens"], row["step_tps"], row["step_reads"], _ = step_loop(engine, prefilled, n)
        progress(kernel_set, "step loop tokens/s, reads/token", f"{row['step_tps']:.3f}, {row['step_reads']:.2f}")
        row["gen_tokens"], row["gen_tps"], row["gen_reads"], _ = generator(engine, prefilled, n)
        progress(kernel_set, "generator tokens/s, reads/token", f"{row['gen_tps']:.3f}, {row['gen_reads']:.2f}")
        # Wall per token with a busy consumer over the same with an idle one, as pairs run back
        # to back (which of the two goes first alternates) and the median pair taken, so a burst
        # of load from elsewhere on the machine hits both sides of a pair alike. Every run must
        # decode the same tokens.
        ratios = []
        row["overlap_same_tokens"] = True
        for i in range(repeats):
            runs = {}
            for busy in ((True, False) if i % 2 == 0 else (False, True)):
                runs[busy] = generator(engine, prefilled, n, consumer_s=row["build_s"] if busy else 0.0)
            for toks, _, _, _ in runs.values():
                row["overlap_same_tokens"] = row["overlap_same_tokens"] and toks == row["gen_tokens"]
            ratios.append(runs[False][1] / runs[True][1])
            progress(kernel_set, f"overlap pair {i + 1}", f"{ratios[-1]:.3f}")
        row["overlap"] = statistics.median(ratios)
    return row


def measure_in_child(path: Path, args, kernel_set: str) -> dict:
    """One kernel set's cell in a process of its own. At the Flash shape a loaded engine is
    over 10 GiB, and what one kernel set leaves behind (MLX's buffer cache, arrays kept by
    compiled functions) must not be counted in, or crowd out, the other's; it also gives each
    set its own peak RSS."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", kernel_set, "--model", str(path),
               "--cell-out", out.name, "--tokens", str(args.tokens), "--prompt", str(args.prompt),
               "--repeats", str(args.repeats)]
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            raise SystemExit(f"the {kernel_set} kernel set's measurement failed (exit status {rc})")
        return json.loads(Path(out.name).read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="decoded tokens per measurement")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens before decoding")
    ap.add_argument("--repeats", type=int, default=5, help="busy/idle consumer pairs for the overlap figure")
    ap.add_argument("--flash", type=Path, help="the Flash test file instead of the small model")
    # Internal: measure one kernel set on --model and write its row to --cell-out (JSON).
    ap.add_argument("--cell", choices=("reference", "cpu", "gpu"), help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cell-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cell is not None:
        ctx = max(256, args.prompt + args.tokens + 8)
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, 50_000, size=args.prompt)]
        row = run_cell(args.model, ctx, prompt, args.tokens, args.cell, args.repeats)
        row["peak_rss"] = peak_rss()
        args.cell_out.write_text(json.dumps(row))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.flash is not None:
            path = args.flash
        else:
            from tests.weights.quantmodel import Q2_TYPES, write_quant_model

            path = write_quant_model(Path(tmp) / "small-q2.gguf", test_config("small"), Q2_TYPES, seed=1)
        # "Today" is the exact reference set, the graph the GPU set is judged against (the fast CPU
        # set runs its products outside MLX, so its primitive count says nothing about a GPU).
        cpu = measure_in_child(path, args, "reference")
        gpu = measure_in_child(path, args, "gpu")

    L = cpu["layers"]
    print(f"decode: {'Flash file' if args.flash else 'small q2'} ({L} layers), device {mx.default_device()}, "
          f"{args.prompt}-token prompt, {args.tokens} greedy tokens per run")
    print(f"{'':34s}{'today: step loop':>18s}{'step loop':>12s}{'generator':>12s}{'now: generator':>16s}")
    print(f"{'kernel set':34s}{'reference':>18s}{'gpu':>12s}{'reference':>12s}{'gpu':>16s}")
    cells = [(cpu, "step"), (gpu, "step"), (cpu, "gen"), (gpu, "gen")]

    def line(name, fmt, key):
        vals = [fmt.format(row[f"{kind}_{key}"]) for row, kind in cells]
        print(f"{name:34s}{vals[0]:>18s}{vals[1]:>12s}{vals[2]:>12s}{vals[3]:>16s}")

    line("device->host reads / token", "{:.2f}", "reads")
    print(f"{'MLX primitives / token':34s}{cpu['prims_step']:>18d}{gpu['prims_step']:>12d}"
          f"{cpu['prims_gen']:>12d}{gpu['prims_gen']:>16d}")
    print(f"{'MLX primitives / layer':34s}{cpu['prims_step'] / L:>18.0f}{gpu['prims_step'] / L:>12.0f}"
          f"{cpu['prims_gen'] / L:>12.0f}{gpu['prims_gen'] / L:>16.0f}")
    line("tokens / s", "{:.3g}", "tps")  # 3 figures: the Flash shape on a CPU is ~0.1
    print(f"{'graph building / token (ms)':34s}{cpu['build_s'] * 1e3:>18.1f}{gpu['build_s'] * 1e3:>12.1f}"
          f"{cpu['build_s'] * 1e3:>12.1f}{gpu['build_s'] * 1e3:>16.1f}")
    print(f"{'overlap: busy / idle consumer':34s}{'':>18s}{'':>12s}{cpu['overlap']:>12.2f}{gpu['overlap']:>16.2f}")
    print("(the reference kernel set reads expert ids back inside a token, so its graph building includes\n"
          " evaluating the layers up to each read: its consumer sleeps about a whole token's compute,\n"
          " which it cannot overlap; the target is judged on the gpu kernel set)")

    failures = []
    if gpu["gen_reads"] > READS_TARGET:
        failures.append(f"reads per token on the GPU kernel set {gpu['gen_reads']:.2f} > {READS_TARGET}")
    ratio = gpu["prims_gen"] / cpu["prims_step"]
    if ratio > PRIMITIVES_TARGET:
        failures.append(f"primitives per token {gpu['prims_gen']} vs today's {cpu['prims_step']}: "
                        f"{1 - ratio:.0%} fewer, target {1 - PRIMITIVES_TARGET:.0%}")
    if gpu["overlap"] > OVERLAP_TARGET:
        failures.append(f"overlap {gpu['overlap']:.2f}x > {OVERLAP_TARGET}x")
    for row in (cpu, gpu):
        if not row["overlap_same_tokens"]:
            failures.append(f"{row['kernels']} kernel set: the overlap runs decoded different tokens")
        if row["step_tokens"] != row["gen_tokens"]:
            failures.append(f"{row['kernels']} kernel set: the generator's tokens differ from the step loop's")
    print(f"{'peak RSS (GiB)':34s}{cpu['peak_rss'] / 2**30:>18.2f}{gpu['peak_rss'] / 2**30:>12.2f}"
          f"{cpu['peak_rss'] / 2**30:>12.2f}{gpu['peak_rss'] / 2**30:>16.2f}")
    print(f"primitives: {1 - ratio:.0%} fewer than today; tokens identical: "
          f"{all(r['step_tokens'] == r['gen_tokens'] for r in (cpu, gpu))}")
    for f in failures:
        print(f"BELOW TARGET: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
