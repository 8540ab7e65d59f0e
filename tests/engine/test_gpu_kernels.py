"""The GPU kernel set, run on the CPU device (DS4AGENT_KERNELS=gpu), against the CPU reference.

The numerics contract of a GPU (architecture.md "Numerics per device"): on the oracle configs
the argmax agrees on >= 99% of positions and max |dlogit| <= 1e-2 * max |logit|, for every
chunk schedule; a session saved on one kernel set loads and continues on the other. The CPU
kernel set itself stays the bit-exact reference (test_model_oracle.py, test_chunking.py).
Also here: the router never yields an out-of-range expert id (the backends no longer check per
call), and a decoded token of the GPU kernel set reads nothing back from the device.
"""

from __future__ import annotations

import contextlib
import os

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import hostread, load_engine, quant
from ds4agent.engine.config import test_config
from ds4agent.engine.device import KERNELS_ENV, forced_kernel_set, kernel_set
from ds4agent.engine.errors import EngineError, TensorError
from ds4agent.engine.executors import executor_for
from ds4agent.engine.experts.portable import QuantExperts
from ds4agent.engine.model import Trace, forward
from ds4agent.engine.session import Engine
from ds4agent.engine.state import SessionState
from ds4agent.testmodels.random_weights import random_tensors, weights_from_tensors
from ds4agent.testmodels.writer import make_test_model
from tests.weights.conftest import random_blocks
from tests.weights.quantmodel import Q2_TYPES, quant_config, write_quant_model

ARGMAX_AGREEMENT = 0.99
REL_TOLERANCE = 1e-2


@contextlib.contextmanager
def kernels(name: str):
    """Build and run under one kernel set (the diagnostic switch), restoring the environment."""
    with forced_kernel_set(name):
        assert kernel_set() == name
        yield


def _assert_agree(ref: np.ndarray, got: np.ndarray) -> None:
    assert ref.shape == got.shape
    agree = float((ref.argmax(-1) == got.argmax(-1)).mean())
    rel = float(np.abs(ref - got).max() / np.abs(ref).max())
    assert agree >= ARGMAX_AGREEMENT, agree
    assert rel <= REL_TOLERANCE, rel


def _logits(cfg, tensors, toks, name: str) -> np.ndarray:
    with kernels(name):
        w = weights_from_tensors(cfg, tensors, quantize_q8=True)
        logits, _ = forward(w, cfg, SessionState.empty(cfg), toks)
        return np.array(logits)


ORACLE_CONFIGS = {
    "micro": (test_config("micro"), 60),
    "tiny": (test_config("tiny"), 40),
    "ratio-128": (test_config("micro", n_layers=2, ratios=(4, 128), swiglu_clamp=(10.0, 10.0), n_hash_layers=1,
                              window=128, indexer_top_k=16), 260),
    "flash-head": (test_config("micro", n_heads=2, head_dim=512, rope_dim=64, indexer_dim=128, out_groups=1,
                               out_lora_rank=32, indexer_heads=2, n_layers=3, ratios=(0, 4, 16),
                               swiglu_clamp=(10.0,) * 3, n_hash_layers=1, indexer_top_k=3), 33),
}


@pytest.mark.parametrize("name", list(ORACLE_CONFIGS))
def test_gpu_kernel_set_agrees_with_the_cpu_path_on_the_oracle_configs(name):
    cfg, n = ORACLE_CONFIGS[name]
    seeds = (0, 1) if name == "micro" else (3,)
    for seed in seeds:
        tensors = random_tensors(cfg, seed)
        toks = np.random.default_rng(seed + 1).integers(0, cfg.vocab, n).tolist()
        ref = _logits(cfg, tensors, toks, "reference")
        got = _logits(cfg, tensors, toks, "gpu")
        _assert_agree(ref, got)
        # it is a different kernel set, not the reference under another name
        assert not np.array_equal(ref, got)


@pytest.fixture(scope="module")
def micro_file(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("gpuk") / "micro.gguf", "micro", seed=7)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(4).integers(0, 512, 40).tolist()


def _load(path, name: str, chunk: int | None = None) -> Engine:
    with kernels(name):
        return load_engine(path, ctx=256, chunk=chunk, device="cpu")


def test_gpu_kernel_set_stays_within_bounds_across_chunk_sizes(micro_file, tokens):
    ref = _load(micro_file, "reference").new_session().forward_all(tokens)
    for chunk in (1, 5, 8, 40):
        engine = _load(micro_file, "gpu", chunk)
        with kernels("gpu"):
            got = engine.new_session().forward_all(tokens)
        _assert_agree(ref, got)


@pytest.mark.parametrize(("first", "then"), [("reference", "gpu"), ("gpu", "reference")])
def test_a_session_saved_on_one_kernel_set_continues_on_the_other(micro_file, tokens, first, then):
    saved_at = 24
    a, b = _load(micro_file, first), _load(micro_file, then)
    with kernels(first):
        s = a.new_session()
        s.sync(tokens[:saved_at])
        payload = s.export_state()
    with kernels(then):
        resumed = b.new_session()
        resumed.import_state(payload)
        assert resumed.tokens == tuple(tokens[:saved_at])
        got = [resumed.step(t).copy() for t in tokens[saved_at:]]
    with kernels("reference"):
        ref_session = _load(micro_file, "reference").new_session()
        ref_session.sync(tokens[:saved_at])
        ref = [ref_session.step(t).copy() for t in tokens[saved_at:]]
    _assert_agree(np.stack(ref), np.stack(got))


def test_the_router_never_yields_an_out_of_range_expert_id():
    """The expert backends take device ids unchecked: every id the router can produce is in
    range, for ordinary, huge, infinite and NaN hidden states, on hash and scored layers."""
    cfg = test_config("micro")
    tensors = random_tensors(cfg, 0)
    with kernels("gpu"):
        w = weights_from_tensors(cfg, tensors, quantize_q8=True)
        toks = mx.array(np.arange(0, cfg.vocab, 37, dtype=np.int32))
        n = toks.shape[0]
        rng = np.random.default_rng(0)
        h = rng.standard_normal((n, cfg.dim)).astype(np.float32)
        h[1] = 1e30
        h[2] = np.inf
        h[3] = np.nan
        h[4, ::2] = -np.inf
        for layer in range(cfg.n_layers):
            sel, _ = executor_for(w.kernels).route(w.layers[layer].ffn, cfg, layer, mx.array(h), toks)
            ids = np.array(sel)
            assert ids.shape == (n, cfg.n_experts_used)
            assert ids.min() >= 0 and ids.max() < cfg.n_experts, layer
        # and along a whole forward pass (every layer, every position)
        trace = Trace.new()
        forward(w, cfg, SessionState.empty(cfg), np.arange(50).tolist(), trace=trace)
        for layer, chunks in trace.experts.items():
            ids = np.concatenate(chunks)
            assert ids.min() >= 0 and ids.max() < cfg.n_experts, layer


def test_a_hash_table_with_an_out_of_range_expert_is_refused_at_load():
    cfg = test_config("micro")
    tensors = dict(random_tensors(cfg, 0))
    name = "blk.0.ffn_gate_tid2eid.weight"
    table = tensors[name].copy()
    table[5, 1] = cfg.n_experts
    tensors[name] = table
    with pytest.raises(TensorError, match=f"{name}.*expert {cfg.n_experts}, outside 0..{cfg.n_experts - 1}"):
        weights_from_tensors(cfg, tensors)


def test_a_bad_kernel_switch_is_refused_before_loading(micro_file):
    with kernels("reference"):
        os.environ[KERNELS_ENV] = "tpu"
        with pytest.raises(EngineError, match=f"{KERNELS_ENV} must be one of reference, cpu, gpu"):
            load_engine(micro_file, ctx=64, device="cpu")


# ---- quantised routed experts on the GPU kernel set ---------------------------------------------


@pytest.fixture(scope="module")
def q2_file(tmp_path_factory):
    return write_quant_model(tmp_path_factory.mktemp("gpuq") / "q2.gguf", quant_config(), Q2_TYPES)


def test_quantised_experts_resident_on_the_device_decode_without_reading_back(q2_file, tokens):
    """GPU kernel set: the raw blocks are one device array per tensor and a decoded token's
    graph reads nothing back (ids stay on the device); the logits agree with the CPU path."""
    ref_engine = _load(q2_file, "reference")
    engine = _load(q2_file, "gpu")
    ffn = engine.weights.layers[1].ffn
    for ex in (ffn.gate_exps, ffn.up_exps, ffn.down_exps):
        assert isinstance(ex, QuantExperts) and isinstance(ex.raw, mx.array) and not ex.host_ids
    assert ref_engine.weights.layers[1].ffn.gate_exps.host_ids
    prompt, steps = tokens[:20], tokens[20:30]
    ref_s = ref_engine.new_session()
    ref_s.sync(prompt)
    ref = [ref_s.step(t).copy() for t in steps]
    with kernels("gpu"):
        s = engine.new_session()
        s.sync(prompt)
        got, reads = [], []
        for t in steps:
            before = hostread.reads()
            state = s._state
            _, state = engine.forward(state, [t], last_only=True)
            reads.append(hostread.reads() - before)
            s._commit(state)
            got.append(np.array(state.logits))
    assert reads == [0] * len(steps)
    _assert_agree(np.stack(ref), np.stack(got))


@pytest.mark.parametrize("qtype", [quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.Q8_0])
def test_device_id_expert_products_equal_the_dequantised_products(qtype):
    """A decode-sized call of the GPU kernel set (device ids, resident blocks) gives each pair
    W[id] @ x of the bit-exact dequantised weights, with no read back."""
    rng = np.random.default_rng(qtype)
    e, d_out, d_in = 5, 16, 256
    block, size, _ = quant.block_info(qtype)
    raw = rng.integers(0, 256, size=(e, d_out, d_in // block * size), dtype=np.uint8)
    scale_at = {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,), quant.Q8_0: (0,)}[qtype]
    blocks = raw.reshape(-1, size)
    for off in scale_at:
        blocks[:, off:off + 2] = np.full((len(blocks), 1), np.float16(0.01)).view(np.uint8)
    with kernels("gpu"):
        ex = QuantExperts(raw, qtype, (e, d_out, d_in))
        w = np.array(quant.dequantize(mx.array(raw), qtype, (e, d_out, d_in)))
        x = mx.array(rng.standard_normal((2, d_in)).astype(np.float32))
        ids = mx.array(np.array([[4, 0, 4], [1, 2, 3]], dtype=np.int32))
        before = hostread.reads()
        out = ex.gather_matmul(x, ids)
        mx.eval(out)
        assert hostread.reads() == before
    got = np.array(out)
    want = np.einsum("pkoi,pi->pko", w[np.array(ids)].astype(np.float64), np.array(x).astype(np.float64))
    assert got.shape == (2, 3, d_out)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("quantized", [False, True])
def test_the_grouped_output_lora_is_the_row_slice_products(quantized):
    """Linear.grouped (one batched op) equals the G row-slice products the CPU path runs."""
    from ds4agent.engine.weights import Linear

    rng = np.random.default_rng(11)
    groups, o, d, n = 4, 24, 64, 3
    w = mx.array((rng.standard_normal((groups * o, d)) * 0.1).astype(np.float32))
    with kernels("gpu"):
        lin = Linear(*mx.quantize(w, group_size=32, bits=8), in_features=d) if quantized else Linear(w)
        x = mx.array(rng.standard_normal((n, groups, d)).astype(np.float32))
        got = np.array(lin.grouped(x))
        want = np.concatenate([np.array(lin.rows(g * o, (g + 1) * o)(x[:, g])) for g in range(groups)], axis=-1)
    assert got.shape == (n, groups * o)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("tokens_in_call", [1, 7])
def test_routed_experts_fall_back_to_two_calls_when_the_pair_call_declines(tokens_in_call):
    """The GPU executor's routed experts where the backend declines the fused gate-and-up call
    (more pairs than one group holds, as every call at the Flash shape, or the GPU kernels'
    own class): the same products as the reference executor's two calls."""
    rng = np.random.default_rng(3)
    e, d_ff, dim, k = 6, 32, 256, 3
    block = quant.block_info(quant.Q8_0)[0]

    def experts(d_out, d_in):
        raw = random_blocks(rng, quant.Q8_0, e * d_out * d_in // block).reshape(e, d_out, -1)
        # a group of one expert: 2·n·k pairs never fit, so gather_matmul_with declines
        return QuantExperts(raw, quant.Q8_0, (e, d_out, d_in), group_bytes=d_out * d_in * 4)

    with kernels("gpu"):
        fw = type("FFN", (), {})()
        fw.gate_exps, fw.up_exps, fw.down_exps = experts(d_ff, dim), experts(d_ff, dim), experts(dim, d_ff)
        h = mx.array(rng.standard_normal((tokens_in_call, dim)).astype(np.float32))
        sel = mx.array(rng.integers(0, e, size=(tokens_in_call, k)).astype(np.int32))
        wts = mx.array(rng.random((tokens_in_call, k)).astype(np.float32))
        assert fw.gate_exps.gather_matmul_with(fw.up_exps, h, sel) is None
        got = np.array(executor_for("gpu").routed(fw, k, 10.0, h, sel, wts))
        want = np.array(executor_for("reference").routed(fw, k, 10.0, h, sel, wts))
    assert got.shape == (tokens_in_call, dim)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
