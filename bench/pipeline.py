"""Pipeline cost: decode on 2 local ranks over MLX's ring backend vs one process, same model.

Config: the `small` test config (4 layers, width 512, the real vocab 129280; see engine_speed.py),
random weights from make_test_model. Both prefill the same prompt, then decode the same greedy
tokens; the pipeline's tokens and final logits are checked bit-identical to the single process.

Measured:
  * the median decode step of each, stepped alternately (one process, then the pipeline, token
    by token) so that load from other programs falls on both alike; the added time per token;
  * the bytes the protocol sends per token (command + token id to each worker rank, the residual
    R [1, hc, E] f32 across each boundary, one row of logits [V] f32 back to rank 0);
  * the ring's one-way cost per message size, from two extra local processes bouncing arrays
    through ring.Link (the path the pipeline uses: select wait, link thread, MLX send/recv).

Target (exit status 1 above it): added time per token <= 10% of the single-process step plus
2 ms per rank boundary. Then a projection for the real shape (DS4 Flash: hc 4 x width
4096, vocab 129280): the messages of one token at their real sizes, costed with the measured
per-message times (the software path, loopback), plus their bytes over 10 Gb Ethernet or
Thunderbolt IP at an assumed bandwidth (printed as an assumption).

Run: .venv/bin/python bench/pipeline.py [--config small] [--decode 64] [--prompt 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ds4agent.engine import load_engine
from ds4agent.engine.config import flash_config
from ds4agent.engine.pipeline import wire
from ds4agent.engine.pipeline.ring import Link, free_ports
from ds4agent.testmodels import make_test_model

ADDED_FRACTION = 0.10
PER_BOUNDARY_S = 0.002
_HEADER_BYTES = 4 * wire.HEADER  # one command header (int32s)
# Sustained TCP bandwidth of the links between two Macs, for the projection: assumptions.
LINKS = (("10 Gb Ethernet", 1.1e9), ("Thunderbolt IP", 2.5e9))


def bytes_per_token(config, ranks: int) -> dict[str, int]:
    """What one decode step sends, by kind (the protocol in engine/pipeline/wire.py)."""
    hops = ranks - 1  # commands and tokens go 0 -> 1 -> ... -> N-1; R crosses each boundary
    return {"command + token id": hops * (_HEADER_BYTES + 4),
            "activations R": hops * config.hc_count * config.dim * 4,
            "logits row back": config.vocab * 4}


def decode_alternately(sessions, prompt: list[int], n: int) -> tuple[list[list[float]], list[list[int]]]:
    """Greedy decode on every session, one token each in turn; (step times, tokens) per session."""
    times: list[list[float]] = [[] for _ in sessions]
    toks: list[list[int]] = [[] for _ in sessions]
    nxt = []
    for s in sessions:
        s.sync(prompt)
        nxt.append(int(np.argmax(s.logits)))
    for _ in range(n):
        for i, s in enumerate(sessions):
            t0 = time.perf_counter()
            logits = s.step(nxt[i])
            times[i].append(time.perf_counter() - t0)
            toks[i].append(nxt[i])
            nxt[i] = int(np.argmax(logits))
    return times, toks


def ping_pong(sizes: list[int], rounds: int) -> dict[int, float]:
    """One-way seconds per message of each size (bytes) between two fresh local ranks: the median
    round trip / 2. Fresh processes: MLX keeps one ring per process (this one has the pipeline's)."""
    ports = free_ports(2)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump([[f"127.0.0.1:{p}"] for p in ports], fh)
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "--ping-rank", str(r), "--ping-hostfile", fh.name,
                                   "--ping-sizes", ",".join(map(str, sizes)), "--ping-rounds", str(rounds)],
                                  stdout=subprocess.PIPE, text=True) for r in (0, 1)]
        out = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        Path(fh.name).unlink()
    return {int(k): v for k, v in json.loads(out[0]).items()}


def _ping_rank(rank: int, hostfile: str, sizes: list[int], rounds: int) -> None:
    import mlx.core as mx

    link = Link(rank, hostfile)
    other = 1 - rank
    result = {}
    for size in sizes:
        a = mx.zeros((size // 4,), dtype=mx.float32)
        mx.eval(a)
        rtts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            if rank == 0:
                link.send(a, other, "ping")
                link.recv(a.shape, mx.float32, other, "pong")
            else:
                link.recv(a.shape, mx.float32, other, "ping")
                link.send(a, other, "pong")
            rtts.append(time.perf_counter() - t0)
        result[size] = statistics.median(rtts) / 2
    if rank == 0:
        print(json.dumps(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--ping-rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ping-hostfile", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ping-sizes", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ping-rounds", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ping_rank is not None:
        _ping_rank(args.ping_rank, args.ping_hostfile, [int(x) for x in args.ping_sizes.split(",")],
                   args.ping_rounds)
        return 0

    ctx = args.prompt + args.decode + 8
    with tempfile.TemporaryDirectory() as tmp:
        path = make_test_model(Path(tmp) / f"{args.config}.gguf", args.config, seed=0)
        prompt = np.random.default_rng(1).integers(100, 120_000, args.prompt).tolist()
        one = load_engine(path, ctx=ctx)
        config = one.config
        two = load_engine(path, ctx=ctx, ranks=2)
        try:
            ranges = two.ranges
            s_one, s_two = one.new_session(), two.new_session()
            (t_one, t_two), (toks_one, toks_two) = decode_alternately([s_one, s_two], prompt, args.decode)
            same = toks_one == toks_two and np.array_equal(s_one.logits, s_two.logits)
        finally:
            two.close()
    if not same:
        print("FAIL: the pipeline decoded different tokens or logits than one process")
        return 1

    boundaries = len(ranges) - 1
    step_one = statistics.median(t_one[2:])
    step_two = statistics.median(t_two[2:])
    added = step_two - step_one
    budget = ADDED_FRACTION * step_one + PER_BOUNDARY_S * boundaries
    sent = bytes_per_token(config, len(ranges))
    print(f"config {args.config}: {config.n_layers} layers, width {config.dim}, vocab {config.vocab}; "
          f"ranks {', '.join(f'layers {a}-{b - 1}' for a, b in ranges)}; prompt {args.prompt}, "
          f"{args.decode} greedy steps (tokens and logits identical to one process)")
    print(f"decode step   one process {step_one * 1e3:8.2f} ms    2 ranks {step_two * 1e3:8.2f} ms")
    print(f"added/token   {added * 1e3:8.2f} ms  (target <= {budget * 1e3:.2f} ms: 10% of the step + "
          f"2 ms x {boundaries} boundary)")
    print("sent/token    " + ", ".join(f"{k} {v:,} B" for k, v in sent.items())
          + f"  = {sum(sent.values()):,} B")

    # Projection: one token's messages at the real sizes. Commands and token ids are tiny; R
    # crosses every boundary; the logits row comes back once (its size, V x 4, is already the
    # real one here: `small` has the real vocab).
    flash = flash_config()
    small_msg, r_flash, logits_b = 64, flash.hc_count * flash.dim * 4, flash.vocab * 4
    hop = ping_pong([small_msg, config.hc_count * config.dim * 4, r_flash, logits_b], rounds=100)
    print("ring one-way   " + ", ".join(f"{b:,} B {t * 1e3:.3f} ms" for b, t in hop.items())
          + "  (loopback, median)")
    print(f"\nprojection, DS4 Flash (hc {flash.hc_count} x width {flash.dim}, vocab {flash.vocab}), per token:")
    for ranks in (2, 3, 4):
        hops = ranks - 1
        real = sum(bytes_per_token(flash, ranks).values())
        soft = hops * (2 * hop[small_msg] + hop[r_flash]) + hop[logits_b]
        wire = "; ".join(f"{name} +{real / bw * 1e3:.2f} ms" for name, bw in LINKS)
        print(f"  {ranks} ranks ({hops} boundar{'y' if hops == 1 else 'ies'}): {real:,} B; "
              f"software path {soft * 1e3:.2f} ms; on the wire: {wire}")
    print("  (software path measured on this machine's loopback; link bandwidths assumed)")
    if added > budget:
        print(f"FAIL: {added * 1e3:.2f} ms added per token > {budget * 1e3:.2f} ms")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
