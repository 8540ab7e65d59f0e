"""The GPU expert backend (engine/experts/gpu.py): which backend a tensor gets, the fallback when
the kernels fail their self-check, and, where MLX has a Metal or CUDA GPU, the real kernels
(the emulation tests, test_emulation.py, check the same sources on any machine)."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import quant
from ds4agent.engine.experts import base, gpu
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.experts.portable import QuantExperts
from tests.weights.conftest import random_blocks

TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K]

needs_gpu = pytest.mark.skipif(
    gpu.available_backend() is None, reason="hardware: MLX finds no Metal or CUDA GPU on this machine"
)


def test_auto_selection_follows_the_hardware(rng):
    raw = random_blocks(rng, quant.Q4_K, 4).reshape(2, 2, 144)
    ex = quant_experts(raw, quant.Q4_K, (2, 2, 256))
    assert isinstance(ex, gpu.GpuExperts) == (gpu.available_backend() is not None)
    assert type(quant_experts(raw, quant.Q4_K, (2, 2, 256), backend="portable")) is QuantExperts


def test_auto_falls_back_to_portable_when_the_kernel_check_fails(rng, monkeypatch):
    monkeypatch.setattr(gpu, "available_backend", lambda: "cuda")
    monkeypatch.setattr(gpu, "self_check", lambda qtype, backend: "the Q4_K CUDA kernels failed: boom")
    raw = random_blocks(rng, quant.Q4_K, 4).reshape(2, 2, 144)
    with pytest.warns(RuntimeWarning, match="boom; using the portable MLX expert backend"):
        ex = quant_experts(raw, quant.Q4_K, (2, 2, 256))
    assert type(ex) is QuantExperts
    # and it says so: info and the status line name the backend and why
    assert ex.describe() == ("Q4_K", "portable MLX (CUDA kernels failed self-check: the Q4_K CUDA kernels "
                                     "failed: boom)")
    # Q8_0 experts never go to the GPU kernels (none for it), so no check and no warning
    raw8 = random_blocks(rng, quant.Q8_0, 32).reshape(2, 2, 8 * 34)
    assert type(quant_experts(raw8, quant.Q8_0, (2, 2, 256))) is QuantExperts


def test_unknown_backend_and_type_are_refused(rng):
    raw = random_blocks(rng, quant.Q4_K, 4).reshape(2, 2, 144)
    with pytest.raises(base.EngineError, match="unknown expert backend 'metal'"):
        quant_experts(raw, quant.Q4_K, (2, 2, 256), backend="metal")
    with pytest.raises(base.EngineError, match="no GPU expert kernel for Q8_0"):
        gpu.matvec_call("cuda", quant.Q8_0, 256, 2, 1)


def test_kernel_sources_ship_as_package_data():
    for name in ("blocks.h", "prelude.metal", "prelude.cu", "matvec.metal", "matvec.cu", "dequant.metal",
                 "dequant.cu"):
        assert gpu.kernel_source(name).strip()


@needs_gpu
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_gpu_self_check_passes(qtype):
    assert gpu.self_check(qtype, gpu.available_backend()) is None


@needs_gpu
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_gpu_dequant_bit_exact(rng, qtype):
    e, d_out, d_in = 3, 16, 512
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, e * d_out * d_in // 256, scale=0.5)
    want = gguf_dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(e, d_out, d_in)
    ex = gpu.GpuExperts(raw.reshape(e, d_out, d_in // 256 * size), qtype, (e, d_out, d_in))
    got = np.array(ex.dequantize([2, 0]))
    assert np.array_equal(got.view(np.uint32), want[[2, 0]].view(np.uint32))


@needs_gpu
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_gpu_matvec_and_matmat_match_reference(rng, qtype):
    e, d_out, d_in = 6, 40, 1024
    size = quant.block_info(qtype)[1]
    raw = random_blocks(rng, qtype, e * d_out * d_in // 256, scale=0.02)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(e, d_out, d_in).astype(np.float64)
    ex = gpu.GpuExperts(raw.reshape(e, d_out, d_in // 256 * size), qtype, (e, d_out, d_in))
    for n, k in ((1, 3), (33, 2)):  # mat-vec kernel, then dequantise + gather_mm
        x = rng.standard_normal((n, d_in)).astype(np.float32)
        ids = rng.integers(0, e, size=(n, k))
        got = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
        want = np.einsum("nkoi,ni->nko", ref[ids], x.astype(np.float64))
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
