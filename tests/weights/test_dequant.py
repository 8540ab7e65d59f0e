"""Every MLX dequantiser equals gguf.quants.dequantize bit for bit (model.md §7, invariant 10)."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import quant
from tests.weights.conftest import F16_FIELDS, GGML, random_blocks

TYPES = [quant.Q8_0, quant.Q2_K, quant.Q4_K, quant.IQ2_XXS]

# f16 bit patterns at the edges: +-0, smallest subnormal, largest subnormal, smallest normal,
# 1.0, largest finite (65504), and their negatives.
EDGE_F16 = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x8001], dtype=np.uint16)


def _ours(raw: np.ndarray, qtype: int) -> np.ndarray:
    block = quant.block_info(qtype)[0]
    return np.array(quant.dequantize(raw, qtype, (raw.shape[0], block)))


def _same_bits(a: np.ndarray, b: np.ndarray, *, signed_zero: bool = True) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    if not signed_zero:  # affine d*u + (-128*d) yields +0 where d*q is -0: same value, same products
        a, b = a + np.float32(0), b + np.float32(0)
    # compare bit patterns so -0.0 vs 0.0 and NaN payload classes count; NaNs compare as NaNs
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b))
    assert np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_random_blocks_bit_exact(rng, qtype):
    raw = random_blocks(rng, qtype, 300, scale=None)  # raw f16 fields: any bits, incl. inf/nan
    with np.errstate(invalid="ignore", over="ignore"):
        want = gguf_dequantize(raw, GGML[qtype]).reshape(raw.shape[0], -1)
    _same_bits(_ours(raw, qtype), want)
    assert np.isfinite(want).sum() > want.size // 2  # the check covered real values


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_edge_scales_bit_exact(rng, qtype):
    n = len(EDGE_F16) ** len(F16_FIELDS[qtype])
    raw = random_blocks(rng, qtype, n, scale=None)
    fields = F16_FIELDS[qtype]
    combos = np.array(np.meshgrid(*[EDGE_F16] * len(fields), indexing="ij")).reshape(len(fields), -1)
    for off, vals in zip(fields, combos, strict=True):
        raw[:, off : off + 2] = vals.astype(np.uint16).view(np.uint8).reshape(-1, 2)
    # extreme bodies too (all scale/quant bytes 0xFF or 0x00) in the first two blocks
    body = np.ones(raw.shape[1], dtype=bool)
    for off in fields:
        body[off : off + 2] = False
    raw[0, body], raw[1, body] = 0xFF, 0x00
    want = gguf_dequantize(raw, GGML[qtype]).reshape(n, -1)
    assert np.isfinite(want).all()
    assert np.abs(want).max() > 1e4 and (want == 0).any()  # the edges were really exercised
    _same_bits(_ours(raw, qtype), want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: quant.type_name(t))
def test_tensor_shape_and_errors(rng, qtype):
    block, size, _ = quant.block_info(qtype)
    raw = random_blocks(rng, qtype, 3 * 2 * 2).reshape(3, 2, 2 * size)  # [experts, out, row_bytes]
    got = quant.dequantize(mx.array(raw), qtype, (3, 2, 2 * block))
    want = gguf_dequantize(raw.reshape(-1, size), GGML[qtype]).reshape(3, 2, 2 * block)
    _same_bits(np.array(got), want)
    with pytest.raises(quant.QuantError, match="does not hold shape"):
        quant.dequantize(raw[:2], qtype, (3, 2, 2 * block))
    with pytest.raises(quant.QuantError, match="multiple of"):
        quant.row_bytes(qtype, block + 1)


def test_iq2xxs_sign_table_parity():
    grid, ksigns = quant.iq2xxs_tables()
    assert grid.shape == (256, 8) and set(np.unique(grid)) == {8.0, 25.0, 43.0}
    ref = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    assert np.array_equal(ksigns, ref)


class TestQ8Affine:
    def test_exact_against_gguf(self, rng):
        w = rng.standard_normal((48, 96)).astype(np.float32) * 3
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
        wq, s, b = quant.q8_0_to_affine(raw, (48, 96))
        assert wq.dtype == mx.uint32 and wq.shape == (48, 24) and s.shape == b.shape == (48, 3)
        deq = np.array(mx.dequantize(wq, s, b, group_size=32, bits=8))
        _same_bits(deq, gguf_dequantize(raw, GGML[quant.Q8_0]).reshape(48, 96), signed_zero=False)

    def test_random_and_edge_blocks_exact(self, rng):
        raw = random_blocks(rng, quant.Q8_0, 64, scale=None)
        raw[:len(EDGE_F16), :2] = EDGE_F16.view(np.uint8).reshape(-1, 2)
        raw[0, 2:] = 0x80  # q = -128 everywhere with d = 0
        raw[6, 2:] = 0x80  # q = -128 with d = 65504: -128*d overflows f16, must not overflow here
        raw[:, :2][np.isnan(raw[:, :2].copy().view(np.float16).astype(np.float32)).repeat(2, 1)] = 0
        raw[:, :2][np.isinf(raw[:, :2].copy().view(np.float16).astype(np.float32)).repeat(2, 1)] = 0
        wq, s, b = quant.q8_0_to_affine(raw, (4, 16 * 32))
        want = gguf_dequantize(raw, GGML[quant.Q8_0]).reshape(4, 512)
        assert want[0, 6 * 32] == np.float32(-128.0 * 65504.0)
        _same_bits(np.array(mx.dequantize(wq, s, b, group_size=32, bits=8)), want, signed_zero=False)

    def test_quantized_matmul_close_to_f32_product(self, rng):
        w = rng.standard_normal((40, 128)).astype(np.float32)
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
        wq, s, b = quant.q8_0_to_affine(raw, (40, 128))
        x = rng.standard_normal((5, 128)).astype(np.float32)
        y = np.array(mx.quantized_matmul(mx.array(x), wq, s, b, transpose=True, group_size=32, bits=8))
        ref = x.astype(np.float64) @ gguf_dequantize(raw, GGML[quant.Q8_0]).reshape(40, 128).T.astype(np.float64)
        assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())

    def test_wrong_size_is_a_clear_error(self):
        with pytest.raises(quant.QuantError, match="must be 68 bytes"):
            quant.q8_0_to_affine(np.zeros(70, np.uint8), (1, 64))
