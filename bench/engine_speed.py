"""Engine speed against this machine's own MLX matmul throughput, measured side by side.

Config: the `small` test config (config.py): 4 layers, width 512, the real vocab 129280,
8 heads of 192 (64 RoPE dims), ratios 0/4/128/4, window 128, indexer 8 x 128 with top-k 128,
16 routed experts (4 used) of width 256 plus one shared expert; random weights from
make_test_model (Q8_0 projections as MLX affine 8-bit, F16 experts widened to f32).

Measured in one run:
  * prefill tok/s over 2,048 tokens (one chunk: ctx <= 4096 puts the whole prompt in one chunk);
  * decode tok/s over 128 greedy steps;
  * roofline: for every weight matrix a token touches, the time MLX takes for that matrix's own
    product (same storage: quantized_matmul for Q8_0, f32 matmul otherwise) with M = 2,048 rows,
    summed over the model's work = the time a perfect prefill would need (attention scores, norms
    and routing are not counted, so the printed fraction is, if anything, flattering);
  * weight pass: one graph of plain mat-vecs (x[1, in] times every matrix a decode step reads:
    all projections, the used experts, the output head), i.e. the memory-bound floor of decode.

Targets (exit status 1 below either): prefill >= 25% of the roofline; decode step <= 3x the
weight pass. Run: .venv/bin/python bench/engine_speed.py [--prefill 2048] [--decode 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ds4agent.engine import load_engine
from ds4agent.engine.device import cpu_parts
from ds4agent.testmodels import make_test_model

PREFILL_TARGET = 0.25
DECODE_TARGET = 3.0


def _linears(weights, config):
    """(name, Linear, per-token multiplicity) of every projection one token runs through."""
    out = []
    for li, lw in enumerate(weights.layers):
        a, f = lw.attn, lw.ffn
        out += [(f"{li}.hc_attn", lw.hc_attn.fn), (f"{li}.hc_ffn", lw.hc_ffn.fn),
                (f"{li}.q_a", a.q_a), (f"{li}.q_b", a.q_b), (f"{li}.kv", a.kv),
                (f"{li}.out_b", a.out_b), (f"{li}.gate_inp", f.gate_inp),
                (f"{li}.gate_sh", f.gate_shexp), (f"{li}.up_sh", f.up_shexp),
                (f"{li}.down_sh", f.down_shexp)]
        out += [(f"{li}.out_a{g}", lin) for g, lin in enumerate(a.out_a)]
        if a.compressor is not None:
            out += [(f"{li}.comp_kv", a.compressor.kv), (f"{li}.comp_gate", a.compressor.gate)]
        if a.indexer is not None:
            ix = a.indexer
            out += [(f"{li}.ix_q_b", ix.q_b), (f"{li}.ix_proj", ix.proj),
                    (f"{li}.ix_kv", ix.compressor.kv), (f"{li}.ix_gate", ix.compressor.gate)]
    out.append(("head_hc", weights.head.fn))
    return out


def _expert_mats(weights, config):
    """Dense [d_out, d_in] matrices of the experts a decode step uses (the first U per layer)."""
    mats = []
    for lw in weights.layers:
        for ex in (lw.ffn.gate_exps, lw.ffn.up_exps, lw.ffn.down_exps):
            w = getattr(ex, "w", None)
            if w is None:
                w = ex.dequantize(np.arange(config.n_experts_used))
            mats += [w[e] for e in range(config.n_experts_used)]
    return mats


def _time(fn, reps=5, warm=2):
    for _ in range(warm):
        mx.eval(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _matmul_rate(lin_or_w, m, cache):
    """Seconds per product with M rows for this matrix's shape and storage (memoised per shape)."""
    quant = getattr(lin_or_w, "scales", None) is not None
    if hasattr(lin_or_w, "in_features"):
        shape = (lin_or_w.out_features, lin_or_w.in_features)
        fn_of = lin_or_w
    else:
        shape = tuple(lin_or_w.shape)
        w = lin_or_w
        # The roofline must be the best this MLX build can do for the product, whatever layout the
        # engine happens to store: time both x @ W.T and x @ (contiguous W^T) and keep the faster
        # (on the Linux CPU build the second is ~2x faster), so the fraction can never exceed 100%
        # merely because the engine found the better layout.
        wt = mx.contiguous(w.T)
        mx.eval(wt)

        def fn_of(x):
            return x @ w.T

        def fn_alt(x):
            return x @ wt
    key = (shape, quant, m)
    if key not in cache:
        x = mx.random.normal((m, shape[1]), key=mx.random.key(0))
        mx.eval(x)
        cache[key] = _time(lambda: fn_of(x))
        if not quant and not hasattr(lin_or_w, "in_features"):
            cache[key] = min(cache[key], _time(lambda: fn_alt(x)))
    return cache[key], 2.0 * m * shape[0] * shape[1]


def roofline(engine, n_tokens):
    """(seconds a perfect prefill of n_tokens needs at MLX matmul speed, its GFLOP, GFLOP/s)."""
    cfg, w = engine.config, engine.weights
    cache: dict = {}
    total_t = total_f = 0.0
    for _name, lin in _linears(w, cfg):
        t, f = _matmul_rate(lin, n_tokens, cache)
        total_t += t
        total_f += f
    # Routed experts: every token runs U experts; perfectly batched that is U products of M rows
    # for each of gate/up/down per layer.
    per_layer = [lw.ffn for lw in w.layers]
    for ffn in per_layer:
        for ex in (ffn.gate_exps, ffn.up_exps, ffn.down_exps):
            mat = ex.w[0] if hasattr(ex, "w") else ex.dequantize(np.arange(1))[0]
            t, f = _matmul_rate(mat, n_tokens, cache)
            total_t += t * cfg.n_experts_used
            total_f += f * cfg.n_experts_used
    # The output head runs for the last token only in a prefill (sync needs one row of logits).
    t, f = _matmul_rate(w.output, 1, cache)
    total_t += t
    total_f += f
    return total_t, total_f / 1e9, total_f / 1e9 / total_t


def weight_pass(engine):
    """Seconds for one graph of mat-vecs over every matrix a decode step reads."""
    cfg, w = engine.config, engine.weights
    lins = [lin for _n, lin in _linears(w, cfg)] + [w.output]
    mats = _expert_mats(w, cfg)
    xs = {}

    def x_for(n):
        if n not in xs:
            xs[n] = mx.random.normal((1, n), key=mx.random.key(n))
        return xs[n]

    for lin in lins:
        x_for(lin.in_features)
    for m in mats:
        x_for(int(m.shape[1]))
    mx.eval(list(xs.values()))

    def run():
        return [lin(x_for(lin.in_features)) for lin in lins] + [x_for(int(m.shape[1])) @ m.T for m in mats]

    nbytes = sum(lin.weight.nbytes + (lin.scales.nbytes + lin.biases.nbytes if lin.scales is not None else 0)
                 for lin in lins) + sum(m.nbytes for m in mats)
    return _time(run, reps=7), nbytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--model", default=None, help="reuse an existing test model file")
    ap.add_argument("--profile", action="store_true", help="cProfile one prefill and one decode step")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else Path(tmp) / f"{args.config}.gguf"
        if not args.model:
            t0 = time.perf_counter()
            make_test_model(path, args.config, seed=0)
            print(f"model: {args.config} written in {time.perf_counter() - t0:.1f}s "
                  f"({path.stat().st_size / 1e6:.0f} MB)")
        ctx = args.prefill + args.decode + 1
        t0 = time.perf_counter()
        engine = load_engine(path, ctx=ctx)
        print(f"load: {time.perf_counter() - t0:.2f}s  device: {mx.default_device()}  "
              f"chunk: {engine.chunk}  CPU streams per large Q8_0 product: {cpu_parts()}")
        cfg = engine.config
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(3, cfg.vocab, size=args.prefill)]

        warm = engine.new_session()  # first-call allocation and graph setup, not measured
        warm.sync(prompt[:256])
        warm.step(5)
        del warm

        if args.profile:
            import cProfile
            import pstats

            s = engine.new_session()
            prof = cProfile.Profile()
            prof.enable()
            s.sync(prompt)
            for _ in range(8):
                s.step(int(np.argmax(s.logits)))
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)

        s = engine.new_session()
        t0 = time.perf_counter()
        s.sync(prompt)
        t_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(args.decode):
            s.step(int(np.argmax(s.logits)))
        t_decode = (time.perf_counter() - t0) / args.decode

        roof_t, gflop, rate = roofline(engine, args.prefill)
        wp_t, wp_bytes = weight_pass(engine)

        # Context only (not a target): the same f32 product through numpy's BLAS. The Linux
        # mlx[cpu] wheel links the reference (netlib) BLAS, so MLX's CPU matmul can be far below
        # what the cores can do; the targets above are relative to MLX's own speed on purpose.
        # (The engine takes the two cheap wins measured on this wheel: dense weights stored
        # transposed and contiguous, ~2.4x; large Q8_0 products split over CPU streams, one core
        # each. The roofline and weight pass run through the same Linear, so both sides gain.)
        xa = rng.standard_normal((args.prefill, cfg.dim)).astype(np.float32)
        wa = rng.standard_normal((cfg.q_lora_rank, cfg.dim)).astype(np.float32)
        xa @ wa.T
        t_np = []
        for _ in range(5):
            t0 = time.perf_counter()
            xa @ wa.T
            t_np.append(time.perf_counter() - t0)
        np_rate = 2.0 * xa.shape[0] * wa.shape[0] * wa.shape[1] / statistics.median(t_np) / 1e9

    frac = roof_t / t_prefill
    ratio = t_decode / wp_t
    print(f"prefill: {args.prefill} tokens in {t_prefill:.3f}s = {args.prefill / t_prefill:,.0f} tok/s")
    print(f"decode:  {args.decode} steps, {t_decode * 1e3:.2f} ms/token = {1 / t_decode:,.1f} tok/s")
    print(f"matmul roofline: {gflop:.1f} GFLOP of projections at {rate:,.1f} GFLOP/s "
          f"(MLX, model shapes, M={args.prefill}) = {roof_t:.3f}s")
    print(f"(for context: numpy BLAS f32 matmul at [{args.prefill}, {cfg.dim}] x "
          f"[{cfg.dim}, {cfg.q_lora_rank}]: {np_rate:,.1f} GFLOP/s)")
    print(f"weight pass: {wp_bytes / 1e6:.0f} MB of weights in {wp_t * 1e3:.2f} ms "
          f"({wp_bytes / wp_t / 1e9:.1f} GB/s)")
    ok_p = frac >= PREFILL_TARGET
    ok_d = ratio <= DECODE_TARGET
    print(f"prefill fraction of roofline: {frac:.1%} (target >= {PREFILL_TARGET:.0%}) "
          f"{'OK' if ok_p else 'BELOW TARGET'}")
    print(f"decode time / weight pass: {ratio:.2f}x (target <= {DECODE_TARGET:.0f}x) "
          f"{'OK' if ok_d else 'BELOW TARGET'}")
    return 0 if ok_p and ok_d else 1


if __name__ == "__main__":
    sys.exit(main())
