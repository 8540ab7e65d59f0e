"""Benchmark: the routed-expert decode call at DS4 Flash's real shape, in GB/s of quantised bytes.

One decode step multiplies one row by 6 selected experts out of 256, for gate/up ([2048, 4096]:
2048 outputs of 4096 inputs) and down ([4096, 2048]). Measured side by side in one run:
  * ours:  `ExpertWeights.gather_matmul` of the backend `quant_experts` picks here (on a CPU the
           portable backend: compiled kernels that decode the blocks bit-exactly and sum in
           the dense f32 product's order, engine/experts/cpu.py) for IQ2_XXS gate/up and Q2_K down
           (the q2 file), Q4_K gate/up and down (the q4 file);
  * mlx:   MLX's own `gather_qmm` over the same shape in its affine 4-bit and 2-bit formats
           (group 64): what MLX's quantised kernels read here, as a reference point.
Each row: ms per call (best of --iters calls, 6 fresh random experts each, so the bytes come
from memory as in a real decode), GB/s of quantised bytes read (the 6 experts' blocks), and the
process CPU ms per call (on a shared machine the wall time also counts other people's work;
CPU ms / cores is what an idle machine would take).

Weights are random valid blocks (small finite f16 scales), no model file; one tensor of 256
experts at a time (at most 1.2 GB, the Q4_K one; peak resident about 2 GB). Exits non-zero when
a type of ours reads less than --target GB/s (default 0.5).

    python bench/experts.py [--iters N] [--target GBPS] [--prefill ROWS] [--backend auto|portable|gpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.experts.base import quant_experts

N_EXPERTS, TOP_K = 256, 6
GATE, DOWN = (2048, 4096), (4096, 2048)  # (d_out, d_in)
CASES = [  # (label, qtype, (d_out, d_in))
    ("IQ2_XXS gate/up", quant.IQ2_XXS, GATE),
    ("Q2_K down", quant.Q2_K, DOWN),
    ("Q4_K gate/up", quant.Q4_K, GATE),
    ("Q4_K down", quant.Q4_K, DOWN),
]
F16_FIELDS = {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}


def random_experts(rng: np.random.Generator, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    """[256, d_out, row_bytes] random valid blocks: random bytes, f16 scales set to ~1e-3."""
    d_out, d_in = shape
    block, size, _ = quant.block_info(qtype)
    per_expert = d_out * d_in // block  # blocks
    raw = np.empty((N_EXPERTS, per_expert, size), dtype=np.uint8)
    scales = (rng.uniform(0.5, 1.0, per_expert) * 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    for e in range(N_EXPERTS):  # expert by expert: no second whole-tensor buffer
        raw[e] = np.frombuffer(rng.bytes(per_expert * size), dtype=np.uint8).reshape(per_expert, size)
        for off in F16_FIELDS[qtype]:
            raw[e, :, off : off + 2] = np.roll(scales, e, axis=0)
    return raw.reshape(N_EXPERTS, d_out, d_in // block * size)


def _time(rng: np.random.Generator, call, iters: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) of `iters` calls, each on 6 fresh random experts."""
    def ids() -> mx.array:
        return mx.array(rng.choice(N_EXPERTS, TOP_K, replace=False)[None, :].astype(np.int32))

    mx.eval(call(ids()))  # warm-up: first-use compilation, worker threads
    wall, cpu = float("inf"), float("inf")
    for _ in range(iters):
        sel = ids()
        mx.eval(sel)
        t0, c0 = time.perf_counter(), time.process_time()
        mx.eval(call(sel))
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def _row(label: str, nbytes: int, wall: float, cpu: float) -> float:
    gbps = nbytes / wall / 1e9
    print(f"{label:<26}{wall * 1e3:>9.1f}{gbps:>9.3f}{cpu * 1e3:>10.1f}")
    return gbps


def _mlx_reference(rng: np.random.Generator, bits: int, shape: tuple[int, int], iters: int) -> None:
    d_out, d_in = shape
    group = 64
    # generated in MLX: no numpy copy of the 1 GB beside it
    key = mx.random.key(int(rng.integers(1 << 31)))
    wq = mx.random.randint(0, 1 << 31, (N_EXPERTS, d_out, d_in * bits // 32), dtype=mx.uint32, key=key)
    scales = mx.random.uniform(0.5e-3, 1e-3, (N_EXPERTS, d_out, d_in // group), key=key)
    biases = mx.random.uniform(-1e-3, 1e-3, (N_EXPERTS, d_out, d_in // group), key=key)
    x = mx.array(rng.standard_normal((1, d_in)).astype(np.float32))
    mx.eval(wq, scales, biases, x)

    def call(ids):
        return mx.gather_qmm(x, wq, scales, biases, rhs_indices=ids.reshape(-1).astype(mx.uint32),
                             transpose=True, group_size=group, bits=bits)

    per_expert = d_out * (d_in * bits // 8 + 2 * (d_in // group) * 4)
    wall, cpu = _time(rng, call, iters)
    _row(f"mlx affine {bits}-bit {d_out}x{d_in}", TOP_K * per_expert, wall, cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.5, help="GB/s every type of ours must reach")
    ap.add_argument("--prefill", type=int, default=0, metavar="ROWS",
                    help="also time one prefill chunk of ROWS rows (context, no target)")
    ap.add_argument("--backend", default="auto", choices=("auto", "portable", "gpu"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"routed-expert decode call: 1 row x {TOP_K} of {N_EXPERTS} experts, device {mx.default_device()}, "
          f"{os.cpu_count()} CPUs, best of {args.iters} calls")
    print(f"{'':<26}{'ms':>9}{'GB/s':>9}{'cpu ms':>10}")
    worst = float("inf")
    for label, qtype, shape in CASES:
        d_out, d_in = shape
        raw = random_experts(rng, qtype, shape)
        ex = quant_experts(raw, qtype, (N_EXPERTS, d_out, d_in), backend=args.backend)
        x = mx.array(rng.standard_normal((1, d_in)).astype(np.float32))
        wall, cpu = _time(rng, lambda ids, ex=ex, x=x: ex.gather_matmul(x, ids), args.iters)
        worst = min(worst, _row(f"{label} {d_out}x{d_in}", TOP_K * ex.expert_bytes, wall, cpu))
        if args.prefill:
            xs = mx.array(rng.standard_normal((args.prefill, d_in)).astype(np.float32))
            ids = np.stack([rng.choice(N_EXPERTS, TOP_K, replace=False) for _ in range(args.prefill)])
            sel = mx.array(ids.astype(np.int32))
            mx.eval(ex.gather_matmul(xs[:1], sel[:1]))
            t0, c0 = time.perf_counter(), time.process_time()
            mx.eval(ex.gather_matmul(xs, sel))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            _row(f"  prefill {args.prefill} rows ({len(np.unique(ids))} exp)",
                 len(np.unique(ids)) * ex.expert_bytes, wall, cpu)
        del raw, ex
    for bits in (4, 2):
        for shape in (GATE, DOWN):
            _mlx_reference(rng, bits, shape, args.iters)
    ok = worst >= args.target
    print(f"target: every type >= {args.target:.2f} GB/s: {'met' if ok else 'MISSED'} (worst {worst:.3f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
