"""Judge a GPU in one run: the device, the GPU kernel set's agreement with the CPU reference,
decode and prefill tokens/s at `small` and at the Flash shape, peak memory; one table.

    python bench/gpu_check.py                      # everything; writes the Flash test file
    python bench/gpu_check.py --no-flash           # tiny/small only (minutes)
    python bench/gpu_check.py --flash-model F.gguf # reuse a Flash-shape file made earlier
    python bench/gpu_check.py --device cpu --no-flash --configs tiny   # CPU dry run (CI does this)

Needs nothing but this checkout and an installed MLX (its CUDA build on Linux: bench/README.md
says how to install it from a local wheel, offline). Every model file is a random-weight test
file written here (`ds4agent make-test-model`); nothing touches the network.

What is measured:
  * device: what MLX runs on (Metal / CUDA / CPU) and the kernel set the GPU run uses;
  * agreement, per config (tiny, small): the logits of --agree-tokens positions, GPU kernel set
    on the chosen device vs the CPU kernel set on the CPU device (the bit-exact reference);
    the contract (architecture.md "Numerics per device"): argmax identical on >= 99% of the
    positions and max |dlogit| <= 1e-2 x max |logit|. A failure makes the exit status 1;
  * prefill tokens/s (one prompt of --prefill tokens through Session.sync) and decode tokens/s
    (--decode greedy tokens through engine.generate, the decode loop the agent uses), at `small`
    and at the Flash shape (`ds4agent make-test-model --config flash`, q2 experts; about 4.4 GB
    written to --workdir and removed afterwards unless --keep; --flash-prefill / --flash-decode
    bound its run, --no-flash skips it);
  * device->host reads per decoded token (engine.hostread), the GPU-shaped decode's invariant;
  * peak memory: MLX's peak allocation (device memory on a GPU) and the process's peak RSS;
  * the routed-expert kernels (engine/experts/gpu.py, the same sources the emulation tests run
    on the CPU): each type's kernels compiled through MLX on this GPU, their self-check, the
    prefill kernel against quant.py's dequantisation (bit for bit) and the decode kernel against
    the dequantised product (the emulation tests' bound) at the Flash expert shape, k = 6, and
    their times (GB/s of blocks read by the decode kernel).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import peak_rss  # noqa: E402
from ds4agent.engine import (  # noqa: E402
    Engine,  # noqa: E402
    generate,
    hostread,
    load_engine,
    quant,  # noqa: E402
)
from ds4agent.engine.device import KERNELS_ENV, choose_device, kernel_set  # noqa: E402
from ds4agent.engine.experts import gpu  # noqa: E402
from ds4agent.engine.model import Trace, forward  # noqa: E402
from ds4agent.engine.sampler import Sampler  # noqa: E402
from ds4agent.engine.state import SessionState  # noqa: E402
from ds4agent.testmodels.writer import make_test_model  # noqa: E402

ARGMAX_AGREEMENT = 0.99
REL_TOLERANCE = 1e-2
GiB = 1 << 30


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.failed = False

    def add(self, check: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("ok" if ok else "FAIL")
        self.failed |= ok is False
        self.rows.append((check, value, target, verdict))
        print(f"  {check}: {value} {verdict}", flush=True)  # progress while the run goes on

    def render(self) -> str:
        head = ("check", "value", "target", "")
        rows = [head, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        line = "+".join("-" * (w + 2) for w in widths)
        out = [line]
        for i, r in enumerate(rows):
            out.append("|".join(f" {c:<{w}} " for c, w in zip(r, widths, strict=True)))
            if i == 0:
                out.append(line)
        out.append(line)
        return "\n".join(out)


def _set_kernels(name: str) -> None:
    os.environ[KERNELS_ENV] = name


def _load(path: Path, device: str, kernels: str, ctx: int) -> Engine:
    _set_kernels(kernels)
    return load_engine(path, ctx=ctx, device=device)


def _prompt(vocab: int, n: int, seed: int = 1) -> list[int]:
    # Random ids over the whole vocabulary, as the oracle tests draw them (tests/engine).
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def _traced(engine: Engine, toks: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits of every position and each layer's routed experts (one chunk, traced)."""
    trace = Trace.new()
    logits, _ = forward(engine.weights, engine.config, SessionState.empty(engine.config), toks, trace=trace)
    experts = [np.sort(np.concatenate(trace.experts[li]), axis=-1) for li in sorted(trace.experts)]
    return np.array(logits), experts


def agreement(path: Path, device: str, n: int) -> dict[str, float]:
    """The GPU kernel set on `device` against the CPU kernel set on the CPU device: argmax
    agreement, max |dlogit| / max |logit|, how many positions exceed the bound, and at how many
    some layer routed to other experts (a near-tie the f32 arithmetic decided the other way:
    such a position's logits move by far more than rounding; it is reported, not hidden)."""
    ref_engine = _load(path, "cpu", "reference", ctx=max(256, 2 * n))
    toks = _prompt(ref_engine.config.vocab, n)
    ref, ref_experts = _traced(ref_engine, toks)
    del ref_engine
    gc.collect()
    engine = _load(path, device, "gpu", ctx=max(256, 2 * n))
    got, experts = _traced(engine, toks)
    del engine
    gc.collect()
    scale = max(float(np.abs(ref).max()), 1e-30)
    per_position = np.abs(ref - got).max(axis=-1) / scale
    rerouted = np.zeros(n, dtype=bool)
    for a, b in zip(ref_experts, experts, strict=True):
        rerouted |= (a != b).any(axis=-1)
    return {"argmax": float((ref.argmax(-1) == got.argmax(-1)).mean()), "rel": float(per_position.max()),
            "over": int((per_position > REL_TOLERANCE).sum()), "rerouted": int(rerouted.sum())}


def speed(engine: Engine, n_prefill: int, n_decode: int) -> dict[str, float]:
    """Prefill and decode tokens/s of one engine (a short warm-up first: MLX compiles kernels
    and fills its caches on first use), and host reads per decoded token."""
    vocab = engine.config.vocab
    warm = engine.new_session()
    warm.sync(_prompt(vocab, min(8, n_prefill), seed=5))
    for _ in generate(warm, Sampler(temperature=0.0), max_tokens=min(3, n_decode)):
        pass
    del warm
    s = engine.new_session()
    prompt = _prompt(vocab, n_prefill, seed=2)
    t0 = time.perf_counter()
    s.sync(prompt)
    t1 = time.perf_counter()
    reads0 = hostread.reads()
    got = 0
    t2 = time.perf_counter()
    for _ in generate(s, Sampler(temperature=0.0), max_tokens=n_decode):
        got += 1
    t3 = time.perf_counter()
    reads = hostread.reads() - reads0
    return {"prefill": n_prefill / (t1 - t0), "decode": got / (t3 - t2) if got else 0.0,
            "reads": reads / max(got, 1), "tokens": got}


def _peak() -> str:
    return f"MLX peak {mx.get_peak_memory() / GiB:.2f} GiB, RSS peak {peak_rss() / GiB:.2f} GiB"


def run_config(table: Table, name: str, path: Path, args, *, label: str, n_prefill: int, n_decode: int,
               ctx: int, check_agreement: bool) -> None:
    if check_agreement:
        n = args.agree_tokens
        r = agreement(path, args.device, n)
        table.add(f"{label}: argmax agreement ({n} positions)", f"{r['argmax']:.1%}",
                  f">= {ARGMAX_AGREEMENT:.0%}", r["argmax"] >= ARGMAX_AGREEMENT)
        table.add(f"{label}: max |dlogit| / max |logit|", f"{r['rel']:.2e}", f"<= {REL_TOLERANCE:.0e}",
                  r["rel"] <= REL_TOLERANCE)
        table.add(f"{label}: positions over the bound / routed otherwise",
                  f"{r['over']} / {r['rerouted']} of {n}")
    if n_prefill <= 0 and n_decode <= 0:
        return
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    engine = _load(path, args.device, "gpu", ctx=ctx)
    table.add(f"{label}: load", f"{time.perf_counter() - t0:.1f} s")
    r = speed(engine, max(1, n_prefill), max(1, n_decode))
    table.add(f"{label}: prefill", f"{r['prefill']:.1f} tok/s ({n_prefill} tokens)")
    table.add(f"{label}: decode", f"{r['decode']:.2f} tok/s ({r['tokens']} tokens)")
    table.add(f"{label}: host reads per decoded token", f"{r['reads']:.2f}", "<= 1", r["reads"] <= 1.0)
    table.add(f"{label}: peak memory", _peak())
    del engine
    gc.collect()


def _median_time(fn, repeats: int = 20) -> float:
    mx.eval(fn())  # compile and warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def expert_kernels(table: Table, backend: str, d_out: int = 2048, d_in: int = 4096, k: int = 6) -> None:
    """The GPU expert kernels of every type on this GPU, at the Flash expert shape."""
    rng = np.random.default_rng(0)
    for qtype in gpu.GPU_TYPES:
        name = quant.type_name(qtype)
        problem = gpu.self_check(qtype, backend)
        table.add(f"experts {name}: self-check", problem or "passed", "passed", problem is None)
        if problem:
            continue
        e = 32  # enough experts to spread the ids; the tensor's size does not change a kernel's work
        block, size, _ = quant.block_info(qtype)
        raw = rng.integers(0, 256, size=(e * d_out * d_in // block, size), dtype=np.uint8)
        for off in {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}[qtype]:
            raw[:, off : off + 2] = np.full((len(raw), 1), np.float16(0.001)).view(np.uint8)
        raw = raw.reshape(e, d_out, d_in // block * size)
        ex = gpu.GpuExperts(raw, qtype, (e, d_out, d_in), backend=backend)
        ids = rng.choice(e, k, replace=False)
        want = np.array(quant.dequantize(mx.array(raw[ids]), qtype, (k, d_out, d_in)))
        got = np.array(ex.dequantize(mx.array(ids.astype(np.uint32))))
        exact = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
        table.add(f"experts {name}: prefill kernel vs quant.py", "bit-exact" if exact else "DIFFERS",
                  "bit-exact", exact)
        x = rng.standard_normal((1, d_in)).astype(np.float32)
        y = np.array(ex.gather_matmul(mx.array(x), mx.array(ids[None, :])))[0]
        terms = want.astype(np.float64) * x[0].astype(np.float64)
        err = float((np.abs(y - terms.sum(-1)) / ((d_in + 1) * 2.0**-24 * np.abs(terms).sum(-1) + 1e-37)).max())
        table.add(f"experts {name}: decode kernel error / bound", f"{err:.3f}", "<= 1", err <= 1.0)
        xs, eids = mx.array(np.repeat(x, k, 0)), mx.array(ids.astype(np.uint32))
        t = _median_time(lambda ex=ex, xs=xs, eids=eids: ex.matvec(xs, eids))
        read = gpu.read_bytes(qtype, d_in, d_out, k)
        table.add(f"experts {name}: decode kernel (k={k}, {d_out}x{d_in})",
                  f"{t * 1e6:.0f} us, {read / t / 1e9:.0f} GB/s")
        t = _median_time(lambda ex=ex, eids=eids: ex.dequantize(eids), repeats=5)
        table.add(f"experts {name}: prefill kernel ({k} experts)", f"{t * 1e3:.2f} ms")


def _guarded(table: Table, part: str, fn, *args, **kwargs) -> None:
    """Run one part of the check; an exception becomes a failed row (its traceback on stderr) and
    the other parts still run: on a lent GPU, one part's crash must not lose the rest's figures."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported as a failed row, the run goes on
        traceback.print_exc()
        table.add(f"{part}: crashed", f"{type(exc).__name__}: {exc}".splitlines()[0][:160], "no error", False)
        gc.collect()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="where the GPU kernel set runs (cpu: a dry run of this script)")
    p.add_argument("--configs", default="tiny,small", help="test configs to check (comma-separated)")
    p.add_argument("--agree-tokens", type=int, default=48)
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens for the speed runs")
    p.add_argument("--decode", type=int, default=64, help="decoded tokens for the speed runs")
    p.add_argument("--no-flash", action="store_true", help="skip the Flash-shape part")
    p.add_argument("--flash-model", type=Path, help="an existing Flash-shape file (else one is written)")
    p.add_argument("--flash-prefill", type=int, default=512)
    p.add_argument("--flash-decode", type=int, default=16)
    p.add_argument("--flash-ctx", type=int, default=4096)
    p.add_argument("--workdir", type=Path, help="where test files are written (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the files written")
    args = p.parse_args(argv)
    saved = os.environ.get(KERNELS_ENV)
    try:
        return _check(args)
    finally:  # the switch is this run's, not the caller's (a test runs main in-process)
        if saved is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = saved


def _check(args) -> int:
    table = Table()
    dev = choose_device(args.device)
    want_gpu = args.device == "gpu"
    table.add("device", f"{dev.label} (MLX {mx.__version__})", "a GPU" if want_gpu else "",
              dev.kind == "gpu" if want_gpu else None)
    if dev.notice:
        table.add("device notice", dev.notice)
    _set_kernels("gpu")
    table.add("kernel set of the GPU run", kernel_set())
    info = getattr(mx, "device_info", None)
    if info is not None and dev.kind == "gpu":
        try:
            d = info()
            table.add("device info", ", ".join(f"{k}={d[k]}" for k in sorted(d) if k in
                                                ("device_name", "architecture", "memory_size")))
        except Exception:  # noqa: BLE001 - informative only
            pass

    backend = gpu.available_backend() if dev.kind == "gpu" else None
    if backend is None:
        table.add("expert kernels", "not run: no Metal or CUDA GPU (tests/gpu emulates them on the CPU)")
    else:
        _guarded(table, "expert kernels", expert_kernels, table, backend)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="ds4-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    try:
        for name in [c for c in args.configs.split(",") if c]:
            path = work / f"{name}.gguf"
            if not path.exists():
                make_test_model(path, name)
                made.append(path)
            speed_here = name == "small" or args.configs == name
            _guarded(table, name, run_config, table, name, path, args, label=name, check_agreement=True,
                     n_prefill=args.prefill if speed_here else 0,
                     n_decode=args.decode if speed_here else 0,
                     ctx=max(4096, 2 * (args.prefill + args.decode)))
        if not args.no_flash:
            path = args.flash_model
            if path is None:
                path = work / "flash.gguf"
                t0 = time.perf_counter()
                make_test_model(path, "flash")
                made.append(path)
                table.add("flash: test file written", f"{path.stat().st_size / GiB:.1f} GiB in "
                          f"{time.perf_counter() - t0:.0f} s")
            _guarded(table, "flash", run_config, table, "flash", path, args, label="flash",
                     check_agreement=False, n_prefill=args.flash_prefill, n_decode=args.flash_decode,
                     ctx=args.flash_ctx)
    finally:
        if not args.keep:
            for f in made:
                f.unlink(missing_ok=True)
            if args.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
    print()
    print(table.render())
    print("verdict:", "FAIL" if table.failed else "ok")
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
