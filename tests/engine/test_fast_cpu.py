"""The fast CPU kernel set (the default on the CPU device) at model level: its contract
(docs/numerics-fast-cpu.md): agreement with the reference, decode = one-token prefill, resume
exact, deterministic. Its products alone: tests/engine/test_qmatrix.py."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ds4agent.engine import load_engine
from ds4agent.engine.device import forced_kernel_set
from ds4agent.testmodels import make_test_model

# ---- the contract at model level ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("fast") / "tiny.gguf", "tiny", seed=3)


@pytest.fixture(scope="module")
def engines(tiny_path):
    with forced_kernel_set("reference"):
        ref = load_engine(tiny_path, ctx=256, chunk=32, device="cpu")
    with forced_kernel_set("cpu"):
        fast = load_engine(tiny_path, ctx=256, chunk=32, device="cpu")
    return ref, fast


@pytest.fixture(scope="module")
def prompt():
    return [int(t) for t in np.random.default_rng(7).integers(100, 8000, size=40)]


def _decode(session, n: int) -> list[np.ndarray]:
    out = [session.logits.copy()]
    for _ in range(n):
        out.append(session.step(int(np.argmax(out[-1]))).copy())
    return out


def test_fast_set_agrees_with_the_reference(engines, prompt):
    """Prefill and decode (both with 8-bit activations, as ds4's CPU path) against the exact
    reference: the argmax of every position and the logits within the contract's bound."""
    ref, fast = engines
    a = ref.new_session().forward_all(prompt)
    b = fast.new_session().forward_all(prompt)
    agree = (a.argmax(-1) == b.argmax(-1)).mean()
    per_position = np.abs(b - a).max(-1) / np.abs(a).max(-1)
    print(f"prefill: argmax {agree:.3f}, per-position rel median {np.median(per_position):.2e},"
          f" within 1e-2: {(per_position <= 1e-2).mean():.3f}")
    # Random weights have near-ties in their routers: where the rounding decides one the other
    # way, that position's logits move by far more than rounding (as on the GPU set).
    # Measured on the tiny model: argmax 0.975, per-position median 1.9e-2 (8-bit activations at
    # every product of every layer; a wrong kernel moves every position by ~100%).
    assert agree >= 0.95
    assert np.median(per_position) <= 3e-2 and per_position.max() <= 0.1
    # Decode with 8-bit inputs, both fed the same tokens (a free-running decode diverges at the
    # first flipped near-tie and compares nothing after it).
    s_ref, s_fast = ref.new_session(), fast.new_session()
    s_ref.sync(prompt[:24])
    s_fast.sync(prompt[:24])
    want = np.array([s_ref.step(t).copy() for t in prompt[24:]])
    got = np.array([s_fast.step(t).copy() for t in prompt[24:]])
    per_step = np.abs(got - want).max(-1) / np.abs(want).max(-1)
    print(f"decode: argmax {(got.argmax(-1) == want.argmax(-1)).mean():.3f}, per-step rel median"
          f" {np.median(per_step):.2e}")
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    assert np.median(per_step) <= 3e-2  # 8-bit inputs at every product of every layer: measured 1.1e-2


def test_fast_decode_equals_a_one_token_prefill(engines, prompt):
    _, fast = engines
    a = fast.new_session()
    a.sync(prompt[:20])
    stepped = a.step(prompt[20])
    b = fast.new_session()
    b.sync(prompt[:20])
    b.sync(prompt[:21])  # the new token alone: a one-token chunk
    assert np.array_equal(stepped, b.logits)


def test_fast_set_resumes_exactly_and_repeats_itself(engines, prompt, tmp_path):
    from ds4agent.sessions import payload as pl

    _, fast = engines
    first = fast.new_session()
    first.sync(prompt)
    shape = pl.PayloadShape(**{f: getattr(fast.payload_shape(), f) for f in
                               ("n_layers", "head_dim", "indexer_dim", "vocab", "window", "ratios")})
    buf = io.BytesIO()
    n = pl.write_payload(buf, first.export_state(), shape)
    buf.seek(0)
    resumed = fast.new_session()
    resumed.import_state(pl.read_payload(buf, n, shape, fast.ctx))
    cont, again = _decode(first, 5), _decode(resumed, 5)
    assert all(np.array_equal(x, y) for x, y in zip(cont, again, strict=True))
    rerun = fast.new_session()
    rerun.sync(prompt)
    assert all(np.array_equal(x, y) for x, y in zip(_decode(rerun, 5), cont, strict=True))


def test_fast_set_is_chunk_invariant(engines, prompt):
    """Any chunk schedule gives the same bits on the fast set: every product and the attention
    compute a token's result from that token alone (fast_attention.py, qmatrix.py)."""
    _, fast = engines
    whole = fast.new_session()
    whole.sync(prompt)  # chunks of 32 + 8
    pieces = fast.new_session()
    for end in (7, 19, 20, 33, len(prompt)):
        pieces.sync(prompt[:end])
    assert np.array_equal(whole.logits, pieces.logits)
    for a, b in zip(whole._state.arrays(), pieces._state.arrays(), strict=True):
        assert np.array_equal(np.array(a), np.array(b))


def test_the_fast_set_prefills_in_chunks_of_at_most_512(tiny_path):
    """A 4096-token chunk would show no progress for half an hour at the Flash shape on a CPU;
    the fast set caps its chunk (chunk-invariant: the same bits), an explicit chunk still wins."""
    with forced_kernel_set("cpu"):
        assert load_engine(tiny_path, ctx=8192, device="cpu").chunk == 512
        assert load_engine(tiny_path, ctx=8192, chunk=1024, device="cpu").chunk == 1024
    with forced_kernel_set("reference"):
        assert load_engine(tiny_path, ctx=8192, device="cpu").chunk == 4096


@pytest.mark.parametrize("D", [512, 96, 80, 40])  # 64-column tiles, 16-column, and single columns
def test_weighted_rows_sum_is_the_plain_float32_sum_in_slot_order(D):
    """The attention's value sum keeps its accumulators in registers over the rows, by column tiles
    and heads four at a time; every element is still +0 then acc + e * key, row after row in slot
    order, each step rounded once: numpy's float32 loop gives the same bits (1 to 8 heads, empty
    slots skipped)."""
    from ds4agent.engine import fkernels

    rng = np.random.default_rng(21)
    R, S = 37, 29
    keys = rng.standard_normal((R, D)).astype(np.float32)
    slots = rng.integers(-1, R, size=S).astype(np.int32)
    e = rng.random((fkernels.HEAD_BLOCK, S)).astype(np.float32)
    for heads in range(1, fkernels.HEAD_BLOCK + 1):
        out = np.full((fkernels.HEAD_BLOCK, D), np.nan, np.float32)
        fkernels.weighted_rows_sum(keys, slots, 0, S, e, heads, out)
        want = np.zeros((heads, D), np.float32)
        for j, r in enumerate(slots):
            if r >= 0:
                want = want + e[:heads, j:j + 1] * keys[r]  # float32: product, then sum, each rounded
        assert np.array_equal(out[:heads], want)
        assert np.isnan(out[heads:]).all()  # rows beyond `heads` untouched
    # a reordered sum is not the same bits (the test can tell the order)
    rev = np.zeros(D, np.float32)
    for j in reversed(range(S)):
        if slots[j] >= 0:
            rev = rev + e[0, j] * keys[slots[j]]
    out = np.empty((1, D), np.float32)
    fkernels.weighted_rows_sum(keys, slots, 0, S, e, 1, out)
    assert not np.array_equal(out[0], rev)


@pytest.mark.parametrize("D", [64, 72])  # 72: columns past the last 16 (the scalar tail)
def test_attention_takes_a_querys_heads_together_with_each_heads_own_bits(D):
    """fkernels.attend_units reads each key row once for a block of a query's heads: every
    (query, head) unit's output is the bits of that unit computed alone, whatever block or range
    it falls in (10 heads: blocks of 8, taken two rows a pass with an odd row left or not, and of
    2, single dots; ranges split mid-query)."""
    from ds4agent.engine import fkernels

    rng = np.random.default_rng(17)
    n, H, R, S = 5, 10, 23, 12
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    keys = rng.standard_normal((R, D)).astype(np.float32)
    slots = rng.integers(-1, R, size=(n, S)).astype(np.int32)
    slots[2] = -1  # a query that sees nothing but its sink
    slots[0, :] = np.arange(S) % R  # an even number of rows seen
    slots[1, :3] = [-1, 4, -1]
    slots[1, 3:] = np.arange(S - 3) % R  # an odd number, one of them alone in its pass
    sinks = rng.standard_normal(H).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(np.float32(D)))
    whole = np.empty((n, H, D), np.float32)
    fkernels.attend_units(q, keys, slots, sinks, scale, whole, 0, n * H)
    alone = np.empty_like(whole)
    for u in range(n * H):
        fkernels.attend_units(q, keys, slots, sinks, scale, alone, u, u + 1)
    assert np.array_equal(whole, alone)
    split = np.empty_like(whole)
    fkernels.attend_units_split(q, keys, slots, sinks, scale, split, np.array([0, 7, 23, 50], np.int64))
    assert np.array_equal(split, whole)
    # one unit by the formula, in float64 (the kernel's float32 steps agree to rounding)
    t, h = 3, 6
    seen = [r for r in slots[t] if r >= 0]
    s = np.array([keys[r].astype(np.float64) @ q[t, h] for r in seen]) * float(scale)
    m = max(float(sinks[h]), *s)
    e = np.exp(s - m)
    want = (e @ keys[seen].astype(np.float64)) / (np.exp(float(sinks[h]) - m) + e.sum())
    np.testing.assert_allclose(whole[t, h], want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(whole[2], np.zeros((H, D), np.float32))  # sink only: nothing weighted


def test_attention_copies_only_the_compressed_rows_its_queries_see(monkeypatch):
    """fast_attention.attend hands the kernel the raw rows and only the compressed rows some query
    sees (a ratio-4 layer whose indexer prunes: 8 of 15 rows per query), renumbered in row order:
    the output is the bits of the kernel over the whole table with the rows' own numbers."""
    import mlx.core as mx

    from ds4agent.engine import fast_attention, fkernels, layers
    from ds4agent.engine.config import test_config

    c = test_config("tiny")
    rng = np.random.default_rng(23)
    n, H, D, W, K = 1, c.n_heads, c.head_dim, c.window, c.indexer_top_k
    r0, p0 = W, 60
    C = (p0 + n) // 4
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    k_all = rng.standard_normal((r0 + n, D)).astype(np.float32)
    comp = rng.standard_normal((C, D)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    iq = mx.array(rng.standard_normal((n, c.indexer_heads, c.indexer_dim)).astype(np.float32))
    iw = mx.array(rng.standard_normal((n, c.indexer_heads)).astype(np.float32))
    ikeys = mx.array(rng.standard_normal((C, c.indexer_dim)).astype(np.float32))
    tables = []

    def recording(q_, keys, slots, *rest):
        tables.append(keys.shape[0])
        return real(q_, keys, slots, *rest)

    real = fkernels.attend_units_split
    monkeypatch.setattr(fkernels, "attend_units_split", recording)
    got = fast_attention.attend(c, q, k_all, r0, p0, sinks, comp, 4, (np.array(iq), np.array(iw), np.array(ikeys)))
    monkeypatch.undo()

    n_vis = (np.arange(p0, p0 + n) + 1) // 4
    monkeypatch.setattr(layers, "index_scores", lambda a, b, k: mx.array(fast_attention.index_scores(
        np.array(a), np.array(b), np.array(k))))  # the reference's selection over the fast set's scores
    idx, valid = layers.indexer_slots(c, iq, iw, ikeys, n_vis, None)
    monkeypatch.undo()
    assert C > K and n_vis.max() > K
    raw = np.arange(n)[:, None] + np.arange(W)[None, :] + (r0 - W + 1)
    slots = np.concatenate([np.where(raw >= 0, raw, -1),
                            np.where(np.array(valid), np.array(idx) + r0 + n, -1)], axis=1).astype(np.int32)
    want = np.empty((n, H, D), np.float32)
    scale = np.float32(1.0 / np.sqrt(np.float32(D)))
    fkernels.attend_units(q, np.concatenate([k_all, comp]), slots, sinks, scale, want, 0, n * H)
    assert np.array_equal(got, want)
    assert tables == [r0 + n + K]  # the raw rows and the K rows the query sees, not all C


def test_index_scores_sum_the_heads_in_order_over_lane_order_dots():
    """fkernels.index_scores: score[t, c] = sum over heads in head order, from +0, of
    max(dot, 0) * w, each step rounded to float32, the dots in the dense lane order; the same bits
    whatever rows a range holds (10 heads: a block of eight and two alone; 13 rows: pairs and an
    odd one; 72 dims: a scalar tail). And against MLX's product (the reference's indexer): within
    float32 rounding."""
    import mlx.core as mx

    from ds4agent.engine import fast_attention, fkernels
    from ds4agent.engine.layers import index_scores

    rng = np.random.default_rng(29)
    n, Hi, Di, C = 3, 10, 72, 13
    q = rng.standard_normal((n, Hi, Di)).astype(np.float32)
    w = rng.standard_normal((n, Hi)).astype(np.float32)
    keys = rng.standard_normal((C, Di)).astype(np.float32)
    dots = np.empty((n * Hi, C), np.float32)
    fkernels.dense_rows(keys, q.reshape(n * Hi, Di), dots, 0, C)
    want = np.zeros((n, C), np.float32)
    for t in range(n):
        for c in range(C):
            for h in range(Hi):
                want[t, c] = np.float32(want[t, c] + np.float32(max(dots[t * Hi + h, c], np.float32(0)) * w[t, h]))
    whole = np.empty((n, C), np.float32)
    fkernels.index_scores(q, w, keys, whole, 0, C)
    assert np.array_equal(whole, want)
    split = np.empty((n, C), np.float32)
    fkernels.index_scores_split(q, w, keys, split, np.array([0, 5, 6, 13], np.int64))
    assert np.array_equal(split, want)
    reversed_heads = np.zeros((n, C), np.float32)
    for h in reversed(range(Hi)):
        reversed_heads += np.maximum(dots[h::Hi], 0) * w[:, h:h + 1]
    assert not np.array_equal(reversed_heads, want)  # the order is what the first check holds
    fast = fast_attention.index_scores(q, w, keys)
    assert np.array_equal(fast, want)
    ref = np.array(index_scores(mx.array(q), mx.array(w), mx.array(keys)))
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_the_fast_sets_indexer_selection_is_the_references_rule(monkeypatch):
    """fast_attention.top_rows (a partition on the host) picks what layers.indexer_slots (MLX's
    sorts) picks from the same scores: the K largest among the rows a query sees, ties to the
    lower row, in row order; here with many exact ties at the K-th value and rows past what a
    query sees scoring highest."""
    import mlx.core as mx

    from ds4agent.engine import layers
    from ds4agent.engine.config import test_config
    from ds4agent.engine.fast_attention import top_rows

    c = test_config("tiny")
    K, C = c.indexer_top_k, 40
    rng = np.random.default_rng(31)
    score = rng.integers(0, 4, size=(6, C)).astype(np.float32)  # values 0-3: ties everywhere
    score[:, 30:] = 9.0  # beyond what most queries see
    n_vis = np.array([K + 1, 12, 20, 29, 33, C])
    got = top_rows(score, n_vis, K)
    monkeypatch.setattr(layers, "index_scores", lambda *_: mx.array(score))
    idx, valid = layers.indexer_slots(c, mx.zeros((6, 1, 1)), mx.zeros((6, 1)), mx.zeros((C, 1)), n_vis, None)
    assert np.array(valid).all()
    assert np.array_equal(got, np.array(idx))
    for q in range(6):  # and by the rule itself
        seen = score[q, :n_vis[q]]
        order = sorted(range(n_vis[q]), key=lambda r: (-seen[r], r))[:K]
        assert got[q].tolist() == sorted(order)


def test_the_host_plans_compressor_is_the_reference_steps_on_host_arrays(tiny_path):
    """fast_layers.compressor_step (numpy) against layers.compressor_step (MLX, on the same fast
    weights and host primitives), chunk after chunk, each carrying its own frontier: the frontiers
    are the same bits (copies of the same products and the filler), the pooled rows the same up to
    the last bits of exp, and the same number of rows at the same positions."""
    import mlx.core as mx

    from ds4agent.engine import fast_layers, host_ops, layers

    with forced_kernel_set("cpu"):
        engine = load_engine(tiny_path, ctx=256, device="cpu")
    c = engine.config
    rope = layers.rope_for(c)
    rng = np.random.default_rng(11)
    for layer, r in enumerate(c.ratios):
        if not r:
            continue
        cw = engine.weights.layers[layer].attn.compressor
        d = c.head_dim
        width = 2 * d if r == 4 else d
        fill = 8 if r == 4 else r
        host_kv = np.zeros((fill, width), np.float32)
        host_sc = np.full((fill, width), -1e30, np.float32)
        mlx_kv, mlx_sc = mx.array(host_kv), mx.array(host_sc)
        p0, rows_seen = 0, 0
        for n in (3, 1, 5, 16, 2, 1, 7):
            a = rng.standard_normal((n, c.dim)).astype(np.float32)

            def rope_host(rows, pos):
                cs, sn = rope.tables(True, pos)
                host_ops.rope_tail_inplace(rows, np.array(cs), np.array(sn))
                return rows

            def rope_mlx(rows, pos):
                cs, sn = rope.tables(True, pos)
                return host_ops.rope_tail(rows, cs, sn)

            got_rows, host_kv, host_sc = fast_layers.compressor_step(
                cw, a, p0, r, d, host_kv, host_sc, norm_eps=c.rms_eps, rope_fn=rope_host, finish=lambda x: x)
            want_rows, mlx_kv, mlx_sc = layers.compressor_step(
                host_ops.HOST, cw, mx.array(a), p0, r, d, mlx_kv, mlx_sc, norm_eps=c.rms_eps, rope_fn=rope_mlx,
                finish=lambda x: x)
            want = np.array(want_rows)
            assert got_rows.shape == want.shape == ((p0 + n) // r - p0 // r, d)
            np.testing.assert_allclose(got_rows, want, rtol=2e-6, atol=2e-6)
            assert np.array_equal(host_kv, np.array(mlx_kv)) and np.array_equal(host_sc, np.array(mlx_sc))
            rows_seen += got_rows.shape[0]
            p0 += n
        assert rows_seen == p0 // r > 0
