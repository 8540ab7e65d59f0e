"""The decode generator (engine/decode.py) against the step loop it replaces, on a micro model.

Exactness: greedy and seeded sampled tokens identical to the step loop (Session.step + the
same sampler), the state after decoding identical array for array. Determinism: a seeded run
repeats, and repeats across a save and load of the RNG state. Stopping (break, close, an
exception, the token cap, a full context) while a step is in flight leaves the session exactly
as it stood when the last token was handed out. Host reads: counted through engine/hostread.
"""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import generate, hostread, load_engine
from ds4agent.engine.device import KERNELS_ENV, forced_kernel_set, kernel_set
from ds4agent.engine.errors import EngineError
from ds4agent.engine.sampler import Sampler
from ds4agent.testmodels.writer import make_test_model

CTX = 64
N = 12


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_test_model(tmp_path_factory.mktemp("decode") / "micro.gguf", "micro", seed=5)
    return load_engine(path, ctx=CTX, chunk=8)


@pytest.fixture(scope="module", params=["reference", "cpu", "gpu"])
def kernel_engine(request, tmp_path_factory):
    """The micro model on each kernel set (the GPU one on the CPU device: there the generator
    builds token n+1's step before handing out token n, and its guessed sampling mode is
    checked once the consumer has seen token n)."""
    path = make_test_model(tmp_path_factory.mktemp("decode") / "micro.gguf", "micro", seed=5)
    with forced_kernel_set(request.param):
        return load_engine(path, ctx=CTX, chunk=8, device="cpu")


@pytest.fixture(autouse=True)
def _kernel_set_of_the_test(request, monkeypatch):
    # Graphs take their kernels from the environment as they are built: a test on the GPU
    # kernel set's engine runs with it set.
    if "kernel_engine" in request.fixturenames:
        monkeypatch.setenv(KERNELS_ENV, request.node.callspec.params["kernel_engine"])


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(4)
    return [int(t) for t in rng.integers(0, 512, size=20)]


def _state_bytes(session) -> dict[str, bytes]:
    """Every array of the live state as bytes (tokens included), for exact comparison."""
    p = session.export_state()
    out = {"tokens": np.asarray(p.tokens).tobytes(), "logits": np.asarray(p.logits).tobytes()}
    for i, lay in enumerate(p.layers):
        for f in ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score"):
            v = getattr(lay, f)
            out[f"{i}.{f}"] = b"" if v is None else np.asarray(v).tobytes()
    return out


def _step_loop(engine, prompt, sampler, n, greedy_at=()):
    """Today's decode: sample from host logits, step, repeat (the last token is not stepped,
    as generate() leaves it: see engine/decode.py)."""
    s = engine.new_session()
    s.sync(prompt)
    out = []
    for i in range(n):
        tok = sampler.sample(s.logits, greedy=i in greedy_at)
        out.append(tok)
        if i < n - 1:
            s.step(tok)
    return out, s


def _generator(engine, prompt, sampler, n, greedy_at=()):
    s = engine.new_session()
    s.sync(prompt)
    out: list[int] = []
    for tok in generate(s, sampler, max_tokens=n, greedy=lambda: len(out) in greedy_at):
        out.append(tok)
    return out, s


def test_greedy_tokens_and_state_identical_to_the_step_loop(kernel_engine, prompt):
    assert kernel_engine.chains_steps == (kernel_set() == "gpu")
    ref, ref_s = _step_loop(kernel_engine, prompt, Sampler(temperature=0.0), N)
    got, got_s = _generator(kernel_engine, prompt, Sampler(temperature=0.0), N)
    assert got == ref
    assert len(set(got)) > 1  # a real sequence, not one repeated id
    assert got_s.tokens == tuple(prompt) + tuple(ref[:-1])
    assert _state_bytes(got_s) == _state_bytes(ref_s)


def test_seeded_sampling_matches_the_step_loop_and_repeats(kernel_engine, prompt):
    greedy_at = {2, 3, 7}  # DSML-syntax positions: argmax there, no draw
    ref, _ = _step_loop(kernel_engine, prompt, Sampler(temperature=1.5, min_p=0.0, seed=9), N, greedy_at)
    a, _ = _generator(kernel_engine, prompt, Sampler(temperature=1.5, min_p=0.0, seed=9), N, greedy_at)
    b, _ = _generator(kernel_engine, prompt, Sampler(temperature=1.5, min_p=0.0, seed=9), N, greedy_at)
    assert a == ref == b
    other, _ = _generator(kernel_engine, prompt, Sampler(temperature=1.5, min_p=0.0, seed=10), N, greedy_at)
    assert other != a  # the seed matters: the test would notice a sampler that ignores it


def test_rng_state_saved_and_loaded_mid_run_continues_the_same_tokens(kernel_engine, prompt):
    full, _ = _generator(kernel_engine, prompt, Sampler(temperature=1.5, min_p=0.0, seed=3), N)
    first = Sampler(temperature=1.5, min_p=0.0, seed=3)
    s = kernel_engine.new_session()
    s.sync(prompt)
    head = []
    for tok in generate(s, first, max_tokens=5):
        head.append(tok)
    saved_rng, payload = first.rng_state, s.export_state()
    resumed = kernel_engine.new_session()
    resumed.import_state(payload)
    resumed.sync(tuple(prompt) + tuple(head))  # the last handed-out token is not in the state yet
    second = Sampler(temperature=1.5, min_p=0.0, seed=0)
    second.rng_state = saved_rng
    tail = list(generate(resumed, second, max_tokens=N - 5))
    assert head + tail == full


def _stop_after(kernel_engine, prompt, k, how):
    """Decode and stop after the k-th token in the named way; returns (tokens, session)."""
    s = kernel_engine.new_session()
    s.sync(prompt)
    got: list[int] = []
    gen = generate(s, Sampler(temperature=0.0), max_tokens=N)
    if how == "break":
        for tok in gen:
            got.append(tok)
            if len(got) == k:
                break
    elif how == "close":
        for _ in range(k):
            got.append(next(gen))
        gen.close()
    elif how == "raise":
        with pytest.raises(KeyboardInterrupt):
            for tok in gen:
                got.append(tok)
                if len(got) == k:
                    raise KeyboardInterrupt
    return got, s


@pytest.mark.parametrize("how", ["break", "close", "raise"])
@pytest.mark.parametrize("k", [1, 4])
def test_stopping_during_a_speculative_step_leaves_the_session_as_at_the_handout(kernel_engine, prompt, how, k):
    got, s = _stop_after(kernel_engine, prompt, k, how)
    assert len(got) == k
    # The step of the k-th token was in flight when the consumer stopped: it is dropped.
    assert s.tokens == tuple(prompt) + tuple(got[:-1])
    ref = kernel_engine.new_session()
    if kernel_set() == "cpu":
        # The fast set is not chunk-invariant: its contract is decode = one-token prefill, so the
        # reference decodes the same tokens one at a time (docs/numerics-fast-cpu.md).
        ref.sync(tuple(prompt))
        for tok in got[:-1]:
            ref.step(tok)
    else:
        ref.sync(tuple(prompt) + tuple(got[:-1]))
    assert _state_bytes(s) == _state_bytes(ref)
    # And the session goes on from there as if nothing had been in flight.
    nxt = list(generate(s, Sampler(temperature=0.0), max_tokens=3))
    ref_all, _ = _generator(kernel_engine, prompt, Sampler(temperature=0.0), k - 1 + 3)
    assert got[:-1] + nxt == ref_all


def test_stopping_leaves_the_rng_as_after_the_handed_out_tokens(kernel_engine, prompt):
    # On the GPU kernel set token k+1 is already drawn when the consumer stops after token k:
    # that draw is undone, so the RNG stands where k sampled tokens leave it.
    sampler = Sampler(temperature=1.5, min_p=0.0, seed=4)
    s = kernel_engine.new_session()
    s.sync(prompt)
    got = []
    for tok in generate(s, sampler, max_tokens=N):
        got.append(tok)
        if len(got) == 4:
            break
    ref = Sampler(temperature=1.5, min_p=0.0, seed=4)
    ref_tokens, _ = _step_loop(kernel_engine, prompt, ref, 4)
    assert got == ref_tokens
    assert sampler.rng_state == ref.rng_state != Sampler(temperature=1.5, min_p=0.0, seed=4).rng_state


def test_token_cap_and_full_context(engine, prompt):
    s = engine.new_session()
    s.sync(prompt)
    assert list(generate(s, Sampler(temperature=0.0), max_tokens=0)) == []
    got = list(generate(s, Sampler(temperature=0.0), max_tokens=3))
    assert len(got) == 3 and s.tokens == tuple(prompt) + tuple(got[:2])
    # ctx - 2 tokens live: one more step fits (ctx - 1), the token after it is handed out without
    # a step (there is no position left for it), and then the generator ends.
    full = engine.new_session()
    full.sync((tuple(prompt) * 4)[:CTX - 2])
    out = list(generate(full, Sampler(temperature=0.0), max_tokens=100))
    assert len(out) == 3 and len(full) == CTX


def test_decode_needs_logits_and_an_unchanged_session(engine, prompt):
    with pytest.raises(EngineError, match="no tokens"):
        next(generate(engine.new_session(), Sampler(temperature=0.0), max_tokens=4))
    s = engine.new_session()
    s.sync(prompt)
    gen = generate(s, Sampler(temperature=0.0), max_tokens=4)
    next(gen)
    s.sync(prompt[:10])  # someone else drove the session while a step was in flight
    with pytest.raises(EngineError, match="changed while a decode step"):
        next(gen)


def _reads_per_token(engine, prompt, loop: str) -> float:
    s = engine.new_session()
    s.sync(prompt)
    sampler = Sampler(temperature=1.0, seed=1)
    if loop == "generator":
        gen = generate(s, sampler, max_tokens=N + 1)  # every counted token gets its step
        next(gen)  # start-up outside the count
        before = hostread.reads()
        for _ in range(N - 1):
            next(gen)
    else:
        logits = s.logits
        before = hostread.reads()
        for _ in range(N - 1):
            logits = s.step(sampler.sample(logits))
    return (hostread.reads() - before) / (N - 1)


@pytest.fixture(scope="module")
def quant_engine(tmp_path_factory):
    from tests.weights.quantmodel import Q2_TYPES, quant_config, write_quant_model

    path = write_quant_model(tmp_path_factory.mktemp("decode") / "q2.gguf", quant_config(), Q2_TYPES)
    return load_engine(path, ctx=CTX, chunk=8)


def test_host_reads_are_counted_per_decoded_token(engine, quant_engine, prompt):
    # Dense experts: nothing inside the graph reads back; the token id is the one read.
    assert _reads_per_token(engine, prompt, "generator") == 1.0
    # The step loop also reads the logits back to sample them on the host.
    assert _reads_per_token(engine, prompt, "step loop") == 2.0
    # Quantised experts on the CPU device: the compiled kernels take their ids and inputs on the
    # host (counted too); the generator saves exactly the logits read on top of them.
    gen = _reads_per_token(quant_engine, prompt, "generator")
    assert gen > 1.0
    assert gen == _reads_per_token(quant_engine, prompt, "step loop") - 1.0


def test_nan_logits_are_a_sampler_error_and_never_index_the_embedding(engine):
    import mlx.core as mx

    from ds4agent.engine.sampler import SamplerError

    class NanSession:
        """The decode seam over logits that hold a NaN; records the ids it was asked to step."""

        def __init__(self):
            self.engine = engine
            self.next_logits = mx.array(np.array([0.0, np.nan, 1.0], np.float32))
            self.fed: list[int] = []
            self.accepted = 0

        def __len__(self):
            return 1

        def dispatch(self, token):
            self.fed.append(int(token.item()))
            return object()

        def accept(self, pending, token):
            self.accepted += 1

        def settle(self):
            pass

    s = NanSession()
    with pytest.raises(SamplerError, match="NaN"):
        next(generate(s, Sampler(seed=0), max_tokens=4))
    assert s.fed == [0] and s.accepted == 0  # the step got a valid id and was never accepted


def test_forced_ids_are_stepped_like_sampled_ones(engine, prompt):
    """forced(): the ids it returns are handed out and stepped in place of a sample; afterwards
    decoding goes on from them, as the step loop fed the same ids would."""
    queue = [101, 202]
    s = engine.new_session()
    s.sync(prompt)
    out = list(generate(s, Sampler(temperature=0.0), max_tokens=6, greedy=lambda: True,
                        forced=lambda: queue.pop(0) if queue else None))
    ref = engine.new_session()
    ref.sync([*prompt, 101, 202])
    assert out[:3] == [101, 202, int(np.argmax(ref.logits))]
    assert len(out) == 6 and tuple(s.tokens[len(prompt):]) == tuple(out[:-1])
