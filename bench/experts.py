"""Benchmark: the routed-expert kernels at DS4 Flash's shape, as a ratio to MLX's own quantised matmul.

One decode step multiplies one row by 6 selected experts for gate/up ([2048, 4096]: 2048 outputs
of 4096 inputs) and down ([4096, 2048]); a 64-token prefill chunk multiplies 64 rows by 6 experts
each. Measured side by side in one run, on the same shapes:
  * fast:  the fast CPU kernel set (engine/qmatrix.py ExpertMatrix: 8-bit activations, integer
           dot products, every core) on IQ2_XXS gate/up and Q2_K down (the q2 file) and Q4_K
           gate/up and down (the q4 file), MXFP4 gate/up and down (ds4's native FP4 experts);
  * exact: the exact float32 reference kernels (experts/cpu.py through quant_experts'
           portable backend on the CPU kernel set), for the figure the fast set replaces; for
           MXFP4 the row is MLX's own mxfp4 gather_qmm (what runs outside the fast set);
  * mlx:   `mx.gather_qmm` in MLX's affine 4-bit and 8-bit formats, group 32 and 64, over the
           same shapes (what MLX's quantised kernels do here).
Each row: ms per call (best of --iters calls, fresh random experts each, so the blocks come from
memory as in a real decode), GB/s of quantised blocks read (the selected experts' bytes), process
CPU ms per call (on a shared machine the wall time also counts other people's work), and the
speed ratio to MLX's 4-bit group-64 product of the same shape (> 1: ours is faster).

Weights are random valid blocks (small finite f16 scales), no model file; --experts per tensor
(default 64: 140-300 MB of blocks per tensor, far beyond the caches). Exits non-zero when a fast
decode row is slower than MLX's 4-bit (group 64) decode of its shape (--target, a ratio).

    python bench/experts.py [--iters N] [--experts E] [--prefill ROWS] [--target RATIO] [--no-exact]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mlx.core as mx
import numpy as np

from ds4agent.engine import device, quant
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.qmatrix import ExpertMatrix

TOP_K = 6
GATE, DOWN = (2048, 4096), (4096, 2048)  # (d_out, d_in)
CASES = [  # (label, qtype, (d_out, d_in))
    ("IQ2_XXS gate/up", quant.IQ2_XXS, GATE),
    ("Q2_K down", quant.Q2_K, DOWN),
    ("Q4_K gate/up", quant.Q4_K, GATE),
    ("Q4_K down", quant.Q4_K, DOWN),
    ("MXFP4 gate/up", quant.MXFP4, GATE),
    ("MXFP4 down", quant.MXFP4, DOWN),
]
F16_FIELDS = {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}


def random_experts(rng: np.random.Generator, n_experts: int, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    """[n_experts, d_out, row_bytes] random valid blocks: random bytes, f16 scales set to ~1e-3."""
    d_out, d_in = shape
    block, size, _ = quant.block_info(qtype)
    per_expert = d_out * d_in // block  # blocks
    raw = np.empty((n_experts, per_expert, size), dtype=np.uint8)
    scales = (rng.uniform(0.5, 1.0, per_expert) * 1e-3).astype(np.float16).view(np.uint8).reshape(-1, 2)
    for e in range(n_experts):  # expert by expert: no second whole-tensor buffer
        raw[e] = np.frombuffer(rng.bytes(per_expert * size), dtype=np.uint8).reshape(per_expert, size)
        if qtype == quant.MXFP4:  # the E8M0 scale byte: 2^(e - 128) near 1e-3
            raw[e, :, 0] = 117 + (np.arange(per_expert) + e) % 4
            continue
        for off in F16_FIELDS[qtype]:
            raw[e, :, off : off + 2] = np.roll(scales, e, axis=0)
    return raw.reshape(n_experts, d_out, d_in // block * size)


class Timer:
    """Best wall and CPU seconds of a call over fresh random expert choices."""

    def __init__(self, rng: np.random.Generator, n_experts: int, iters: int):
        self.rng, self.n_experts, self.iters = rng, n_experts, iters

    def ids(self, rows: int) -> np.ndarray:
        return np.stack([self.rng.choice(self.n_experts, TOP_K, replace=False) for _ in range(rows)]).astype(np.int32)

    def time(self, call, rows: int) -> tuple[float, float, int]:
        """(wall, cpu, distinct experts of the best call) of call(ids) -> something mx.eval takes."""
        mx.eval(call(self.ids(rows)))  # warm-up: first-use compilation, worker threads
        best = (float("inf"), float("inf"), 0)
        for _ in range(self.iters if rows == 1 else max(2, self.iters // 3)):  # prefill calls are long
            ids = self.ids(rows)
            t0, c0 = time.perf_counter(), time.process_time()
            mx.eval(call(ids))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if wall < best[0]:
                best = (wall, min(cpu, best[1]), len(np.unique(ids)))
        return best


def _row(label: str, nbytes: int, wall: float, cpu: float, ref: float | None) -> None:
    ratio = f"{ref / wall:>8.2f}x" if ref else f"{'':>9}"
    print(f"{label:<34}{wall * 1e3:>9.2f}{nbytes / wall / 1e9:>8.2f}{cpu * 1e3:>9.2f}{ratio}")


def _mlx_weights(rng: np.random.Generator, n_experts: int, bits: int, group: int, shape: tuple[int, int]):
    d_out, d_in = shape
    key = mx.random.key(int(rng.integers(1 << 31)))  # generated in MLX: no numpy copy beside it
    wq = mx.random.randint(0, 1 << 31, (n_experts, d_out, d_in * bits // 32), dtype=mx.uint32, key=key)
    scales = mx.random.uniform(0.5e-3, 1e-3, (n_experts, d_out, d_in // group), key=key)
    biases = mx.random.uniform(-1e-3, 1e-3, (n_experts, d_out, d_in // group), key=key)
    mx.eval(wq, scales, biases)
    per_expert = d_out * (d_in * bits // 8 + 2 * (d_in // group) * 4)
    return (wq, scales, biases), per_expert


def _mlx_rows(rng, timer: Timer, shape, rows_list) -> dict[tuple[int, int, int], float]:
    """MLX's gather_qmm rows of one shape; returns {(bits, group, rows): wall} for the ratios."""
    walls = {}
    d_out, d_in = shape
    for bits in (4, 8):
        for group in (64, 32):
            (wq, scales, biases), per_expert = _mlx_weights(rng, timer.n_experts, bits, group, shape)
            for rows in rows_list:
                x = mx.array(rng.standard_normal((rows, 1, 1, d_in)).astype(np.float32))

                def call(ids, x=x, wq=wq, scales=scales, biases=biases, bits=bits, group=group):
                    return mx.gather_qmm(x, wq, scales, biases, rhs_indices=mx.array(ids.astype(np.uint32)),
                                         transpose=True, group_size=group, bits=bits)

                wall, cpu, used = timer.time(call, rows)
                walls[(bits, group, rows)] = wall
                label = f"  mlx {bits}-bit g{group} {d_out}x{d_in}" + (f" x{rows} tok" if rows > 1 else "")
                _row(label, used * per_expert, wall, cpu, None)
            del wq, scales, biases
    return walls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--experts", type=int, default=64, help="experts per tensor (Flash has 256)")
    ap.add_argument("--prefill", type=int, default=64, metavar="ROWS", help="prefill chunk rows (0: none)")
    ap.add_argument("--target", type=float, default=1.0,
                    help="speed ratio to MLX 4-bit g64 every fast decode row must reach")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact reference kernels")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    timer = Timer(rng, args.experts, args.iters)
    rows_list = [1] + ([args.prefill] if args.prefill else [])
    print(f"routed experts: {TOP_K} of {args.experts} per token, {os.cpu_count()} CPUs, "
          f"{device.cpu_parts()} worker threads, best of {args.iters} calls")
    print(f"{'':<34}{'ms':>9}{'GB/s':>8}{'cpu ms':>9}{'vs mlx4':>9}")
    mlx = {shape: _mlx_rows(rng, timer, shape, rows_list) for shape in (GATE, DOWN)}
    worst = float("inf")
    for label, qtype, shape in CASES:
        d_out, d_in = shape
        raw = random_experts(rng, args.experts, qtype, shape)
        fast = ExpertMatrix.from_blocks(raw, qtype, args.experts, d_out, d_in)
        expert_bytes = d_out * quant.row_bytes(qtype, d_in)
        for rows in rows_list:
            x = rng.standard_normal((rows, d_in)).astype(np.float32)
            wall, cpu, used = timer.time(lambda ids, x=x, m=fast: mx.array(m.matmul(x, ids)), rows)
            ref = mlx[shape][(4, 64, rows)]
            tag = f" x{rows} tok" if rows > 1 else ""
            _row(f"fast  {label} {d_out}x{d_in}{tag}", used * expert_bytes, wall, cpu, ref)
            if rows == 1:
                worst = min(worst, ref / wall)
            if not args.no_exact:
                with device.forced_kernel_set("cpu"):
                    exact = quant_experts(raw, qtype, (args.experts, d_out, d_in), backend="portable")
                xm = mx.array(x)
                wall, cpu, used = timer.time(lambda ids, xm=xm, ex=exact: ex.gather_matmul(xm, mx.array(ids)), rows)
                name = "mlx" if qtype == quant.MXFP4 else "exact"  # Mxfp4Experts: MLX's mxfp4
                _row(f"{name:<5} {label} {d_out}x{d_in}{tag}", used * expert_bytes, wall, cpu, ref)
        del raw, fast
    ok = worst >= args.target
    print(f"target: every fast decode row >= {args.target:.2f}x MLX 4-bit g64: "
          f"{'met' if ok else 'MISSED'} (worst {worst:.2f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
