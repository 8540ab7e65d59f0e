"""Expert backends: dense reference, portable quantised backend, grouping, chunk invariance."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from ds4agent.engine import EngineError, device, quant
from ds4agent.engine.experts.base import ExpertWeights, dense_experts, quant_experts
from ds4agent.engine.experts.portable import QuantExperts
from tests.weights.conftest import GGML, random_blocks

E, D_OUT, D_IN = 5, 24, 512


def _expert_raw(rng, qtype, e=E, d_out=D_OUT, d_in=D_IN):
    block, size, _ = quant.block_info(qtype)
    raw = random_blocks(rng, qtype, e * d_out * d_in // block, scale=0.02)
    ref = gguf_dequantize(raw, GGML[qtype]).reshape(e, d_out, d_in)
    return raw.reshape(e, d_out, d_in // block * size), ref


def _loop_reference(w: np.ndarray, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    n, k = ids.shape
    out = np.zeros((n, k, w.shape[1]), np.float64)
    for i in range(n):
        for j in range(k):
            xi = x[i] if x.ndim == 2 else x[i, j]
            out[i, j] = w[ids[i, j]].astype(np.float64) @ xi.astype(np.float64)
    return out


def test_dense_matches_loop_and_accepts_per_slot_inputs(rng):
    w = rng.standard_normal((E, D_OUT, 64)).astype(np.float32)
    ex = dense_experts(mx.array(w.astype(np.float16)))
    assert isinstance(ex, ExpertWeights) and (ex.n_experts, ex.d_out, ex.d_in) == (E, D_OUT, 64)
    w = w.astype(np.float16).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids = np.array([[0, 4], [2, 2], [1, 3]])
    got = np.array(ex.gather_matmul(mx.array(x), mx.array(ids)))
    assert got.shape == (3, 2, D_OUT) and got.dtype == np.float32
    np.testing.assert_allclose(got, _loop_reference(w, x, ids), rtol=1e-5, atol=1e-5)
    xs = rng.standard_normal((3, 2, 64)).astype(np.float32)
    got = np.array(ex.gather_matmul(mx.array(xs), mx.array(ids)))
    np.testing.assert_allclose(got, _loop_reference(w, xs, ids), rtol=1e-5, atol=1e-5)


def test_dense_rows_do_not_depend_on_the_chunk(rng):
    """Chunk invariance: a row's product is the same bits alone or inside a larger call."""
    w = mx.array(rng.standard_normal((E, D_OUT, 128)).astype(np.float32))
    ex = dense_experts(w)
    x = mx.array(rng.standard_normal((9, 128)).astype(np.float32))
    ids = mx.array(rng.integers(0, E, size=(9, 3)))
    whole = np.array(ex.gather_matmul(x, ids))
    rows = np.concatenate([np.array(ex.gather_matmul(x[i : i + 1], ids[i : i + 1])) for i in range(9)])
    assert np.array_equal(whole, rows)


def test_bad_calls_raise_engine_errors():
    ex = dense_experts(mx.zeros((2, 3, 4)))
    with pytest.raises(EngineError, match=r"expert input must be \[1, 4\]"):
        ex.gather_matmul(mx.zeros((1, 5)), mx.zeros((1, 2), dtype=mx.int32))
    with pytest.raises(EngineError, match="expert_ids must be"):
        ex.gather_matmul(mx.zeros((1, 4)), mx.zeros((2,), dtype=mx.int32))
    with pytest.raises(EngineError, match="not supported"):
        QuantExperts(np.zeros((1, 1, 18), np.uint8), 3, (1, 1, 32))
    with pytest.raises(EngineError, match="does not hold"):
        QuantExperts(np.zeros((2, 3, 10), np.uint8), quant.Q8_0, (2, 3, 32))


@pytest.mark.parametrize("qtype", [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.Q8_0],
                         ids=lambda t: quant.type_name(t))
def test_portable_backend_equals_dense_over_dequantised(rng, qtype):
    raw, ref = _expert_raw(rng, qtype)
    q = quant_experts(raw, qtype, (E, D_OUT, D_IN), backend="portable")
    dense = dense_experts(mx.array(ref))
    x = mx.array(rng.standard_normal((4, D_IN)).astype(np.float32))
    ids = mx.array(np.array([[0, 3], [3, 1], [4, 4], [2, 0]]))
    got = np.array(q.gather_matmul(x, ids))
    # same dequantised bits, same per-row products -> identical to the dense f32 reference
    assert np.array_equal(got, np.array(dense.gather_matmul(x, ids)))
    want = _loop_reference(ref, np.array(x), np.array(ids))
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    # decode shape: one row
    one = np.array(q.gather_matmul(x[:1], ids[:1]))
    assert np.array_equal(one, got[:1])


@pytest.fixture
def whole_expert_path(monkeypatch):
    """The whole-expert (GPU) path of QuantExperts, run here on the CPU: the same ops."""

    monkeypatch.setattr(device, "cpu_layout", lambda: False)


@pytest.fixture
def small_tiles(monkeypatch):
    """CPU kernel calls of 5 rows: several per expert, the last one short, none filling the
    kernel's 16 lanes."""
    from ds4agent.engine.experts import portable as experts_mod

    monkeypatch.setattr(experts_mod, "TILE_ROWS", 5)


def test_grouped_path_equals_single_group_and_reads_memmap(rng, tmp_path, whole_expert_path):
    qtype = quant.Q4_K
    raw, ref = _expert_raw(rng, qtype, e=7)
    path = tmp_path / "experts.bin"
    raw.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape)
    one_expert = D_OUT * D_IN * 4
    grouped = QuantExperts(mm, qtype, (7, D_OUT, D_IN), group_bytes=2 * one_expert)
    single = QuantExperts(mx.array(raw), qtype, (7, D_OUT, D_IN))
    assert grouped.group == 2 and single.group >= 7
    x = mx.array(rng.standard_normal((6, 3, D_IN)).astype(np.float32))  # per-slot inputs
    ids = mx.array(rng.integers(0, 7, size=(6, 3)))
    a = np.array(grouped.gather_matmul(x, ids))
    b = np.array(single.gather_matmul(x, ids))
    assert np.array_equal(a, b)
    want = _loop_reference(ref, np.array(x), np.array(ids))
    assert np.abs(a - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.array_equal(np.array(grouped.dequantize([5, 1])), ref[[5, 1]])


def test_out_of_range_expert_id(rng):
    raw, _ = _expert_raw(rng, quant.Q2_K, e=2)
    q = QuantExperts(raw, quant.Q2_K, (2, D_OUT, D_IN))
    with pytest.raises(EngineError, match="out of range"):
        q.gather_matmul(mx.zeros((1, D_IN)), mx.array([[2]]))


def test_grouped_path_with_shared_inputs(rng, whole_expert_path):
    """Shared input rows [N, d_in] through the grouped (prefill) path equal the single group."""
    qtype = quant.IQ2_XXS
    raw, ref = _expert_raw(rng, qtype, e=6)
    grouped = QuantExperts(raw, qtype, (6, D_OUT, D_IN), group_bytes=D_OUT * D_IN * 4)  # 1 expert/group
    single = QuantExperts(raw, qtype, (6, D_OUT, D_IN))
    x = mx.array(rng.standard_normal((5, D_IN)).astype(np.float32))
    ids = mx.array(rng.integers(0, 6, size=(5, 3)))
    assert grouped.group == 1
    assert np.array_equal(np.array(grouped.gather_matmul(x, ids)), np.array(single.gather_matmul(x, ids)))


@pytest.mark.parametrize("parts", [2, 3])
def test_parallel_cpu_streams_give_the_one_op_bits(rng, monkeypatch, small_tiles, parts):
    """With spare cores the portable backend splits the selected experts over CPU streams (and
    the grouped path runs its groups a round at a time): the same bits as one op on one stream,
    for decode and prefill shapes, from another thread too."""
    import threading


    qtype = quant.IQ2_XXS
    raw, ref = _expert_raw(rng, qtype, e=6)
    x = mx.array(rng.standard_normal((5, D_IN)).astype(np.float32))
    ids = mx.array(rng.integers(0, 6, size=(5, 3)))
    monkeypatch.setattr(device, "cpu_parts", lambda: 1)
    single = QuantExperts(raw, qtype, (6, D_OUT, D_IN))
    grouped = QuantExperts(raw, qtype, (6, D_OUT, D_IN), group_bytes=D_OUT * D_IN * 4)
    want = np.array(single.gather_matmul(x, ids))
    want_one = np.array(single.gather_matmul(x[:1], ids[:1]))
    assert np.array_equal(np.array(grouped.gather_matmul(x, ids)), want)
    monkeypatch.setattr(device, "cpu_parts", lambda: parts)
    assert np.array_equal(np.array(single.gather_matmul(x, ids)), want)  # split over streams
    assert np.array_equal(np.array(single.gather_matmul(x[:1], ids[:1])), want_one)  # decode
    assert np.array_equal(np.array(grouped.gather_matmul(x, ids)), want)  # rounds of groups
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("y", np.array(single.gather_matmul(x, ids))))
    worker.start()
    worker.join()
    assert np.array_equal(box["y"], want)


@pytest.mark.parametrize("qtype", [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.Q8_0],
                         ids=lambda t: quant.type_name(t))
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_cpu_tiles_equal_the_dense_product_bit_for_bit(rng, monkeypatch, small_tiles, qtype, parts):
    """The CPU path (tiles of rows, split over worker threads) gives the dense f32 product's bits
    for every call shape: more rows than experts, an expert repeated within a row, per-slot (3-D)
    inputs, and a row alone equals the same row inside a chunk (chunk invariance)."""

    monkeypatch.setattr(device, "cpu_parts", lambda: parts)
    raw, ref = _expert_raw(rng, qtype)
    q = quant_experts(raw, qtype, (E, D_OUT, D_IN), backend="portable")
    dense = dense_experts(mx.array(ref))
    n = 12  # > E experts: every expert serves several rows
    ids = rng.integers(0, E, size=(n, 3))
    ids[0] = [4, 4, 4]  # one expert in every slot of a row
    ids[1] = [1, 3, 1]
    ids = mx.array(ids)
    for x in (mx.array(rng.standard_normal((n, D_IN)).astype(np.float32)),
              mx.array(rng.standard_normal((n, 3, D_IN)).astype(np.float32))):
        got = np.array(q.gather_matmul(x, ids))
        assert got.shape == (n, 3, D_OUT)
        assert np.array_equal(got, np.array(dense.gather_matmul(x, ids)))
        for i in (0, 1, n - 1):
            assert np.array_equal(np.array(q.gather_matmul(x[i : i + 1], ids[i : i + 1])), got[i : i + 1])
        if x.ndim == 2:  # one input, one expert in every slot: three identical products
            assert np.array_equal(got[0, 0], got[0, 2]) and np.array_equal(got[1, 0], got[1, 2])


def test_cpu_path_reads_only_the_selected_experts(rng, tmp_path, small_tiles):
    """A memory-mapped tensor is read expert by expert, rows of the selected experts only."""
    qtype = quant.IQ2_XXS
    raw, ref = _expert_raw(rng, qtype, e=7)
    path = tmp_path / "experts.bin"
    raw.tofile(path)
    q = QuantExperts(np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape), qtype, (7, D_OUT, D_IN))

    class Recording:
        def __init__(self, arr):
            self.arr, self.keys = arr, []

        def __getitem__(self, key):
            self.keys.append(key)
            return self.arr[key]

    q.raw = Recording(q.raw)
    x = mx.array(rng.standard_normal((2, D_IN)).astype(np.float32))
    ids = mx.array([[5, 1], [1, 1]])
    got = np.array(q.gather_matmul(x, ids))
    assert q.raw.keys and all(isinstance(k, tuple) and k[0] in (1, 5) for k in q.raw.keys)
    assert sum(k[1].stop - k[1].start for k in q.raw.keys) == 2 * D_OUT  # each row of each once
    assert np.array_equal(got, np.array(dense_experts(mx.array(ref)).gather_matmul(x, ids)))


def test_cpu_tiles_at_flash_width_equal_the_dense_product(rng, monkeypatch):
    """At the real input width (4096, sums of 4096 products) rows that share an expert in one
    product still give the 1-row bits of the dense backend, across tiles and worker threads."""
    from ds4agent.engine.experts import portable as experts_mod

    monkeypatch.setattr(experts_mod, "TILE_ROWS", 3)
    monkeypatch.setattr(device, "cpu_parts", lambda: 2)
    for qtype in (quant.IQ2_XXS, quant.Q4_K):
        raw, ref = _expert_raw(rng, qtype, e=3, d_out=10, d_in=4096)
        q = QuantExperts(raw, qtype, (3, 10, 4096))
        x = mx.array(rng.standard_normal((5, 4096)).astype(np.float32))
        ids = mx.array([[0, 2], [2, 0], [2, 1], [0, 0], [2, 2]])
        want = np.array(dense_experts(mx.array(ref)).gather_matmul(x, ids))
        assert np.array_equal(np.array(q.gather_matmul(x, ids)), want)


def test_cpu_worker_errors_reach_the_caller_and_leave_the_workers_serving(rng, monkeypatch, small_tiles):
    from ds4agent.engine.experts import cpu as cpu_experts

    monkeypatch.setattr(device, "cpu_parts", lambda: 2)
    raw, ref = _expert_raw(rng, quant.Q2_K)
    q = QuantExperts(raw, quant.Q2_K, (E, D_OUT, D_IN))
    x = mx.array(rng.standard_normal((2, D_IN)).astype(np.float32))
    ids = mx.array([[0, 3], [3, 1]])
    real = cpu_experts.products

    def broken(*args):
        raise quant.QuantError("broken block")

    monkeypatch.setattr(cpu_experts, "products", broken)
    with pytest.raises(quant.QuantError, match="broken block"):
        q.gather_matmul(x, ids)
    monkeypatch.setattr(cpu_experts, "products", real)
    want = np.array(dense_experts(mx.array(ref)).gather_matmul(x, ids))
    assert np.array_equal(np.array(q.gather_matmul(x, ids)), want)


def test_cpu_workers_keep_nothing_of_a_finished_call(rng, monkeypatch, small_tiles):
    """Idle workers hold no reference to the last call's experts (their raw bytes can be freed)."""
    import gc
    import weakref


    monkeypatch.setattr(device, "cpu_parts", lambda: 2)
    raw, _ = _expert_raw(rng, quant.Q4_K)
    q = QuantExperts(raw, quant.Q4_K, (E, D_OUT, D_IN))
    mx.eval(q.gather_matmul(mx.ones((1, D_IN)), mx.array([[0, 2]])))
    gone = weakref.ref(q)
    del q
    gc.collect()
    assert gone() is None
