"""Metal expert kernels.

Two layers of checks:
  * everywhere with a C compiler: the kernels' chunk decoders (the Metal header, transliterated
    mechanically to C) equal gguf's dequantisation bit for bit, with and without FMA contraction;
    this checks the kernel source's byte/bit indexing on machines without a GPU;
  * on a Metal device: the real kernels (dequant bit-exact, mat-vec and the backend within f32
    tolerance, automatic selection).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import quant
from ds4agent.engine.experts import metal as metal_experts
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.experts.portable import QuantExperts
from tests.weights.conftest import random_blocks

TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K]


def _has_metal() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:
        return False


needs_metal = pytest.mark.skipif(
    not _has_metal(), reason="hardware: no Metal GPU on this machine (mx.metal.is_available() is false)"
)

_C_PRELUDE = """
#include <stdint.h>
#include <string.h>
typedef unsigned int uint; typedef unsigned short ushort;
static float ds4_h(ushort b) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
"""
_C_DRIVER = """
void run(int t, const uint8_t* blocks, int nb, int bs, float* out, const float* grid, const uint8_t* ks) {
  for (int b = 0; b < nb; b++) for (uint j = 0; j < 8; j++) {
    const uint8_t* blk = blocks + b * bs; float* w = out + b * 256 + j * 32;
    if (t == 12) ds4_chunk_q4_k(blk, j, w, grid, ks);
    if (t == 10) ds4_chunk_q2_k(blk, j, w, grid, ks);
    if (t == 16) ds4_chunk_iq2_xxs(blk, j, w, grid, ks);
  }
}
"""


def _metal_header_as_c() -> str:
    src = metal_experts._HEADER
    src = src.replace(
        "as_type<half>(ushort(ushort(p[0]) | (ushort(p[1]) << 8)))",
        "ds4_h((ushort)(((ushort)p[0]) | (((ushort)p[1]) << 8)))",
    )
    assert "as_type" not in src
    src = src.replace("device ", "").replace("thread float*", "float*").replace("inline ", "static ")
    for t in ("ushort", "uint", "float"):
        src = src.replace(f"{t}(", f"({t})(")
    return _C_PRELUDE + src + _C_DRIVER


@pytest.fixture(scope="module")
def c_kernels(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("tooling: no C compiler to build the transliterated kernel source")
    d = tmp_path_factory.mktemp("metal_c")
    (d / "k.c").write_text(_metal_header_as_c())
    libs = {}
    for contract in ("off", "fast"):
        so = d / f"k_{contract}.so"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-ffp-contract={contract}", "-o", str(so), str(d / "k.c")],
                       check=True, capture_output=True)
        libs[contract] = ctypes.CDLL(str(so))
    return libs


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_kernel_chunk_decoders_bit_exact_as_c(c_kernels, rng, qtype):
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, 400, scale=0.9)
    raw[:5] = random_blocks(rng, qtype, 5, scale=60000.0)  # large finite scales
    want = gguf_dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(-1)
    grid, ksigns = quant.iq2xxs_tables()
    for lib in c_kernels.values():
        out = np.zeros(400 * 256, np.float32)
        lib.run(qtype, raw.ctypes.data_as(ctypes.c_void_p), 400, size, out.ctypes.data_as(ctypes.c_void_p),
                grid.ctypes.data_as(ctypes.c_void_p), ksigns.ctypes.data_as(ctypes.c_void_p))
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_auto_selection_follows_the_hardware(rng):
    raw = random_blocks(rng, quant.Q4_K, 4).reshape(2, 2, 144)
    ex = quant_experts(raw, quant.Q4_K, (2, 2, 256))
    assert isinstance(ex, metal_experts.MetalExperts) == _has_metal()
    assert type(quant_experts(raw, quant.Q4_K, (2, 2, 256), backend="portable")) is QuantExperts


@needs_metal
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_metal_self_check_passes(qtype):
    assert metal_experts.self_check(qtype) is None


@needs_metal
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_metal_dequant_bit_exact(rng, qtype):
    e, d_out, d_in = 3, 16, 512
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, e * d_out * d_in // 256, scale=0.5)
    want = gguf_dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(e, d_out, d_in)
    ex = metal_experts.MetalExperts(raw.reshape(e, d_out, d_in // 256 * size), qtype, (e, d_out, d_in))
    got = np.array(ex.dequantize([2, 0]))
    assert np.array_equal(got.view(np.uint32), want[[2, 0]].view(np.uint32))


@needs_metal
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_metal_matvec_and_matmat_match_reference(rng, qtype):
    e, d_out, d_in = 6, 40, 1024
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, e * d_out * d_in // 256, scale=0.02)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(e, d_out, d_in).astype(np.float64)
    ex = metal_experts.MetalExperts(raw.reshape(e, d_out, d_in // 256 * size), qtype, (e, d_out, d_in))
    for n, k in ((1, 3), (33, 2)):  # mat-vec kernel, then dequantise + gather_mm
        x = rng.standard_normal((n, d_in)).astype(np.float32)
        ids = rng.integers(0, e, size=(n, k))
        got = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
        want = np.einsum("nkoi,ni->nko", ref[ids], x.astype(np.float64))
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_auto_falls_back_to_portable_when_the_kernel_check_fails(rng, monkeypatch):
    from ds4agent.engine.experts import base

    monkeypatch.setattr(base, "metal_available", lambda: True)
    monkeypatch.setattr(metal_experts, "self_check", lambda qtype: "the Q4_K Metal kernels failed: boom")
    raw = random_blocks(rng, quant.Q4_K, 4).reshape(2, 2, 144)
    with pytest.warns(RuntimeWarning, match="boom; using the portable MLX expert backend"):
        ex = quant_experts(raw, quant.Q4_K, (2, 2, 256))
    assert type(ex) is QuantExperts
    # and it says so: info and the status line name the backend and why
    assert ex.describe() == ("Q4_K", "portable MLX (Metal kernels failed self-check: the Q4_K Metal kernels "
                                     "failed: boom)")
    # Q8_0 experts never go to Metal (no kernel), so no check and no warning
    raw8 = random_blocks(rng, quant.Q8_0, 32).reshape(2, 2, 8 * 34)
    assert type(quant_experts(raw8, quant.Q8_0, (2, 2, 256))) is QuantExperts
