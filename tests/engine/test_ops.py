"""Primitives (model.md §3, §10 item 9): rounding simulations against scalar code tables,
Hadamard against the popcount definition, RoPE/YaRN, Sinkhorn, RMSNorm."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import ops
from ds4agent.engine.config import flash_config, test_config
from tests.engine import reference as ref


def _f32(a) -> mx.array:
    return mx.array(np.asarray(a, dtype=np.float32))


def _grid_with_midpoints(table: np.ndarray, top: float) -> np.ndarray:
    """Every code value, every midpoint (the ties) and points just around them, both signs."""
    mids = (table[1:] + table[:-1]) / 2
    pts = np.concatenate([table, mids, np.nextafter(mids.astype(np.float32), np.float32(0)),
                          np.nextafter(mids.astype(np.float32), np.float32(np.inf)), [top]])
    pts = np.concatenate([pts, -pts]).astype(np.float32)
    return pts


def test_e4m3_matches_code_table_including_ties_and_subnormals():
    pts = _grid_with_midpoints(ref.E4M3_VALUES, 448.0)
    got = np.array(ops.e4m3(_f32(pts)))
    want = ref.nearest_code(ref.E4M3_VALUES, pts.astype(np.float64))
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize(("v", "want"), [
    (448.0, 448.0), (440.0, 448.0), (424.0, 416.0), (432.0, 448.0),  # 432: tie 416 (odd) | 448 (even)
    (2.0**-9, 2.0**-9), (1.5 * 2.0**-9, 2.0**-8), (2.5 * 2.0**-9, 2.0 * 2.0**-9),  # subnormal ties -> even
    (0.5 * 2.0**-9, 0.0), (1.0625, 1.0), (1.1875, 1.25), (-1.0625, -1.0), (0.0, 0.0),
])
def test_e4m3_scalar_cases(v, want):
    assert float(ops.e4m3(_f32([v]))[0]) == want


def test_e2m1_ties_go_to_the_even_code():
    cases = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0, 6.0: 6.0,
             0.3: 0.5, 5.1: 6.0, -2.5: -2.0, -0.25: 0.0}
    got = np.array(ops.e2m1(_f32(list(cases))))
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype=np.float32))
    pts = _grid_with_midpoints(ref.E2M1_VALUES, 6.0)
    np.testing.assert_array_equal(np.array(ops.e2m1(_f32(pts))),
                                  ref.nearest_code(ref.E2M1_VALUES, pts.astype(np.float64)).astype(np.float32))


def test_pow2_ceil_is_exact_at_and_around_powers_of_two():
    ys = np.array([1.0, 0.5, 3.0, 2.0**-20, np.nextafter(np.float32(4.0), np.float32(5)),
                   np.nextafter(np.float32(4.0), np.float32(0))], dtype=np.float32)
    got = np.array(ops.pow2_ceil(_f32(ys)))
    np.testing.assert_array_equal(got, [1.0, 0.5, 4.0, 2.0**-20, 8.0, 4.0])


def test_fp8sim_matches_reference_blocks_tail_and_amax_floor():
    rng = np.random.default_rng(0)
    dn, dr = 128, 16
    x = (rng.standard_normal(dn + dr) * np.repeat([3.0, 1e-3], [64, 64 + dr])).astype(np.float32)
    got = np.array(ops.fp8sim(_f32(x[None]), dn))[0]
    want = ref.fp8sim(x.astype(np.float64), dn)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    np.testing.assert_array_equal(got[dn:], x[dn:])  # rope tail untouched
    # all-zero block: the 1e-4 amax floor keeps it zero (no division by zero)
    z = np.zeros(dn + dr, dtype=np.float32)
    assert not np.any(np.array(ops.fp8sim(_f32(z[None]), dn)))
    # a tiny block below the floor rounds against scale 2^ceil(log2(1e-4/448))
    tiny = np.full(dn + dr, 1e-7, dtype=np.float32)
    np.testing.assert_array_equal(np.array(ops.fp8sim(_f32(tiny[None]), dn))[0],
                                  ref.fp8sim(tiny.astype(np.float64), dn).astype(np.float32))


def test_fp4sim_matches_reference_and_floor():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 64)) * np.array([[1.0], [100.0], [1e-30]])).astype(np.float32)
    got = np.array(ops.fp4sim(_f32(x)))
    for i in range(3):
        np.testing.assert_array_equal(got[i], ref.fp4sim(x[i].astype(np.float64)).astype(np.float32))
    assert not np.any(np.array(ops.fp4sim(mx.zeros((1, 32)))))


def test_f16_round_ties_to_even():
    one_ulp = 2.0**-10
    x = np.array([1 + one_ulp / 2, 1 + 1.5 * one_ulp, 65504.0, 70000.0], dtype=np.float32)
    got = np.array(ops.f16_round(_f32(x)))
    assert got[0] == 1.0 and got[1] == 1 + 2 * one_ulp and got[2] == 65504.0 and np.isinf(got[3])


def test_hadamard_matches_popcount_definition_and_is_orthonormal():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(32).astype(np.float32)
    got = np.array(ops.hadamard(_f32(x[None])))[0]
    np.testing.assert_allclose(got, ref.hadamard(x.astype(np.float64)), rtol=0, atol=1e-6)
    back = np.array(ops.hadamard(ops.hadamard(_f32(x[None]))))[0]
    np.testing.assert_allclose(back, x, atol=1e-6)


def test_yarn_lo_hi_for_flash_and_rope_inverse_is_identity():
    assert flash_config().yarn_lo_hi() == (15, 25)
    c = test_config("micro")
    lo, hi = c.yarn_lo_hi()
    freqs = ops.rope_freqs(c.rope_dim, c.compress_rope_base, yarn=(c.yarn_factor, lo, hi))
    pos = np.array([0, 1, 77, 5000])
    cos, sin = ops.rope_tables(freqs, pos)
    rng = np.random.default_rng(3)
    x = _f32(rng.standard_normal((4, c.head_dim)))
    y = ops.rope_tail(x, cos, sin)
    np.testing.assert_array_equal(np.array(y[:, : c.nope_dim]), np.array(x[:, : c.nope_dim]))
    np.testing.assert_allclose(np.array(ops.rope_tail(y, cos, sin, inverse=True)), np.array(x), atol=1e-5)
    # against the oracle's pairwise transcription
    r = ref.Reference(c, {}, rounding=True)
    for i, p in enumerate(pos):
        np.testing.assert_allclose(np.array(y[i]), r.rope(np.array(x[i], dtype=np.float64), int(p), True),
                                   atol=2e-5)


def test_sinkhorn_rows_and_columns_sum_to_one():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((5, 4, 4)).astype(np.float32)
    C = np.array(ops.sinkhorn(_f32(logits), 20, 1e-6))
    # the last step normalises columns: exact up to eps; rows converge (20 rounds)
    np.testing.assert_allclose(C.sum(axis=-2), 1.0, atol=1e-5)
    np.testing.assert_allclose(C.sum(axis=-1), 1.0, atol=1e-2)
    # and equals a float64 transcription of model.md §4.1 step 5
    want = np.exp(logits - logits.max(-1, keepdims=True)).astype(np.float64)
    want = want / want.sum(-1, keepdims=True) + 1e-6
    want = want / (want.sum(-2, keepdims=True) + 1e-6)
    for _ in range(19):
        want = want / (want.sum(-1, keepdims=True) + 1e-6)
        want = want / (want.sum(-2, keepdims=True) + 1e-6)
    np.testing.assert_allclose(C, want, atol=1e-6)


def test_rms_norm_and_softplus_branches():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    got = np.array(ops.rms_norm(_f32(x), _f32(w), 1e-6))
    for i in range(3):
        np.testing.assert_allclose(got[i], ref.rms_norm(x[i].astype(np.float64), w, 1e-6), rtol=2e-6, atol=1e-6)
    z = np.array([-30.0, -20.0, 0.0, 19.0, 25.0], dtype=np.float32)
    np.testing.assert_allclose(np.array(ops.softplus(_f32(z))),
                               [math.exp(-30), math.log1p(math.exp(-20)), math.log(2), math.log1p(math.exp(19)), 25.0],
                               rtol=1e-5)


@pytest.mark.parametrize("cpu_layout", [True, False])
def test_dense_linear_and_experts_layout_keeps_every_bit(cpu_layout, monkeypatch):
    """On CPU dense weights are stored transposed and contiguous (a faster BLAS path on the Linux
    wheel), elsewhere as [out, in]: either way the products must be the very bits of the textbook
    x @ W.T, row by row and batched, and `weight` must still read as the file's matrix."""
    from ds4agent.engine import device
    from ds4agent.engine.experts.base import dense_experts
    from ds4agent.engine.weights import Linear

    assert device.cpu_layout() == (mx.default_device() == mx.cpu)
    monkeypatch.setattr(device, "cpu_layout", lambda: cpu_layout)

    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 96)).astype(np.float16)
    lin = Linear(mx.array(w))
    assert lin.weight.shape == (48, 96) and np.array_equal(np.array(lin.weight), w.astype(np.float32))
    x = mx.array(rng.standard_normal((7, 96)).astype(np.float32))
    want = np.array(x @ mx.array(w.astype(np.float32)).T)
    assert np.array_equal(np.array(lin(x)), want)
    assert np.array_equal(np.array(lin(x[2:3])), want[2:3])
    part = lin.rows(16, 40)  # a row slice of the stored transpose (the grouped output LoRA)
    assert np.array_equal(np.array(part(x)), want[:, 16:40])

    we = rng.standard_normal((5, 24, 96)).astype(np.float32)
    ex = dense_experts(mx.array(we))
    assert np.array_equal(np.array(ex.w), we)
    ids = mx.array(np.array([[0, 4], [3, 3], [1, 2]], dtype=np.int32))
    got = np.array(ex.gather_matmul(x[:3], ids))
    for r, row in enumerate([[0, 4], [3, 3], [1, 2]]):
        for j, e in enumerate(row):
            assert np.array_equal(got[r, j], np.array(x[r:r + 1] @ mx.array(we[e]).T)[0])


def test_split_quantized_product_is_bit_identical(monkeypatch):
    """A large Q8_0 product on CPU is spread over CPU streams by output rows: the same bits as the
    one-op product for any number of input rows, from any thread."""
    import threading

    from ds4agent.engine import device, weights

    rng = np.random.default_rng(8)
    w = rng.standard_normal((1030, 512)).astype(np.float32) * 0.05
    wq, sc, bi = mx.quantize(mx.array(w), group_size=32, bits=8)
    monkeypatch.setattr(weights, "_PARALLEL_MIN_MACS", 1)
    monkeypatch.setattr(device, "cpu_parts", lambda: 3)
    split = weights.Linear(wq, sc, bi, in_features=512)
    assert len(split._parts) == 3 and sum(p[0].shape[0] for p in split._parts) == 1030
    for m in (1, 5):
        x = mx.array(rng.standard_normal((m, 512)).astype(np.float32))
        want = np.array(mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=32, bits=8))
        assert np.array_equal(np.array(split(x)), want)
        box: dict = {}
        worker = threading.Thread(target=lambda x=x, box=box: box.setdefault("y", np.array(split(x))))
        worker.start()
        worker.join()
        assert np.array_equal(box["y"], want)
    monkeypatch.setattr(device, "cpu_parts", lambda: 1)  # one core (or a GPU): one op
    assert weights.Linear(wq, sc, bi, in_features=512)._parts == ()
