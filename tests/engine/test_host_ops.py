"""The fast CPU executor's host primitives (engine/host_ops.py) against ops.EXACT's MLX ones:
the same bits where the step is exact arithmetic (RMSNorm with its float64 mean, RoPE, the fp8
simulation), the last bits of exp where a C library's exp differs from MLX's (SwiGLU, softplus),
and row-local (a row's result whatever other rows share the call)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import host_mixing, host_ops, ops
from ds4agent.engine.executors.reference import ReferenceExecutor


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def _rows(rng, shape) -> np.ndarray:
    # rows of very different magnitudes, one all-zero block (the fp8 amax floor)
    x = rng.standard_normal(shape) * rng.uniform(0.01, 40.0, (*shape[:-1], 1))
    x = x.astype(np.float32)
    x.reshape(-1, shape[-1])[0, :64] = 0.0
    return x


def _mx(fn, *args, **kw) -> np.ndarray:
    return np.array(fn(*(mx.array(a) if isinstance(a, np.ndarray) else a for a in args), **kw))


def test_rms_norm_is_the_exact_ops_bit_for_bit(rng):
    x = _rows(rng, (6, 4096))
    w = rng.standard_normal(4096).astype(np.float32)
    for weight in (w, None):
        want = _mx(ops.rms_norm, x, weight, 1e-6)
        assert np.array_equal(np.array(host_ops.rms_norm(x, weight, 1e-6)), want)


def test_rope_is_the_exact_ops_bit_for_bit_with_per_position_tables(rng):
    n, half = 5, 32
    cos = rng.uniform(-1, 1, (n, half)).astype(np.float32)
    sin = rng.uniform(-1, 1, (n, half)).astype(np.float32)
    for shape in ((n, 512), (n, 8, 512), (n, 2 * half)):
        x = _rows(rng, shape)
        for inverse in (False, True):
            want = _mx(ops.rope_tail, x, cos, sin, inverse=inverse)
            got = np.array(host_ops.rope_tail(x, cos, sin, inverse=inverse))
            assert np.array_equal(got, want), (shape, inverse)
            # the untouched head of each row is x's own
            assert np.array_equal(got[..., : shape[-1] - 2 * half], x[..., : shape[-1] - 2 * half])


def test_fp8sim_is_the_exact_ops_bit_for_bit(rng):
    x = _rows(rng, (7, 3, 512))
    x[1, 1, 10] = 448.0 * 3  # clipped
    for dn in (448, 512):
        assert np.array_equal(np.array(host_ops.fp8sim(x, dn)), _mx(ops.fp8sim, x, dn))


def test_fp4sim_is_the_exact_ops_bit_for_bit(rng):
    x = _rows(rng, (5, 4, 128))
    x[0, 1, :32] = [0.25 * k for k in range(32)]  # amax 7.75: half-steps exactly at ties
    x[0, 2, :32] = 3.0  # amax an exact power-of-two multiple of 6's step
    x[2, 3, 5] = 1e30  # one huge value: the rest of its block rounds to zero
    assert np.array_equal(host_ops.fp4sim_np(x), _mx(ops.fp4sim, x))


def test_qat_agrees_with_the_reference(rng):
    """host_ops.qat (the Hadamard product in the dense kernels' lane order) against ops.qat (MLX's
    product): the products differ by float reassociation, so an fp4 code may move one step where
    a value sits on a rounding boundary; without the fp4 rounding, within float32 rounding."""
    x = _rows(rng, (3, 64, 128))
    exact = np.array(host_ops.qat(x, rounding=False))
    ref = _mx(ops.qat, x, rounding=False)
    np.testing.assert_allclose(exact, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    got, want = np.array(host_ops.qat(x)), _mx(ops.qat, x)
    assert (got == want).mean() > 0.999
    assert np.array_equal(got, host_ops.fp4sim_np(exact))


def test_exp_based_steps_agree_to_the_last_bits(rng):
    g, u = (rng.standard_normal((4, 2048)) * 5).astype(np.float32), (rng.standard_normal((4, 2048)) * 5).astype(np.float32)
    want = _mx(ops.swiglu, g, u, 7.0)
    got = np.array(host_ops.swiglu(g, u, 7.0))
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-6)
    assert np.all(np.abs(got) <= 7.0 * 7.0)  # the clamp applied
    z = (rng.standard_normal((4, 256)) * 15).astype(np.float32)
    np.testing.assert_allclose(np.array(host_ops.softplus(z)), _mx(ops.softplus, z), rtol=2e-6, atol=1e-30)


def test_hc_post_agrees_with_the_reference_and_is_row_local(rng):
    n, hc, E = 5, 4, 256
    R = rng.standard_normal((n, hc, E)).astype(np.float32)
    y = rng.standard_normal((n, E)).astype(np.float32)
    post = rng.uniform(0, 2, (n, hc)).astype(np.float32)
    C = rng.uniform(0, 1, (n, hc, hc)).astype(np.float32)
    want = np.array(ReferenceExecutor().hc_post(mx.array(R), mx.array(y), mx.array(post), mx.array(C)))
    got = host_mixing.hc_post(R, y, post, C)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    in_order = post[:, :, None] * y[:, None, :]  # ds4's order: from post·y, stream by stream
    for i in range(hc):
        in_order = in_order + C[:, i, :, None] * R[:, i, None, :]
    assert np.array_equal(got, in_order)
    for t in range(n):
        assert np.array_equal(host_mixing.hc_post(R[t:t + 1], y[t:t + 1], post[t:t + 1], C[t:t + 1]), got[t:t + 1])


@pytest.mark.parametrize("hc", [4, 3])
def test_sinkhorn_takes_the_array_formulations_steps_and_agrees_with_the_reference(rng, hc):
    n, iters, eps = 6, 20, 1e-6
    logits = (rng.standard_normal((n, hc, hc)) * 3).astype(np.float32)
    got = host_mixing.sinkhorn(logits, iters, eps)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))  # ops.sinkhorn_eager's steps as arrays
    c = e / e.sum(axis=-1, keepdims=True) + np.float32(eps)
    c = c / (c.sum(axis=-2, keepdims=True) + np.float32(eps))
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + np.float32(eps))
        c = c / (c.sum(axis=-2, keepdims=True) + np.float32(eps))
    assert got.dtype == np.float32 and np.array_equal(got, c)
    # exp is the C library's here and MLX's there: the last bits only
    np.testing.assert_allclose(got, _mx(ops.sinkhorn_eager, logits, iters, eps), rtol=1e-5, atol=1e-7)
    assert np.array_equal(host_mixing.sinkhorn(logits[2:3], iters, eps), got[2:3])  # row-local


def test_every_host_op_is_row_local(rng):
    """A row's result does not depend on the other rows of the call (decode = one-token prefill)."""
    x = _rows(rng, (6, 512))
    cos = rng.uniform(-1, 1, (6, 32)).astype(np.float32)
    sin = rng.uniform(-1, 1, (6, 32)).astype(np.float32)
    w = rng.standard_normal(512).astype(np.float32)
    calls = [
        lambda a, s: host_ops.rms_norm(a, w, 1e-6),
        lambda a, s: host_ops.fp8sim(a, 448),
        lambda a, s: host_ops.rope_tail(a, cos[s], sin[s]),
        lambda a, s: host_ops.swiglu(a, a[:, ::-1], 3.0),
        lambda a, s: host_ops.softplus(a),
        lambda a, s: host_ops.qat(a),
    ]
    for call in calls:
        whole = np.array(call(x, slice(0, 6)))
        for t in range(6):
            assert np.array_equal(np.array(call(x[t:t + 1], slice(t, t + 1))), whole[t:t + 1])


def test_host_ops_return_evaluated_mlx_arrays_and_take_either_kind(rng):
    x = _rows(rng, (2, 512))
    a = host_ops.rms_norm(mx.array(x), None, 1e-6)
    b = host_ops.rms_norm(x, None, 1e-6)
    assert isinstance(a, mx.array) and isinstance(b, mx.array)
    assert np.array_equal(np.array(a), np.array(b))


def test_the_fast_executor_s_host_attention_front_is_the_reference_plan_on_host_ops(tmp_path, rng):
    """fast_layers.attn_front (the fast executor's, host arrays end to end) gives the bits of the
    reference's attention front run with the same weights and host_ops.HOST: the same steps, in
    one place each, only without MLX nodes between them."""
    from ds4agent.engine import fast_layers, load_engine
    from ds4agent.engine.device import forced_kernel_set
    from ds4agent.engine.layers import rope_for
    from ds4agent.testmodels import make_test_model

    path = make_test_model(tmp_path / "tiny.gguf", "tiny", seed=5)
    with forced_kernel_set("cpu"):
        engine = load_engine(path, ctx=64, device="cpu")
    c = engine.config

    class HostPlan(ReferenceExecutor):
        ops = host_ops.HOST

    x = mx.array(rng.standard_normal((3, c.dim)).astype(np.float32))
    for layer in (0, 1):
        aw = engine.weights.layers[layer].attn
        cos, sin = rope_for(c).tables(c.ratios[layer] != 0, np.arange(5, 8))
        for rounding in (True, False):
            got = fast_layers.attn_front(aw, c, rounding, np.array(x), np.array(cos), np.array(sin))
            want = HostPlan().attn_front(aw, c, rounding, x, cos, sin)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(np.array(g), np.array(w))


def test_a_prompts_rows_split_over_the_cores_give_the_same_bits(rng, monkeypatch):
    """rms_normalised and hc_post take a prompt's rows on every core (from 64 Ki elements): each
    row's values are the one-row call's."""
    from ds4agent.engine import device, fkernels
    from ds4agent.engine.qmatrix import row_cuts

    monkeypatch.setattr(device, "cpu_parts", lambda: 3)
    x = _rows(rng, (37, 2048))
    assert row_cuts(37, x.size).tolist() == [0, 12, 24, 37]
    got = host_mixing.rms_normalised(x, 1e-6)
    want = np.empty_like(x)
    fkernels.rms_rows(x, 1e-6, want)
    assert np.array_equal(got, want)
    n, hc, E = 19, 4, 1024
    R = rng.standard_normal((n, hc, E)).astype(np.float32)
    y = rng.standard_normal((n, E)).astype(np.float32)
    post = rng.uniform(0, 2, (n, hc)).astype(np.float32)
    C = rng.uniform(0, 1, (n, hc, hc)).astype(np.float32)
    whole = host_mixing.hc_post(R, y, post, C)
    for t in (0, 9, 18):
        assert np.array_equal(whole[t:t + 1], host_mixing.hc_post(R[t:t + 1], y[t:t + 1], post[t:t + 1], C[t:t + 1]))
