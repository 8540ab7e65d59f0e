"""Benchmark: one routed expert (4096 -> 2048) mat-vec with 2/4-bit GGUF blocks.

For IQ2_XXS, Q2_K and Q4_K, measured side by side in one run on this machine:
  * quant:  `ExpertWeights.gather_matmul` of the backend `quant_experts` picks here (the Metal
            kernels where a Metal GPU exists, else the portable MLX backend, which dequantises the
            selected expert's blocks with MLX ops and multiplies in f32);
  * f16:    the same product with the expert's dequantised weight stored as F16 (`x @ W.T`).
Prints time per mat-vec, the ratio quant/f16 and the effective GB/s of weight bytes read (the
quantised block bytes for `quant`, 2 bytes per weight for `f16`).

Target: the quantised path reads 4-8x fewer bytes, so a memory-bound kernel should be at most as
slow as F16; the script exits non-zero when a ratio exceeds --max-ratio (default: 1.5 on Metal;
no target for the portable backend, which materialises f32 weights by design and is the
correctness fallback; pass --max-ratio to enforce one).

    python bench/experts.py [--iters N] [--backend auto|portable|metal] [--max-ratio R]
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.experts import quant_experts

D_IN, D_OUT = 4096, 2048
TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K]
F16_FIELDS = {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}


def _blocks(rng, qtype: int, n_blocks: int) -> np.ndarray:
    size = quant.BLOCK_INFO[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = (rng.uniform(0.5, 1.0, n_blocks) * 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def _time(fn, iters: int) -> float:
    for _ in range(3):
        mx.eval(fn())
    best = float("inf")
    for _ in range(3):  # best of 3 rounds of `iters` calls
        t0 = time.perf_counter()
        for _ in range(iters):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def _decode_call(rng, x, iters: int) -> None:
    """Context (no target): one decode-shaped call through 6 Q2_K experts, on as many CPU streams
    as the portable backend uses here against one stream (experts.QuantExperts)."""
    from ds4agent.engine import experts as experts_mod

    parts = experts_mod.cpu_parts()
    if parts < 2:
        return
    block, size, _name = quant.BLOCK_INFO[quant.Q2_K]
    raw = _blocks(rng, quant.Q2_K, 6 * D_OUT * D_IN // block).reshape(6, D_OUT, D_IN // block * size)
    ex = quant_experts(raw, quant.Q2_K, (6, D_OUT, D_IN), backend="portable")
    ids = mx.array([[0, 1, 2, 3, 4, 5]])
    timings = {}
    real = experts_mod.cpu_parts
    try:
        for n in (1, parts):
            experts_mod.cpu_parts = lambda n=n: n
            timings[n] = _time(lambda: ex.gather_matmul(x, ids), max(1, iters // 3))
    finally:
        experts_mod.cpu_parts = real
    print(f"decode call, 6 Q2_K experts: {timings[1] * 1e3:.1f} ms on one CPU stream, "
          f"{timings[parts] * 1e3:.1f} ms on {parts} ({timings[1] / timings[parts]:.2f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--backend", default="auto", choices=("auto", "portable", "metal"))
    ap.add_argument("--max-ratio", type=float, default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((1, D_IN)).astype(np.float32))
    ids = mx.array([[0]])
    device = mx.default_device()
    metal = args.backend == "metal" or (args.backend == "auto" and mx.metal.is_available())
    limit = args.max_ratio if args.max_ratio is not None else (1.5 if metal else None)
    print(f"expert mat-vec {D_IN} -> {D_OUT}, device {device}, backend "
          f"{'metal' if metal else 'portable'}, best of 3 x {args.iters} calls")
    print(f"{'type':<9}{'quant ms':>10}{'f16 ms':>9}{'ratio':>8}{'quant GB/s':>12}{'f16 GB/s':>10}")
    worst = 0.0
    for qtype in TYPES:
        block, size, name = quant.BLOCK_INFO[qtype]
        raw = _blocks(rng, qtype, D_OUT * D_IN // block).reshape(1, D_OUT, D_IN // block * size)
        ex = quant_experts(mx.array(raw), qtype, (1, D_OUT, D_IN), backend=args.backend)
        w16 = quant.dequantize(mx.array(raw), qtype, (D_OUT, D_IN)).astype(mx.float16)
        x16 = x.astype(mx.float16)
        mx.eval(w16, x16)
        tq = _time(lambda ex=ex: ex.gather_matmul(x, ids), args.iters)
        tf = _time(lambda w16=w16, x16=x16: x16 @ w16.T, args.iters)
        qbytes, fbytes = raw.nbytes, D_OUT * D_IN * 2
        ratio = tq / tf
        worst = max(worst, ratio)
        print(f"{name:<9}{tq * 1e3:>10.3f}{tf * 1e3:>9.3f}{ratio:>8.2f}{qbytes / tq / 1e9:>12.2f}{fbytes / tf / 1e9:>10.2f}")
    if not metal:
        _decode_call(rng, x, args.iters)
    if limit is None:
        print("no target for the portable backend (correctness fallback); worst ratio "
              f"{worst:.2f}")
        return 0
    ok = worst <= limit
    print(f"target: ratio <= {limit:.2f}: {'met' if ok else 'MISSED'} (worst {worst:.2f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
