"""ds4's native MXFP4 experts (ggml type 39): the block table, the bit-exact dequantiser, the
lossless re-lay into MLX's mxfp4 and the backend that multiplies them with MLX's gather_qmm; the
fast CPU set's in-place backend (its kernels' own tests: tests/engine/test_qmatrix.py)."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.base import dense_experts, describe_experts, quant_experts
from ds4agent.engine.experts.fast import FAST_HOW, FastExperts
from ds4agent.engine.experts.mxfp4 import Mxfp4Experts
from ds4agent.engine.gguf import GGML_TYPES
from ds4agent.engine.qmatrix import activation_error_bound
from ds4agent.testmodels.values import mxfp4_blocks

REF = gguf.GGMLQuantizationType.MXFP4


def _blocks(rng: np.random.Generator, n: int, *, e=(118, 127)) -> np.ndarray:
    """n random MXFP4 blocks [n, 17]: random codes, scale bytes drawn from range(*e)."""
    raw = rng.integers(0, 256, (n, 17), dtype=np.uint8)
    raw[:, 0] = rng.integers(e[0], e[1], n)
    return raw


def test_type_39_is_ggml_mxfp4_with_17_byte_blocks_of_32():
    assert quant.MXFP4 == int(REF) == 39
    assert GGML_TYPES[39] == ("MXFP4", 32, 17)
    assert gguf.GGML_QUANT_SIZES[REF] == (32, 17)


def test_dequantiser_equals_gguf_bit_for_bit_on_every_scale_and_code():
    rng = np.random.default_rng(0)
    raw = _blocks(rng, 255 * 4, e=(0, 1))
    raw[:, 0] = np.repeat(np.arange(255, dtype=np.uint8), 4)  # every scale but 255, subnormals included
    raw[:16, 1:] = (np.arange(16, dtype=np.uint8) * 17)[:, None]  # every code in both nibbles
    with np.errstate(over="ignore"):  # scale 254 times code 6 is inf, in ggml as here
        want = gguf.quants.dequantize(raw.reshape(-1), REF).reshape(-1, 64)
    got = np.array(quant.dequantize(raw, quant.MXFP4, (len(raw) // 2, 64)))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # code 8 is +0 in both


def test_relay_into_mlx_mxfp4_is_lossless():
    rng = np.random.default_rng(1)
    raw = _blocks(rng, 3 * 5 * 4, e=(1, 254))
    shape = (3, 5, 128)
    wq, scales = quant.mxfp4_to_mlx(raw.reshape(-1), shape)
    assert wq.dtype == np.uint32 and wq.shape == (3, 5, 16) and scales.shape == (3, 5, 4)
    assert np.array_equal(scales.reshape(-1), raw[:, 0])  # the scale bytes themselves
    want = gguf.quants.dequantize(raw.reshape(-1), REF).reshape(shape)
    got = np.array(mx.dequantize(mx.array(wq), mx.array(scales), group_size=32, bits=4, mode="mxfp4",
                                 dtype=mx.float32))
    # Every value equal; only MLX's code 8 keeps the sign of its zero (-0 == +0 in every product).
    assert np.array_equal(got, want)
    assert np.all((got.view(np.uint32) == want.view(np.uint32)) | (want == 0))


def test_scale_byte_255_and_a_wrong_size_are_refused():
    raw = _blocks(np.random.default_rng(2), 4)
    raw[3, 0] = 255
    with pytest.raises(quant.QuantError, match="scale byte 255"):
        quant.mxfp4_to_mlx(raw, (2, 64))
    with pytest.raises(quant.QuantError, match="must be 68 bytes"):
        quant.mxfp4_to_mlx(raw[:3], (2, 64))
    with pytest.raises(EngineError, match=r"MXFP4 experts \[1, 2, 64\]: .*scale byte 255"):
        quant_experts(raw, quant.MXFP4, (1, 2, 64))


def test_test_model_encoder_writes_ggml_blocks_and_mxfp4_values_reencode_exactly():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 96)).astype(np.float32) * 0.05
    blocks = mxfp4_blocks(w)
    assert blocks.shape == (6, 3 * 17)
    ref = gguf.quants.dequantize(blocks.reshape(-1), REF).reshape(6, 96)
    # the nearest code under ggml's scale choice (amax in [4, 8) scale units): within half the
    # largest code step (2, between 4 and 6) of the scale, or clipped to 6 from below 8
    scale = np.ldexp(1.0, blocks.reshape(6, 3, 17)[..., 0].astype(int) - 127)[..., None]
    err = np.abs(ref - w).reshape(6, 3, 32)
    assert np.all((err <= scale) | ((np.abs(ref).reshape(6, 3, 32) == 6 * scale) & (err < 2 * scale)))
    assert np.array_equal(mxfp4_blocks(ref), blocks)


@pytest.mark.parametrize("backend", ["auto", "portable", "gpu"])
def test_mxfp4_runs_on_mlx_gather_qmm_outside_the_fast_cpu_set(backend):
    raw = _blocks(np.random.default_rng(4), 2 * 3 * 2)
    ex = quant_experts(raw, quant.MXFP4, (2, 3, 64), backend=backend)
    assert type(ex) is Mxfp4Experts and ex.mode == "mxfp4" and not ex.maps_file()
    assert ex.describe() == ("mxfp4", "via MLX gather_qmm")
    assert describe_experts([ex, ex]) == "mxfp4 via MLX gather_qmm"


def test_the_fast_cpu_set_reads_mxfp4_in_place_on_its_own_kernels():
    """The fast CPU set's backend takes MXFP4 as it takes the K-quants: the blocks stay in the
    file's map (no re-laid copy), multiplied by fp4kernels within the fast set's bound of the
    exact product of the same weights."""
    rng = np.random.default_rng(4)
    raw = _blocks(rng, 4 * 8 * 4)
    ex = quant_experts(raw, quant.MXFP4, (4, 8, 128), backend="fast")
    assert type(ex) is FastExperts and ex.maps_file() and ex.describe() == ("MXFP4", FAST_HOW)
    w = np.array(quant.dequantize(raw, quant.MXFP4, (4, 8, 128)))
    x = rng.standard_normal((3, 128)).astype(np.float32)
    ids = np.array([[0, 3], [2, 1], [3, 3]], np.int32)
    got = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
    for t in range(3):
        for j in range(2):
            bound = activation_error_bound(quant.MXFP4, w[ids[t, j]], x[t : t + 1])[0]
            assert np.all(np.abs(got[t, j] - w[ids[t, j]].astype(np.float64) @ x[t]) <= bound)


def test_tensors_sharing_one_region_share_one_backend():
    raw = _blocks(np.random.default_rng(5), 2 * 3 * 2)
    shared: dict = {}
    a = quant_experts(raw, quant.MXFP4, (2, 3, 64), shared=shared)
    assert quant_experts(raw, quant.MXFP4, (2, 3, 64), shared=shared) is a and len(shared) == 1


# The MXFP4 backend's numerics contract (docs/numerics-mxfp4.md): MLX's product of the exact
# weights, per output, against the exact (float64) product of the same weights, relative to
# sum |w||x|. Measured on these and Flash-width shapes: at most 1.3e-7 (the in-order float32
# dense product: 3.9e-7, so against that one 4.2e-7); a wrong code or nibble costs ~1e-1.
PRODUCT_BOUND = 1e-6


@pytest.mark.parametrize("n,k,d_in,d_out,n_experts", [(1, 6, 512, 64, 256), (5, 2, 96, 33, 8), (17, 4, 256, 64, 16)])
def test_products_agree_with_the_exact_product_of_the_dequantised_weights(n, k, d_in, d_out, n_experts):
    rng = np.random.default_rng(n)
    raw = _blocks(rng, n_experts * d_out * d_in // 32)
    ex = quant_experts(raw, quant.MXFP4, (n_experts, d_out, d_in))
    w = np.array(quant.dequantize(raw, quant.MXFP4, (n_experts, d_out, d_in)))
    assert np.array_equal(np.array(ex.dequantize(np.arange(n_experts))), w)
    dense = dense_experts(w)
    ids = np.stack([rng.permutation(n_experts)[:k] for _ in range(n)]).astype(np.int32)
    for xs in (rng.standard_normal((n, d_in)), rng.standard_normal((n, k, d_in))):  # shared or per slot
        xs = xs.astype(np.float32)
        x = mx.array(xs)
        got = np.array(ex.gather_matmul(x, mx.array(ids)))
        assert got.shape == (n, k, d_out)
        xf = np.broadcast_to(xs[:, None, :] if xs.ndim == 2 else xs, (n, k, d_in)).astype(np.float64)
        exact = np.einsum("nkoi,nki->nko", w[ids].astype(np.float64), xf)
        mag = np.einsum("nkoi,nki->nko", np.abs(w[ids]).astype(np.float64), np.abs(xf))
        assert np.all(np.abs(got - exact) <= PRODUCT_BOUND * mag)
        dense_got = np.array(dense.gather_matmul(x, mx.array(ids)))
        assert np.all(np.abs(got - dense_got) <= 2 * PRODUCT_BOUND * mag)
        # a row's result does not depend on the rows sharing the call
        one = np.array(ex.gather_matmul(x[n - 1 : n], mx.array(ids[n - 1 : n])))
        assert np.array_equal(one[0], got[n - 1])


def test_a_wrong_nibble_order_would_be_caught():
    """The product test's bound sees a re-lay that swaps the two nibble halves (the classic
    mistake: ggml's j / j+16 split read as MLX's 2k / 2k+1 pairs)."""
    rng = np.random.default_rng(9)
    raw = _blocks(rng, 8 * 16 * 2)
    shape = (8, 16, 64)
    w = np.array(quant.dequantize(raw, quant.MXFP4, shape))
    wrong = np.array(mx.dequantize(mx.array(raw.reshape(8, 16, 2, 17)[..., 1:].reshape(8, 16, 32).copy().view("<u4")),
                                   mx.array(raw.reshape(8, 16, 2, 17)[..., 0].copy()), group_size=32, bits=4,
                                   mode="mxfp4", dtype=mx.float32))
    x = rng.standard_normal(64).astype(np.float32)
    mag = np.abs(w) @ np.abs(x)
    assert np.any(np.abs(wrong @ x - w @ x) > 1e3 * PRODUCT_BOUND * mag)
