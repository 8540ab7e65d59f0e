"""The CUDA expert kernels compile to PTX with NVIDIA's runtime compiler (NVRTC, as MLX's CUDA
backend compiles them), wrapped exactly as MLX's cuda_kernel wraps them: a syntax and type check
of the CUDA sources that needs no GPU. Skips, saying why, where NVRTC is not installed."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import quant
from ds4agent.engine.experts import gpu
from tests.gpu import harness, nvrtc

TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K]


@pytest.fixture(scope="module")
def compiler():
    why = nvrtc.missing()
    if why:
        pytest.skip(why)
    return nvrtc.find()


def _flash_calls(qtype: int) -> list[tuple[gpu.KernelCall, list[np.ndarray]]]:
    """Decode (k = 6) and prefill calls at the Flash expert shape (4096 -> 2048)."""
    grid = np.zeros(2048, np.float32)
    w = np.zeros(16, np.uint8)  # the signature depends on dtypes (and Metal's on sizes) only
    return [(gpu.matvec_call("cuda", qtype, 4096, 2048, 6), [w, np.zeros(6 * 4096, np.float32),
                                                              np.zeros(6, np.uint32), grid]),
            (gpu.dequant_call("cuda", qtype, 4096, 2048, 16), [w, np.zeros(16, np.uint32), grid])]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_cuda_kernels_compile_to_ptx_with_nvrtc(compiler, qtype):
    for call, inputs in _flash_calls(qtype):
        name, source = harness.cuda_source(call, inputs)
        ptx = compiler.ptx(source, name)
        assert ".entry" in ptx and name in ptx
        if "matvec" in name:
            assert "shfl.sync.bfly" in ptx  # the warp reduction compiled to butterfly shuffles


def test_nvrtc_reports_a_broken_cuda_kernel(compiler):
    call, inputs = _flash_calls(quant.Q4_K)[0]
    name, source = harness.cuda_source(call, inputs)
    with pytest.raises(nvrtc.NvrtcError, match="identifier \"acc_\" is undefined"):
        compiler.ptx(source.replace("acc += __shfl", "acc_ += __shfl"), name)
