"""The fast CPU kernel set (engine/qmatrix.py, qkernels.py, fkernels.py) against its contract
(docs/numerics-fast-cpu.md): every product within the stated bound of the dequantised float32
product, deterministic, independent of the thread count and of the batch (decode = one-token
prefill), the routed experts equal to their experts' single products."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import ops, quant
from ds4agent.engine.config import test_config
from ds4agent.engine.device import cpu_parts
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.experts.fast import FastExperts
from ds4agent.engine.layout import tensor_table
from ds4agent.engine.qmatrix import (
    ExpertMatrix,
    QuantMatrix,
    QuantMatrixError,
    activation_error_bound,
    routed_ffn,
)
from ds4agent.testmodels import values as tm_values
from tests.weights.conftest import random_blocks
from tests.weights.quantmodel import _MAGNITUDE as MAGNITUDE
from tests.weights.quantmodel import Q2_TYPES, Q4_TYPES, quant_config

TYPES = (quant.Q8_0, quant.Q2_K, quant.Q4_K, quant.IQ2_XXS, quant.MXFP4)


def _matrix(rng, qtype: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw blocks, dequantised float32 [rows, cols]) of a random valid matrix."""
    block = quant.block_info(qtype)[0]
    raw = random_blocks(rng, qtype, rows * cols // block).reshape(-1)
    return raw, np.array(quant.dequantize(raw, qtype, (rows, cols)))


def _inputs(rng, n: int, cols: int) -> np.ndarray:
    # mixed magnitudes per block, a zero block and an exact tie of |max| (the awkward cases of
    # the activation rounding)
    x = (rng.standard_normal((n, cols)) * rng.choice([0.01, 1.0, 30.0], size=(n, 1))).astype(np.float32)
    if cols >= 64:
        x[0, :32] = 0.0
        x[-1, 40], x[-1, 41] = 1000.0, -1000.0
    return x


def _check_bound(qtype: int, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Assert |y - x W^T| <= the stated bound element-wise; return the largest ratio to it."""
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = activation_error_bound(qtype, w, x)
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err - bound))
    return float(np.max(err / np.maximum(bound, 1e-30)))


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
@pytest.mark.parametrize(("rows", "cols", "n"), [(1, 256, 1), (37, 512, 7), (19, 768, 1), (64, 1024, 3)])
def test_matmul_within_bound_of_dequantised_product(qtype, rows, cols, n):
    rng = np.random.default_rng(rows * 1000 + n)
    raw, w = _matrix(rng, qtype, rows, cols)
    m = QuantMatrix.from_blocks(raw, qtype, rows, cols)
    x = _inputs(rng, n, cols)
    y = m.matmul(x)
    assert y.shape == (n, rows) and y.dtype == np.float32
    _check_bound(qtype, w, x, y)


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
def test_batch_rows_equal_single_token_products_bit_for_bit(qtype):
    # 23 tokens: groups of 8, 8, 4, 3 of the row dots; every chunk size 1..8 on the way.
    rng = np.random.default_rng(5)
    raw, _ = _matrix(rng, qtype, 33, 512)
    m = QuantMatrix.from_blocks(raw, qtype, 33, 512)
    x = _inputs(rng, 23, 512)
    batch = m.matmul(x)
    for t in range(23):
        assert np.array_equal(m.matmul(x[t : t + 1])[0], batch[t])
    for n in range(2, 9):
        assert np.array_equal(m.matmul(x[3 : 3 + n]), batch[3 : 3 + n])  # a chunk of the batch


@pytest.mark.parametrize("qtype", [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.MXFP4], ids=quant.type_name)
@pytest.mark.parametrize("n", [8, 20, 40, 70])
def test_token_lanes_equal_single_token_products_bit_for_bit(qtype, n):
    # From LANES_MIN tokens (8; MXFP4 6) IQ2_XXS, Q2_K, Q4_K and MXFP4 rows meet 16 tokens per
    # vector, two rows per pass: 8, 20, 40 and 70 tokens take 1, 2, 3 and 4 + 1 token vectors
    # (70: a second tile of 6), and 33 rows end on a single row.
    from ds4agent.engine import fp4kernels, qkernels

    rng = np.random.default_rng(n)
    raw, _ = _matrix(rng, qtype, 33, 768)
    m = QuantMatrix.from_blocks(raw, qtype, 33, 768)
    x = _inputs(rng, n, 768)
    batch = m.matmul(x)
    assert (fp4kernels if qtype == quant.MXFP4 else qkernels).LANES_MIN <= n
    for t in range(n):
        assert np.array_equal(m.matmul(x[t : t + 1])[0], batch[t])


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
def test_results_do_not_depend_on_thread_count(qtype, monkeypatch):
    rng = np.random.default_rng(6)
    raw, _ = _matrix(rng, qtype, 300, 1024)
    m = QuantMatrix.from_blocks(raw, qtype, 300, 1024)
    x = _inputs(rng, 4, 1024)
    runs = []
    for parts in (1, 2, 3):
        monkeypatch.setattr("ds4agent.engine.device.cpu_parts", lambda p=parts: p)
        runs.append(m.matmul(x))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])
    assert np.array_equal(runs[0], m.matmul(x))  # deterministic


def _lane_order_product(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The dense contract's order, in numpy float32: 16 lane sums, then pairwise."""
    w32, x32 = w.astype(np.float32), x.astype(np.float32)
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for t in range(x.shape[0]):
        for r in range(w.shape[0]):
            lanes = np.zeros(16, np.float32)
            for c in range(w.shape[1]):
                lanes[c % 16] = lanes[c % 16] + w32[r, c] * x32[t, c]
            for width in (8, 4, 2, 1):
                lanes[:width] = lanes[:width] + lanes[width : 2 * width]
            out[t, r] = lanes[0]
    return out


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dense_matrix_sums_in_the_stated_order(dtype):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((5, 100)).astype(dtype)  # 100 = 6 full chunks of 16 and a tail of 4
    m = QuantMatrix.from_dense(w)
    # 6 tokens: a group of four that shares each weight load, then two alone
    x = rng.standard_normal((6, 100)).astype(np.float32)
    y = m.matmul(x)
    assert np.array_equal(y, _lane_order_product(w, x))
    _check_bound(0, w.astype(np.float32), x, y)
    for t in (1, 5):
        assert np.array_equal(m.matmul(x[t:t + 1])[0], y[t])
    assert m.nbytes == 5 * 100 * np.dtype(dtype).itemsize


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_long_dense_rows_in_column_tiles_keep_the_stated_order(dtype):
    # 1200 columns: tiles of 512, 512 and 176 (the lane sums carried from one to the next); 30
    # rows: more than one block of rows (f32: 13 rows of 4800 bytes in 64 KiB, f16: 27), rows
    # taken two a pass and each block's odd last row alone
    from ds4agent.engine import fkernels

    rng = np.random.default_rng(17)
    w = rng.standard_normal((30, 1200)).astype(dtype)
    x = rng.standard_normal((6, 1200)).astype(np.float32)
    assert 1200 > fkernels.COLUMN_TILE and 1200 % fkernels.COLUMN_TILE
    y = QuantMatrix.from_dense(w).matmul(x)
    assert np.array_equal(y, _lane_order_product(w, x))


def test_q8_0_matrix_reports_its_repacked_bytes():
    rng = np.random.default_rng(8)
    raw, _ = _matrix(rng, quant.Q8_0, 32, 64)
    assert QuantMatrix.from_blocks(raw, quant.Q8_0, 32, 64).nbytes == 32 * 64 + 32 * 2 * 2  # 34 per 32, as the file
    raw, _ = _matrix(rng, quant.Q8_0, 4, 64)
    assert QuantMatrix.from_blocks(raw, quant.Q8_0, 4, 64).nbytes == 16 * 64 + 16 * 2 * 2  # a padded group


def test_bad_inputs_are_refused_clearly():
    rng = np.random.default_rng(9)
    raw, _ = _matrix(rng, quant.Q2_K, 2, 256)
    with pytest.raises(QuantMatrixError, match="must be 168 uint8 bytes"):
        QuantMatrix.from_blocks(raw[:-1], quant.Q2_K, 2, 256)
    with pytest.raises(QuantMatrixError, match="multiple of 256"):
        QuantMatrix.from_blocks(raw, quant.Q2_K, 2, 300)
    m = QuantMatrix.from_blocks(raw, quant.Q2_K, 2, 256)
    with pytest.raises(QuantMatrixError, match=r"input must be \[n, 256\]"):
        m.matmul(np.zeros((1, 128), np.float32))
    with pytest.raises(QuantMatrixError, match="no fast CPU kernel"):
        QuantMatrix.from_blocks(raw, 2, 2, 256)


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
def test_routed_experts_equal_their_single_products(qtype):
    rng = np.random.default_rng(10)
    n_experts, rows, cols, n, k = 256, 24, 512, 5, 6
    raw, _ = _matrix(rng, qtype, n_experts * rows, cols)
    em = ExpertMatrix.from_blocks(raw, qtype, n_experts, rows, cols)
    ids = np.stack([rng.choice(n_experts, k, replace=False) for _ in range(n)])
    ids[1] = ids[0]  # two tokens on the same experts: grouped into one read
    x = _inputs(rng, n, cols)
    y = em.matmul(x, ids)
    x3 = _inputs(rng, n * k, cols).reshape(n, k, cols)
    y3 = em.matmul(x3, ids)
    for t in range(n):
        for j in range(k):
            single = em.expert(int(ids[t, j]))
            assert np.array_equal(y[t, j], single.matmul(x[t : t + 1])[0])
            assert np.array_equal(y3[t, j], single.matmul(x3[t, j : j + 1])[0])
    # one token (a decoded token: every pair its own expert, taken in selection order, not
    # grouped) gives the same bits as the same token inside the batch above
    for t in range(n):
        assert np.array_equal(em.matmul(x[t : t + 1], ids[t : t + 1])[0], y[t])
        assert np.array_equal(em.matmul(x3[t : t + 1], ids[t : t + 1])[0], y3[t])
    with pytest.raises(QuantMatrixError, match="out of range"):
        em.matmul(x, np.full((n, k), n_experts))


def test_fast_expert_backend_through_the_factory():
    rng = np.random.default_rng(11)
    raw, w = _matrix(rng, quant.IQ2_XXS, 8 * 16, 256)
    ex = quant_experts(raw.reshape(8, 16, -1), quant.IQ2_XXS, (8, 16, 256), backend="fast")
    x = _inputs(rng, 3, 256)
    ids = np.array([[0, 7], [3, 3], [5, 1]])
    out = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
    assert out.shape == (3, 2, 16)
    w3 = w.reshape(8, 16, 256)
    for t in range(3):
        for j in range(2):
            _check_bound(quant.IQ2_XXS, w3[ids[t, j]], x[t : t + 1], out[t, j][None])
    assert cpu_parts() >= 1


# 1 token: every pair its own expert (no regrouping); 4: 12 pairs sharing experts; 40: 120 pairs
# (routed_ffn keeps them grouped from gate to down, the separate calls regroup each time)
@pytest.mark.parametrize("n", [1, 4, 40])
def test_gate_up_pair_equals_two_calls_and_routed_ffn_composes_them(n):
    rng = np.random.default_rng(12)
    n_experts, dim, ffn, k = 16, 512, 256, 3
    gate = ExpertMatrix.from_blocks(_matrix(rng, quant.IQ2_XXS, n_experts * ffn, dim)[0], quant.IQ2_XXS,
                                    n_experts, ffn, dim)
    up = ExpertMatrix.from_blocks(_matrix(rng, quant.IQ2_XXS, n_experts * ffn, dim)[0], quant.IQ2_XXS,
                                  n_experts, ffn, dim)
    down = ExpertMatrix.from_blocks(_matrix(rng, quant.Q2_K, n_experts * dim, ffn)[0], quant.Q2_K,
                                    n_experts, dim, ffn)
    x = _inputs(rng, n, dim)
    ids = np.stack([rng.choice(n_experts, k, replace=False) for _ in range(n)])
    wts = rng.uniform(0.1, 1.0, (n, k)).astype(np.float32)
    g, u = gate.matmul_pair(up, x, ids)
    assert np.array_equal(g, gate.matmul(x, ids)) and np.array_equal(u, up.matmul(x, ids))
    clamp = 0.5
    from ds4agent.engine import fkernels

    mid = np.empty_like(g)
    fkernels.swiglu_weighted(g, u, wts, clamp, mid)
    # The host SwiGLU is ops.swiglu's formula; its exp is the C library's, not MLX's: last bits.
    reference = np.array(ops.swiglu(mx.array(g), mx.array(u), clamp) * mx.array(wts)[:, :, None])
    assert np.abs(mid - reference).max() <= 1e-6 * np.abs(reference).max()
    per_slot = down.matmul(mid, ids)
    want = per_slot[:, 0] + per_slot[:, 1] + per_slot[:, 2]
    assert np.array_equal(routed_ffn(gate, up, down, x, ids, wts, clamp), want)
    fast = [FastExperts(m.w, m.ggml_type, (m.n_experts, m.rows, m.cols)) for m in (gate, up, down)]
    got = routed_ffn(*(f.matrix for f in fast), x, ids, wts, clamp)  # the fast executor's call (fast_layers.routed)
    assert np.array_equal(got, want)
    pair = fast[0].gather_matmul_with(fast[1], mx.array(x), mx.array(ids))
    assert np.array_equal(np.array(pair[0]), g) and np.array_equal(np.array(pair[1]), u)


# The contract's measured agreement on the test models' own tensors (docs/numerics-fast-cpu.md):
# max over tokens of max |y - ref| / max |ref|, with gaussian activations.
REL_LIMIT = {"Q8_0": 0.02, "IQ2_XXS": 0.03, "Q2_K": 0.03, "Q4_K": 0.03, "F16": 1e-5}


def _relative(y: np.ndarray, ref: np.ndarray) -> float:
    return float((np.abs(y - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


@pytest.mark.parametrize("base", ["tiny", "small"])
def test_model_tensors_agree_with_the_dequantised_product(base):
    cfg = test_config(base)
    seen = set()
    for i, spec in enumerate(tensor_table(cfg)):
        # layers 0 and 2 (a hash and a compressed layer's kinds) and the head: every kind of matrix;
        # the small model's largest (its vocabulary-wide head) is left to the tiny one
        if len(spec.shape) != 2 or spec.ggml_type not in ("Q8_0", "F16") or spec.name == "token_embd.weight" \
                or (spec.name.startswith("blk.") and not spec.name.startswith(("blk.0.", "blk.2."))) \
                or spec.shape[0] * spec.shape[1] > 1 << 21:
            continue
        data = tm_values.encode(spec, tm_values.random_values(spec, cfg, np.random.default_rng(i)))
        rows, cols = spec.shape
        if spec.ggml_type == "Q8_0":
            m = QuantMatrix.from_blocks(data.reshape(-1), quant.Q8_0, rows, cols)
            w = np.array(quant.dequantize(data.reshape(-1), quant.Q8_0, (rows, cols)))
        else:
            m, w = QuantMatrix.from_dense(data), data.astype(np.float32)
        x = np.random.default_rng(1).standard_normal((3, cols)).astype(np.float32)
        y = m.matmul(x)
        _check_bound(m.ggml_type, w, x, y)
        assert _relative(y, x.astype(np.float64) @ w.T.astype(np.float64)) <= REL_LIMIT[spec.ggml_type], spec.name
        seen.add(spec.ggml_type)
    assert seen == {"Q8_0", "F16"}


@pytest.mark.parametrize("base", ["tiny", "small"])
@pytest.mark.parametrize("types", [Q2_TYPES, Q4_TYPES], ids=["q2", "q4"])
def test_model_expert_tensors_agree_with_the_dequantised_product(base, types):
    cfg = quant_config(base)
    rng = np.random.default_rng(2)
    for spec in tensor_table(cfg):
        if spec.role not in types or not spec.name.startswith("blk.0."):
            continue
        qtype = types[spec.role]
        n_experts, rows, cols = spec.shape
        raw = random_blocks(rng, qtype, n_experts * rows * cols // 256,
                            scale=0.5 / np.sqrt(cols) / MAGNITUDE[qtype]).reshape(-1)
        em = ExpertMatrix.from_blocks(raw, qtype, n_experts, rows, cols)
        w = np.array(quant.dequantize(raw, qtype, (n_experts, rows, cols)))
        x = rng.standard_normal((3, cols)).astype(np.float32)
        ids = np.stack([rng.choice(n_experts, cfg.n_experts_used, replace=False) for _ in range(3)])
        y = em.matmul(x, ids)
        for t in range(3):
            for j in range(ids.shape[1]):
                we = w[ids[t, j]]
                _check_bound(qtype, we, x[t : t + 1], y[t, j][None])
                ref = x[t : t + 1].astype(np.float64) @ we.T.astype(np.float64)
                assert _relative(y[t, j][None], ref) <= REL_LIMIT[quant.type_name(qtype)], spec.name


# ---- the contract's formulas, emulated in numpy float32 (written from ds4's portable C path) ----


def _ds4_q8_0_activations(x: np.ndarray):
    """ds4's quantize_q8_0_activation: d = amax/127, q = lrintf(x * (1/d)) clamped."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(blocks).max(axis=1) / np.float32(127.0)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint(blocks * inv[:, None]), -128, 127).astype(np.int64)
    return q.reshape(x.shape), d


def _ds4_q8_k_activations(x: np.ndarray):
    """ds4's ds4_quantize_row_q8_K: the first value of largest magnitude m, iscale = -127/m."""
    blocks = x.reshape(-1, 256).astype(np.float32)
    m = blocks[np.arange(len(blocks)), np.argmax(np.abs(blocks), axis=1)]
    iscale = np.where(m != 0, np.float32(-127.0) / np.where(m != 0, m, 1), 0).astype(np.float32)
    q = np.clip(np.rint(iscale[:, None] * blocks), -128, 127).astype(np.int64)
    d = np.where(m != 0, np.float32(1.0) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
    return q.reshape(x.shape), d


def _f16(b: np.ndarray) -> np.float32:
    return np.float32(b[:2].copy().view(np.float16)[0])


def _formula_row(qtype: int, row: np.ndarray, x: np.ndarray) -> np.float32:
    """One output of the fast product, step by step in float32 (docs/numerics-fast-cpu.md)."""
    acc = np.float32(0.0)
    if qtype == quant.MXFP4:  # fp4kernels.py: acc += (2^(e - 128) * xd) * isum, kv the doubled E2M1 values
        q, d = _ds4_q8_0_activations(x)
        kv = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int64)
        for b in range(len(d)):
            blk = row[17 * b : 17 * b + 17]
            s = int(np.dot(kv[np.concatenate([blk[1:] & 15, blk[1:] >> 4])], q[32 * b : 32 * b + 32]))
            dw = np.float32(np.ldexp(1.0, int(blk[0]) - 128))
            acc = np.float32(acc + np.float32(dw * d[b]) * np.float32(s))
        return acc
    if qtype == quant.Q8_0:
        q, d = _ds4_q8_0_activations(x)
        for b in range(len(d)):
            blk = row[34 * b : 34 * b + 34]
            s = int(np.dot(blk[2:].view(np.int8).astype(np.int64), q[32 * b : 32 * b + 32]))
            acc = np.float32(acc + np.float32(_f16(blk) * d[b]) * np.float32(s))
        return acc
    q, d = _ds4_q8_k_activations(x)
    size = quant.block_info(qtype)[1]
    w = np.array(quant.dequantize(row, qtype, (1, len(x))))[0]  # for the integer codes below
    for b in range(len(d)):
        blk, qb = row[size * b : size * (b + 1)], q[256 * b : 256 * (b + 1)]
        if qtype == quant.IQ2_XXS:
            # w = d * (0.5 + s) / 4 * signed grid: the integer (2s + 1) * grid = w * 8 / d exactly
            ints = np.rint(w[256 * b : 256 * (b + 1)] * 8 / _f16(blk)).astype(np.int64)
            acc = np.float32(acc + np.float32(_f16(blk) * d[b]) * np.float32(int(np.dot(ints, qb))))
            continue
        if qtype == quant.Q2_K:
            sc, mn = blk[:16] & 15, blk[:16] >> 4
            codes = np.concatenate([(blk[16 + 32 * h : 48 + 32 * h] >> (2 * s)) & 3 for h in range(2) for s in range(4)])
            scale_of = np.repeat(sc, 16).astype(np.int64)
            summs = int(np.dot(mn.astype(np.int64), qb.reshape(16, 16).sum(axis=1)))
            dd, dmin = _f16(blk[80:]), _f16(blk[82:])
        else:  # Q4_K
            s = blk[4:16].astype(np.int64)
            sc = np.array([s[j] & 63 if j < 4 else (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4) for j in range(8)])
            mn = np.array([s[j + 4] & 63 if j < 4 else (s[j + 4] >> 4) | ((s[j] >> 6) << 4) for j in range(8)])
            codes = np.concatenate([(blk[16 + 32 * c : 48 + 32 * c] >> (4 * p)) & 15 for c in range(4) for p in range(2)])
            scale_of = np.repeat(sc, 32)
            summs = int(np.dot(mn, qb.reshape(8, 32).sum(axis=1)))
            dd, dmin = _f16(blk[0:]), _f16(blk[2:])
        isum = int(np.dot(codes.astype(np.int64) * scale_of, qb))
        acc = np.float32(acc + np.float32(np.float32(d[b] * dd) * np.float32(isum) - np.float32(d[b] * dmin)
                                          * np.float32(summs)))
    return np.float32(0.125) * acc if qtype == quant.IQ2_XXS else acc


@pytest.mark.parametrize("qtype", TYPES, ids=quant.type_name)
# 13 tokens: a group of 8 and one of 5, or the token-lane kernels. 11 blocks a row: one or two
# tokens take the blocks in passes of 8 or 4 whose integer sums share a reduction, then the rest.
@pytest.mark.parametrize(("n", "cols"), [(1, 2816), (2, 2816), (3, 512), (13, 512)])
def test_products_follow_the_stated_formulas_bit_for_bit(qtype, n, cols):
    rng = np.random.default_rng(13)
    rows = 5
    raw, _ = _matrix(rng, qtype, rows, cols)
    x = _inputs(rng, n, cols)
    y = QuantMatrix.from_blocks(raw, qtype, rows, cols).matmul(x)
    per_row = raw.reshape(rows, -1)
    want = np.array([[_formula_row(qtype, per_row[r], x[t]) for r in range(rows)] for t in range(n)], np.float32)
    assert np.array_equal(y, want)


@pytest.mark.parametrize("qtype", [quant.Q2_K, quant.Q4_K, quant.IQ2_XXS], ids=quant.type_name)
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_row_dots_are_the_same_with_avx512_or_portable(qtype, n):
    """The K-quant and IQ2_XXS row dots, one row or (with up to PAIRED_TOKENS tokens) two at a
    time, with AVX-512 BW/VBMI instructions (IQ2_XXS's grid rows
    through the 2-bit code table, Q2_K's products looked up by a byte permute, the scaled sums
    by 16-bit multiply-adds: what this host's kernels use when it has them) and in portable IR
    (scalar grid loads, multiplies, the 4-way dot: every other host): the same bits. 64 rows:
    IQ2_XXS's 128 blocks look up 4,096 grid rows, nearly every one of the 256."""
    from numba import njit

    from ds4agent.engine import qkernels
    from ds4agent.engine.qmatrix import Activations

    rng = np.random.default_rng(23)
    rows, cols = 64, 512
    raw, _ = _matrix(rng, qtype, rows, cols)
    x = _inputs(rng, n, cols)
    want = QuantMatrix.from_blocks(raw, qtype, rows, cols).matmul(x)
    act = Activations(x, "q8_k")
    per_row = np.ascontiguousarray(raw.reshape(rows, -1))
    grid = np.ascontiguousarray(quant.iq2xxs_tables()[0].astype(np.uint8)).view(np.uint64).reshape(-1)
    scale = np.float32(0.125) if qtype == quant.IQ2_XXS else np.float32(1.0)  # as the kernels' caller

    def runner(row_dots, nrows):
        @njit
        def run(per_row, xq, xd, xs, res, n):
            nb, nbs = xq.shape[1] // 256, xs.shape[1]
            out = np.empty((n, per_row.shape[0]), np.float32)
            for r in range(0, per_row.shape[0], nrows):
                row_dots(per_row, r * per_row.shape[1], per_row.shape[1], nb, grid, xq, 0, xq.shape[1], xd, 0, xs, 0,
                         nbs, res, n)
                for k in range(nrows):
                    for t in range(n):
                        out[t, r + k] = scale * res[8 * k + t]
            return out

        return run

    for vbmi in [False] + ([True] if qkernels.VBMI else []):
        for nrows in [1] + ([2] if n <= qkernels.PAIRED_TOKENS else []):
            got = runner(qkernels.row_dots_with(qtype, vbmi, nrows), nrows)(per_row, act.xq, act.xd, act.xs,
                                                                            np.zeros(16, np.float32), n)
            assert np.array_equal(got, want), f"vbmi={vbmi} nrows={nrows}"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("blocks", [1, 13, 16])
def test_mxfp4_rows_of_any_block_count_follow_the_formula_with_avx512_or_portable(n, blocks):
    """MXFP4 rows go in passes of 8 or 4 blocks decoded four at a time, then single pairs, then
    an odd last block (13 blocks: a pass, then the rest), one row at a time or, with up to four
    tokens, two rows at a time: every way gives the stated formula's bits, with the AVX-512 VBMI
    byte permute for the magnitudes and with the portable compares and selects. Scale bytes 0
    and 1 (subnormal half scales) and 254 included."""
    from numba import njit

    from ds4agent.engine import fp4kernels
    from ds4agent.engine.qmatrix import Activations

    rng = np.random.default_rng(100 * n + blocks)
    rows, cols = 6, 32 * blocks
    raw, _ = _matrix(rng, quant.MXFP4, rows, cols)
    per_row = np.ascontiguousarray(raw.reshape(rows, -1))
    per_row[0, 0], per_row[1, 0], per_row[2, 0] = 0, 1, 254
    x = _inputs(rng, n, cols)
    with np.errstate(over="ignore"):  # scale 254 times a large input: inf, as in the kernels
        want = np.array([[_formula_row(quant.MXFP4, per_row[r], x[t]) for r in range(rows)] for t in range(n)],
                        np.float32)
    assert np.array_equal(QuantMatrix.from_blocks(per_row.reshape(-1), quant.MXFP4, rows, cols).matmul(x), want)
    act = Activations(x, "q8_0")

    def runner(row_dots, nrows):
        @njit
        def run(per_row, xq, xd, res, n):
            nb = xq.shape[1] // 32
            out = np.empty((n, per_row.shape[0]), np.float32)
            for r in range(0, per_row.shape[0], nrows):
                row_dots(per_row, r * per_row.shape[1], per_row.shape[1], nb, xq, 0, xq.shape[1], xd, 0, res, n)
                for k in range(nrows):
                    for t in range(n):
                        out[t, r + k] = res[8 * k + t]
            return out

        return run

    for vbmi in [False] + ([True] if fp4kernels.VBMI else []):
        for nrows in [1] + ([2] if n <= fp4kernels.PAIRED_TOKENS else []):
            got = runner(fp4kernels.row_dots_with(vbmi, nrows), nrows)(per_row, act.xq, act.xd,
                                                                       np.zeros(16, np.float32), n)
            assert np.array_equal(got, want), f"vbmi={vbmi} nrows={nrows}"


@pytest.mark.parametrize("n", [6, 20])
@pytest.mark.parametrize("blocks", [1, 13, 16])
def test_mxfp4_token_lanes_of_any_block_count_follow_the_formula(n, blocks):
    """MXFP4 rows meeting their tokens 16 to a vector (from fp4kernels.LANES_MIN tokens: 6 fill
    part of one vector, 20 two) decode their blocks four at a time, then one by one (13 blocks:
    three fours and one; 1: only the one): every way gives the stated formula's bits, scale
    bytes 0 and 1 (subnormal half scales) and 254 included; 7 rows end on a single row."""
    from ds4agent.engine import fp4kernels

    assert fp4kernels.LANES_MIN <= n
    rng = np.random.default_rng(10 * n + blocks)
    rows, cols = 7, 32 * blocks
    raw, _ = _matrix(rng, quant.MXFP4, rows, cols)
    per_row = np.ascontiguousarray(raw.reshape(rows, -1))
    per_row[0, 0], per_row[1, 0], per_row[2, 17 * (blocks - 1)] = 0, 1, 254
    x = _inputs(rng, n, cols)
    with np.errstate(over="ignore"):  # scale 254 times a large input: inf, as in the kernels
        want = np.array([[_formula_row(quant.MXFP4, per_row[r], x[t]) for r in range(rows)] for t in range(n)],
                        np.float32)
    got = QuantMatrix.from_blocks(per_row.reshape(-1), quant.MXFP4, rows, cols).matmul(x)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("blocks", [1, 13, 16])
def test_mxfp4_token_lanes_are_the_same_with_avx512_or_portable(blocks):
    """The MXFP4 rows16 intrinsics, one row or two at a time, their weights decoded with the
    AVX-512 VBMI byte permute (this host's, where it has it) and in portable IR (a host with
    VNNI but not VBMI): the same bits as the product (the row dots' formula)."""
    from numba import njit

    from ds4agent.engine import fp4kernels
    from ds4agent.engine.qmatrix import Activations

    rng = np.random.default_rng(blocks)
    rows, cols, n = 6, 32 * blocks, 20
    raw, _ = _matrix(rng, quant.MXFP4, rows, cols)
    per_row = np.ascontiguousarray(raw.reshape(rows, -1))
    x = _inputs(rng, n, cols)
    want = QuantMatrix.from_blocks(per_row.reshape(-1), quant.MXFP4, rows, cols).matmul(x)
    act = Activations(x, "q8_0")
    interleave = fp4kernels.lanes_interleave

    def runner(rows16, nrows):
        @njit
        def run(per_row, xq, xd):
            n, cols = xq.shape
            nq = cols // 4
            nb, nv = nq // 8, (n + 15) // 16
            xi = np.empty((nv, nq, 16), np.uint32)
            xdi = np.empty((nv, nb, 16), np.float32)
            interleave(xq.view(np.uint32), xd, 0, n, xi, xdi)
            res = np.empty(32 * nv, np.float32)
            wrow, info = np.empty(2 * nb * 32, np.int8), np.empty(2 * nb * 2, np.int32)
            out = np.empty((n, per_row.shape[0]), np.float32)
            for r in range(0, per_row.shape[0], nrows):
                rows16(per_row, r * per_row.shape[1], per_row.shape[1], nb, xi, xdi, nv, res, wrow, info)
                for k in range(nrows):
                    for t in range(n):
                        out[t, r + k] = res[16 * nv * k + t]
            return out

        return run

    for vbmi in [False] + ([True] if fp4kernels.VBMI else []):
        for nrows in (1, 2):
            got = runner(fp4kernels.rows16_with(vbmi, nrows), nrows)(per_row, act.xq, act.xd)
            assert np.array_equal(got, want), f"vbmi={vbmi} nrows={nrows}"


def test_kernel_modules_carry_the_digest_of_the_ir_they_inline():
    # numba's cache of a kernel module is kept while that file is unchanged; the IR its kernels
    # inline comes from qir.py, so each carries qir.py's SHA-256: a change to qir.py fails here
    # until the kernel modules' line changes too (and with it their caches).
    import hashlib
    from pathlib import Path

    from ds4agent.engine import fkernels, fp4kernels, q8kernels, qir, qkernels

    digest = hashlib.sha256(Path(qir.__file__).read_bytes()).hexdigest()
    assert [m.QIR_DIGEST for m in (qkernels, q8kernels, fkernels, fp4kernels)] == [digest] * 4


@pytest.mark.parametrize("kind", ["q8_0", "q8_k"])
def test_a_prompts_activations_rounded_over_the_cores_are_the_one_row_codes(kind, monkeypatch):
    from ds4agent.engine import device, q8kernels
    from ds4agent.engine.qmatrix import Activations, row_cuts

    monkeypatch.setattr(device, "cpu_parts", lambda: 3)
    x = _inputs(np.random.default_rng(5), 41, 2048)
    assert row_cuts(41, x.size).shape[0] == 4  # split three ways
    act = Activations(x, kind)
    for t in (0, 13, 40):
        one = Activations(x[t:t + 1], kind)
        assert np.array_equal(act.xq[t:t + 1], one.xq) and np.array_equal(act.xd[t:t + 1], one.xd)
        assert np.array_equal(act.xs[t:t + 1], one.xs)
    xq, xd, xs = np.empty_like(act.xq), np.empty_like(act.xd), np.empty_like(act.xs)
    rounding = q8kernels.quantize_q8_0 if kind == "q8_0" else q8kernels.quantize_q8_k
    rounding(x, xq, xd, xs)  # every row on one thread
    assert np.array_equal(act.xq, xq) and np.array_equal(act.xd, xd) and np.array_equal(act.xs, xs)
