"""The CPU routed-expert kernels (engine/cpu_experts.py): gguf's weights, the in-order f32 sum."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import quant
from ds4agent.engine.experts import cpu as cpu_experts
from tests.weights.conftest import F16_FIELDS, GGML, random_blocks

TYPES = [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.Q8_0]


def _rows(rng, qtype, n_rows, d_in, scale=0.02):
    block, size, _ = quant.block_info(qtype)
    raw = random_blocks(rng, qtype, n_rows * d_in // block, scale=scale).reshape(n_rows, d_in // block * size)
    return raw, gguf_dequantize(raw, GGML[qtype]).reshape(n_rows, d_in)


def _in_order(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The in-order float32 dot products, one rounded product and one rounded sum at a time."""
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(w.shape[1]):
        acc += (x[:, k : k + 1] * w[None, :, k]).astype(np.float32)
    return acc


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
@pytest.mark.parametrize("n_rows", [1, 15, 16, 17, 40])  # part of the 16 lanes, all, one over, several
def test_products_are_the_in_order_sums_of_gguf_weights(rng, qtype, n_rows):
    d_in = 512
    raw, w = _rows(rng, qtype, n_rows, d_in)
    x = rng.standard_normal((3, d_in)).astype(np.float32)
    got = cpu_experts.products(raw, qtype, d_in, x)
    assert got.shape == (3, n_rows) and got.dtype == np.float32
    assert np.array_equal(got, _in_order(w, x))
    # the same bits as MLX's CPU product of the dequantised weights (what dense_experts computes)
    assert np.array_equal(got, np.array(mx.array(x) @ mx.array(w).T))
    # a row's result does not depend on the other rows or inputs in the call
    assert np.array_equal(cpu_experts.products(raw[n_rows - 1 :], qtype, d_in, x[1:2]), got[1:2, n_rows - 1 :])


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
def test_edge_scales_decode_like_gguf(rng, qtype):
    """f16 scale fields at their edges (+-0, subnormals, the smallest normal, 65504) decode and
    multiply like gguf's weights summed in order."""
    edges = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF], dtype=np.uint16)
    block, size, _ = quant.block_info(qtype)
    d_in = 256
    n_rows = 17
    blocks = random_blocks(rng, qtype, n_rows * d_in // block, scale=None)
    for off in F16_FIELDS[qtype]:
        blocks[:, off : off + 2] = rng.choice(edges, len(blocks)).view(np.uint8).reshape(-1, 2)
    raw = blocks.reshape(n_rows, d_in // block * size)
    w = gguf_dequantize(raw, GGML[qtype]).reshape(n_rows, d_in)
    x = (rng.standard_normal((2, d_in)) * 1e-3).astype(np.float32)
    assert np.array_equal(cpu_experts.products(raw, qtype, d_in, x), _in_order(w, x))


def test_q8_0_rows_shorter_than_a_column(rng):
    """Q8_0 rows of 96 weights (3 blocks): the last accumulation column is partial."""
    raw, w = _rows(rng, quant.Q8_0, 20, 96)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    assert np.array_equal(cpu_experts.products(raw, quant.Q8_0, 96, x), _in_order(w, x))


def test_a_zero_sum_is_positive_zero_like_the_blas(rng):
    raw, _ = _rows(rng, quant.Q4_K, 3, 256)
    got = cpu_experts.products(raw, quant.Q4_K, 256, -np.zeros((1, 256), np.float32))
    assert np.array_equal(got, np.zeros((1, 3), np.float32)) and not np.signbit(got).any()


def test_products_of_memory_mapped_rows(rng, tmp_path):
    raw, w = _rows(rng, quant.IQ2_XXS, 8, 256)
    raw.tofile(tmp_path / "rows.bin")
    mm = np.memmap(tmp_path / "rows.bin", dtype=np.uint8, mode="r", shape=raw.shape)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    assert np.array_equal(cpu_experts.products(mm[2:7], quant.IQ2_XXS, 256, x), _in_order(w[2:7], x))


def test_bad_rows_and_inputs_are_refused():
    with pytest.raises(quant.QuantError, match=r"Q4_K rows of 256 weights must be uint8 \[R, 144\]"):
        cpu_experts.products(np.zeros((2, 143), np.uint8), quant.Q4_K, 256, np.zeros((1, 256), np.float32))
    with pytest.raises(quant.QuantError, match=r"expert inputs must be float32 \[n, 256\]"):
        cpu_experts.products(np.zeros((2, 144), np.uint8), quant.Q4_K, 256, np.zeros((1, 255), np.float32))
    with pytest.raises(quant.QuantError, match="no CPU expert product for Q4_1"):
        cpu_experts.products(np.zeros((2, 18), np.uint8), 3, 32, np.zeros((1, 32), np.float32))


