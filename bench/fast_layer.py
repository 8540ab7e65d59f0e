"""Benchmark: one DS4 Flash layer's matrix products on the fast CPU kernel set, in ms per token.

The products of one layer of Flash's heaviest kind (compression ratio 4: compressor, indexer and
its compressor), with the types of ds4's q2 file (layout.py): Q8_0 attention projections
(q_a, q_b, kv, the 8 groups of output A as one grouped product, output B) and shared expert, F16
compressors / indexer / router / hyper-connection mixes, and the routed experts (6 of --experts:
IQ2_XXS gate and up, Q2_K down, through qmatrix.routed_ffn; --q4: Q4_K). Random weights, no
model file. Each group: decode (1 token) and a --prefill chunk, per token (best of --iters calls);
then the layer's total and the total for Flash's 43 layers (products only: attention, norms and
the rest of a token come on top).

Targets (the fast set's share of a 1.8 s/token decode on 2 cores): routed experts <= 20 ms and
the Q8_0 projections <= 15 ms per layer at decode; exits non-zero when either is missed.

    python bench/fast_layer.py [--iters N] [--experts E] [--prefill ROWS] [--q4]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ds4agent.engine import device, quant
from ds4agent.engine.config import flash_config
from ds4agent.engine.qmatrix import ExpertMatrix, QuantMatrix, routed_ffn

F16_FIELDS = {quant.Q8_0: (0,), quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}


def blocks(rng: np.random.Generator, qtype: int, rows: int, cols: int) -> np.ndarray:
    """Random valid blocks for [rows, cols] (f16 scales ~1e-3), flat uint8."""
    block, size, _ = quant.block_info(qtype)
    n = rows * cols // block
    raw = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    scales = (rng.uniform(0.5, 1.0, n) * 1e-3).astype(np.float16).view(np.uint8).reshape(n, 2)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = scales
    return raw.reshape(-1)


def best(call, iters: int) -> float:
    call()  # warm-up (first-use compilation, worker threads)
    out = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        out = min(out, time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--experts", type=int, default=64, help="routed experts per tensor (Flash has 256)")
    ap.add_argument("--prefill", type=int, default=64, metavar="ROWS")
    ap.add_argument("--q4", action="store_true", help="Q4_K routed experts (the q4 file) instead of q2")
    args = ap.parse_args(argv)
    c = flash_config()
    rng = np.random.default_rng(0)
    E, Q, H, Dh, G, O = c.dim, c.q_lora_rank, c.n_heads, c.head_dim, c.out_groups, c.out_lora_rank
    F, Hi, Di, mix, n = c.expert_ffn, c.indexer_heads, c.indexer_dim, c.hc_mix, c.hc_count
    q8 = {  # name -> (rows, cols)
        "attn_q_a": (Q, E), "attn_q_b": (H * Dh, Q), "attn_kv": (Dh, E), "attn_output_b": (E, G * O),
        "ffn_gate_shexp": (F, E), "ffn_up_shexp": (F, E), "ffn_down_shexp": (E, F),
    }
    f16 = {
        "attn_compressor_kv": (2 * Dh, E), "attn_compressor_gate": (2 * Dh, E), "indexer.attn_q_b": (Hi * Di, Q),
        "indexer.proj": (Hi, E), "indexer_compressor_kv": (2 * Di, E), "indexer_compressor_gate": (2 * Di, E),
        "ffn_gate_inp": (c.n_experts, E), "hc_attn_fn": (mix, n * E), "hc_ffn_fn": (mix, n * E),
    }
    mats = {k: QuantMatrix.from_blocks(blocks(rng, quant.Q8_0, r, cc), quant.Q8_0, r, cc) for k, (r, cc) in q8.items()}
    out_a_cols = (H // G) * Dh
    out_a = ExpertMatrix.from_blocks(blocks(rng, quant.Q8_0, G * O, out_a_cols), quant.Q8_0, G, O, out_a_cols)
    dense = {k: QuantMatrix.from_dense(rng.standard_normal((r, cc)).astype(np.float16) * np.float16(0.01))
             for k, (r, cc) in f16.items()}
    up_t, down_t = (quant.Q4_K, quant.Q4_K) if args.q4 else (quant.IQ2_XXS, quant.Q2_K)
    nx = args.experts
    gate = ExpertMatrix.from_blocks(blocks(rng, up_t, nx * F, E), up_t, nx, F, E)
    up = ExpertMatrix.from_blocks(blocks(rng, up_t, nx * F, E), up_t, nx, F, E)
    down = ExpertMatrix.from_blocks(blocks(rng, down_t, nx * E, F), down_t, nx, E, F)
    print(f"Flash layer products (ratio-4 layer), {device.cpu_parts()} worker threads, "
          f"experts {quant.type_name(up_t)}/{quant.type_name(down_t)} 6 of {nx}, best of {args.iters}")
    print(f"{'':<34}{'decode ms':>11}{f'prefill {args.prefill} ms/tok':>22}")
    totals = {}
    for rows in (1, args.prefill):
        iters = args.iters if rows == 1 else max(2, args.iters // 3)
        widths = {m.cols for m in (*mats.values(), *dense.values())} | {E}
        x = {d: rng.standard_normal((rows, d)).astype(np.float32) for d in widths}
        xa = rng.standard_normal((rows, G, out_a_cols)).astype(np.float32)
        groups = np.tile(np.arange(G), (rows, 1))
        ids = np.stack([rng.choice(nx, 6, replace=False) for _ in range(rows)])
        wts = rng.uniform(0.1, 0.5, (rows, 6)).astype(np.float32)

        def projections(x=x, xa=xa, groups=groups) -> None:
            for m in mats.values():
                m.matmul(x[m.cols])
            out_a.matmul(xa, groups)

        def dense_products(x=x) -> None:
            for m in dense.values():
                m.matmul(x[m.cols])

        def routed(x=x, ids=ids, wts=wts) -> None:
            routed_ffn(gate, up, down, x[E], ids, wts, 10.0)

        for label, call in (("Q8_0 projections + shared expert", projections),
                            ("F16 compressors/indexer/router/hc", dense_products),
                            ("routed experts (routed_ffn)", routed)):
            totals[(label, rows)] = best(call, iters) / rows
    worst_ok = True
    layer = {1: 0.0, args.prefill: 0.0}
    for label in ("Q8_0 projections + shared expert", "F16 compressors/indexer/router/hc", "routed experts (routed_ffn)"):
        d, p = totals[(label, 1)], totals[(label, args.prefill)]
        layer[1] += d
        layer[args.prefill] += p
        print(f"{label:<34}{d * 1e3:>11.2f}{p * 1e3:>22.2f}")
    print(f"{'layer total':<34}{layer[1] * 1e3:>11.2f}{layer[args.prefill] * 1e3:>22.2f}")
    print(f"{'x 43 layers (s/token)':<34}{layer[1] * 43:>11.3f}{layer[args.prefill] * 43:>22.3f}")
    for label, limit in (("routed experts (routed_ffn)", 20e-3), ("Q8_0 projections + shared expert", 15e-3)):
        ok = totals[(label, 1)] <= limit
        worst_ok &= ok
        print(f"target: {label} decode <= {limit * 1e3:.0f} ms: {'met' if ok else 'MISSED'}")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main())
