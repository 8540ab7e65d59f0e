"""The GPU expert kernels (engine/experts/kernels/), emulated on the CPU: the same source files,
wrapped as MLX wraps them, compiled as C++ (tests/gpu/harness.py, emulator.h), for Metal and
CUDA, on every type and on awkward shapes, against quant.py's dequantised products.

Tolerances: the prefill kernel (dequant) equals quant.dequantize bit for bit. The decode kernel
(matvec) sums d_in float32 products in its own order (lanes, then a butterfly across 32 lanes);
any order of n float32 additions of rounded products is within (n + 1) * 2^-24 * sum |w_i x_i|
of the exact dot product, which is the bound asserted (with n = d_in).

`pytest -k emulat` selects these tests. Without a C++ compiler they skip, saying so.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import device, quant
from ds4agent.engine.experts import gpu
from tests.gpu import harness
from tests.weights.conftest import random_blocks

TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
BACKENDS = list(gpu.BACKENDS)
# (experts, d_out, d_in, pairs): one row of one expert; tails (37 rows: a partial last
# threadgroup; 768 inputs: 24 chunks, fewer than the 32 lanes, and a row of 3 blocks); decode at
# k = 6 (fewer than 8 ids: Metal's constant address space) and two tokens (12 pairs) over all
# 256 experts; 1280 inputs: 40 chunks, so 8 lanes take a second chunk and 24 do not.
MATVEC_SHAPES = [(1, 1, 256, 1), (6, 37, 768, 12), (256, 8, 512, 6), (256, 8, 512, 12), (3, 5, 1280, 2)]
# (experts, d_out, d_in, selected): every one of 256 experts; a tail (888 chunks, not a multiple
# of the 256-thread group) of fewer than 8 experts.
DEQUANT_SHAPES = [(256, 8, 512, 256), (6, 37, 768, 3)]


@pytest.fixture(scope="module")
def emulator():
    cxx = harness.compiler()
    if cxx is None:
        pytest.skip(harness.NO_COMPILER)
    emu = harness.Emulator(cxx)
    cases = [_matvec_case(b, t, s) for b in BACKENDS for t in TYPES for s in MATVEC_SHAPES]
    cases += [_dequant_case(b, t, s) for b in BACKENDS for t in TYPES for s in DEQUANT_SHAPES]
    emu.prepare([harness.instance(c, i) for c, i, _ in cases])  # one compiler run for them all
    return emu


def _blocks(qtype: int, e: int, d_out: int, d_in: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, e * d_out * d_in // 256, scale=0.05)
    big = min(3, len(raw) - 1)
    raw[:big] = random_blocks(rng, qtype, big, scale=30000.0)  # large finite scales
    return raw.reshape(e, d_out, d_in // 256 * size)


def _grid() -> np.ndarray:
    return quant.iq2xxs_tables()[0].reshape(-1)


def _matvec_case(backend: str, qtype: int, shape: tuple[int, int, int, int]):
    e, d_out, d_in, pairs = shape
    raw = _blocks(qtype, e, d_out, d_in, seed=d_in + pairs)
    rng = np.random.default_rng(pairs)
    x = rng.standard_normal((pairs, d_in)).astype(np.float32)
    ids = rng.integers(0, e, pairs).astype(np.uint32)
    ids[0] = e - 1  # the last expert: the end of the tensor
    call = gpu.matvec_call(backend, qtype, d_in, d_out, pairs)
    return call, [raw, x, ids, _grid()], (e, d_out, d_in)


def _dequant_case(backend: str, qtype: int, shape: tuple[int, int, int, int]):
    e, d_out, d_in, sel = shape
    raw = _blocks(qtype, e, d_out, d_in, seed=7 * d_in + sel)
    ids = np.random.default_rng(sel).permutation(e)[:sel].astype(np.uint32)
    call = gpu.dequant_call(backend, qtype, d_in, d_out, sel)
    return call, [raw, ids, _grid()], (e, d_out, d_in)


def _dequantised(raw: np.ndarray, qtype: int, shape: tuple[int, int, int]) -> np.ndarray:
    return np.array(quant.dequantize(mx.array(raw), qtype, shape))


def _matvec_error(got: np.ndarray, w: np.ndarray, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - exact| / the stated bound, per output (<= 1 passes)."""
    terms = w[ids].astype(np.float64) * x.astype(np.float64)[:, None, :]
    exact, mag = terms.sum(-1), np.abs(terms).sum(-1)
    d_in = x.shape[1]
    bound = (d_in + 1) * 2.0**-24 * mag + 1e-37
    return np.abs(got.astype(np.float64) - exact) / bound


def _id(v):
    return quant.type_name(v) if isinstance(v, int) else "x".join(map(str, v))


@pytest.mark.parametrize("shape", MATVEC_SHAPES, ids=_id)
@pytest.mark.parametrize("qtype", TYPES, ids=_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_emulated_matvec_matches_dequantised_product(emulator, backend, qtype, shape):
    call, inputs, eshape = _matvec_case(backend, qtype, shape)
    (got,) = emulator.run(call, inputs)
    w = _dequantised(inputs[0], qtype, eshape)
    assert not np.isnan(got).any()
    assert _matvec_error(got, w, inputs[2], inputs[1]).max() <= 1.0


@pytest.mark.parametrize("shape", DEQUANT_SHAPES, ids=_id)
@pytest.mark.parametrize("qtype", TYPES, ids=_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_emulated_dequant_is_bit_exact(emulator, backend, qtype, shape):
    call, inputs, eshape = _dequant_case(backend, qtype, shape)
    (got,) = emulator.run(call, inputs)
    want = _dequantised(inputs[0], qtype, eshape)[inputs[1]]
    # quant.py is itself held to gguf's reference; check both here
    ref = gguf_dequantize(inputs[0][inputs[1]], gguf.GGMLQuantizationType(qtype)).reshape(want.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_emulation_fails_a_broken_kernel(emulator, backend):
    """An off-by-one in the Q4_K nibble shift (4 -> 3), substituted in the source text: the
    harness must catch it in both kernels."""
    call, inputs, eshape = _matvec_case(backend, quant.Q4_K, (6, 37, 768, 12))
    assert "(j & 1u) * 4u" in call.header
    broken = dataclasses.replace(call, header=call.header.replace("(j & 1u) * 4u", "(j & 1u) * 3u"))
    (got,) = emulator.run(broken, inputs)
    w = _dequantised(inputs[0], quant.Q4_K, eshape)
    assert _matvec_error(got, w, inputs[2], inputs[1]).max() > 1.0
    dcall, dinputs, deshape = _dequant_case(backend, quant.Q4_K, (6, 37, 768, 3))
    dbroken = dataclasses.replace(dcall, header=broken.header)
    (dgot,) = emulator.run(dbroken, dinputs)
    assert not np.array_equal(dgot, _dequantised(dinputs[0], quant.Q4_K, deshape)[dinputs[1]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_emulation_refuses_what_lies_outside_the_subset(backend):
    call = gpu.matvec_call(backend, quant.Q2_K, 256, 4, 1)
    harness.check_subset(call)  # the real sources pass
    atomic = "atomicAdd(out, acc);" if backend == "cuda" else "atomic_fetch_add_explicit(out, acc);"
    for bad, word in ((call.source + atomic, atomic.split("(")[0]),
                      ("#include <stdio.h>\n" + call.source, "#include"),
                      (call.source.replace("acc = 0.0f;", "acc = out_shape[0];"), "out_shape")):
        with pytest.raises(harness.SubsetError, match=word):
            harness.check_subset(dataclasses.replace(call, source=bad))


def test_emulation_stops_threads_that_leave_before_a_collective(emulator):
    """A lane that returns before the simdgroup reduction would leave the others waiting (or
    summing undefined lanes) on a GPU: the emulator refuses the launch."""
    call, inputs, _ = _matvec_case("metal", quant.Q2_K, (1, 1, 256, 1))
    early = dataclasses.replace(call, source=call.source.replace("float acc = 0.0f;", "float acc = 0.0f;\n"
                                                                 "    if (lane == 3) {\n        return;\n    }"))
    with pytest.raises(harness.EmulationError, match="ended while the others wait"):
        emulator.run(early, inputs)


def test_emulated_backend_end_to_end(emulator, monkeypatch):
    """GpuExperts (its calls' inputs, shapes and geometry; the decode and the prefill routes;
    its self-check) with `gpu.run` served by the emulator instead of MLX's GPU."""

    def emulated_run(call, inputs):
        return [mx.array(o) for o in emulator.run(call, [np.array(a) for a in inputs])]

    monkeypatch.setattr(gpu, "run", emulated_run)
    monkeypatch.setenv(device.KERNELS_ENV, "gpu")  # the kernel set a GPU runs (device ids, no host reads)
    qtype, e, d_out, d_in = quant.IQ2_XXS, 8, 12, 512
    raw = _blocks(qtype, e, d_out, d_in, seed=3)
    w = _dequantised(raw, qtype, (e, d_out, d_in)).astype(np.float64)
    for backend in BACKENDS:
        assert gpu.self_check.__wrapped__(qtype, backend) is None
        ex = gpu.GpuExperts(raw, qtype, (e, d_out, d_in), backend=backend)
        rng = np.random.default_rng(5)
        for n, k, per_slot in ((1, 6, False), (2, 6, True), (5, 2, False)):  # matvec, matvec, dequant
            x = rng.standard_normal((n, k, d_in) if per_slot else (n, d_in)).astype(np.float32)
            ids = rng.integers(0, e, (n, k))
            got = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
            xs = x if per_slot else np.broadcast_to(x[:, None, :], (n, k, d_in))
            want = np.einsum("nkoi,nki->nko", w[ids], xs.astype(np.float64))
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_emulated_gpu_check_expert_rows(emulator, monkeypatch, capsys):
    """bench/gpu_check.py's expert-kernel rows, with the kernels emulated (a small shape): what a
    lent GPU runs, dry-run here, so the script's own checks are right before a GPU sees them."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setattr(gpu, "run", lambda call, inputs: [
        mx.array(o) for o in emulator.run(call, [np.array(a) for a in inputs])])
    monkeypatch.setattr(gpu_check, "_median_time", lambda fn, repeats=20: (mx.eval(fn()), 1e-3)[1])
    table = gpu_check.Table()
    gpu_check.expert_kernels(table, "cuda", d_out=8, d_in=512)
    rows = {r[0]: r for r in table.rows}
    for name in ("IQ2_XXS", "Q2_K", "Q4_K"):
        assert rows[f"experts {name}: self-check"][3] == "ok"
        assert rows[f"experts {name}: prefill kernel vs quant.py"][1:] == ("bit-exact", "bit-exact", "ok")
        assert rows[f"experts {name}: decode kernel error / bound"][3] == "ok"
        assert f"experts {name}: decode kernel (k=6, 8x512)" in rows
    assert not table.failed


def guarded_main(broken: bool) -> None:
    """Run every tail-shape case with each buffer ending at an inaccessible page (a child
    process: an access past a buffer's end kills it). broken: the prefill kernel's bound check
    off by one (`>=` -> `>`), which reads and writes one chunk past its buffers."""
    emu = harness.Emulator(harness.compiler())
    cases = [_matvec_case(b, t, (6, 37, 768, 12)) for b in BACKENDS for t in TYPES]
    cases += [_dequant_case(b, t, (6, 37, 768, 6)) for b in BACKENDS for t in TYPES]
    for call, inputs, _ in cases:
        if broken:
            call = dataclasses.replace(call, source=call.source.replace("if (c >= uint32_t(", "if (c > uint32_t("))
        emu.run(call, inputs, guard=True)
    print("guarded runs done")


def _guarded_child(broken: bool) -> subprocess.CompletedProcess:
    code = f"from tests.gpu.test_emulation import guarded_main; guarded_main({broken})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_emulated_kernels_stay_inside_their_buffers(emulator):
    r = _guarded_child(broken=False)
    assert r.returncode == 0 and "guarded runs done" in r.stdout, r.stderr[-2000:]
    r = _guarded_child(broken=True)  # the guard pages catch an off-by-one bound check
    assert r.returncode == -11, (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("kind", ["matvec", "dequant"])
def test_emulation_wraps_metal_source_as_mlx_does(kind, tmp_path, capfd):
    """The Metal translation unit the harness emulates is, character for character, the one the
    installed MLX generates (its metal_kernel prints it with verbose=True; exporting a function
    records a Metal kernel without a Metal device)."""
    if kind == "matvec":
        call, inputs, _ = _matvec_case("metal", quant.Q4_K, (6, 37, 768, 6))  # ids in constant memory
    else:
        call, inputs, _ = _dequant_case("metal", quant.IQ2_XXS, (256, 8, 512, 256))
    kernel = mx.fast.metal_kernel(name=call.name, input_names=list(call.input_names),
                                  output_names=list(call.output_names), source=call.source, header=call.header)

    def launch(*arrays):
        return kernel(inputs=list(arrays), template=list(call.template), grid=call.grid,
                      threadgroup=call.threadgroup, output_shapes=[list(s) for s in call.output_shapes],
                      output_dtypes=[getattr(mx, d) for d in call.output_dtypes], verbose=True)[0]

    try:
        mx.export_function(str(tmp_path / "k.mlxfn"), launch, *[mx.array(a) for a in inputs])
    except Exception as err:  # an MLX without export tracing of Metal kernels
        pytest.skip(f"tooling: this MLX ({mx.__version__}) cannot record a Metal kernel without Metal: {err}")
    printed = capfd.readouterr().out
    mlx_text = printed.split("```\n", 1)[1].rsplit("\n```", 1)[0]
    assert mlx_text == harness.metal_source(call, inputs)[1]


def test_emulation_without_a_compiler_finds_none(monkeypatch):
    """No compiler: the emulation tests skip with harness.NO_COMPILER instead of failing."""
    monkeypatch.setattr(harness.shutil, "which", lambda name: None)
    assert harness.compiler() is None
    assert "no C++ compiler" in harness.NO_COMPILER
