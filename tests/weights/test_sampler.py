"""Sampler: filters, distributions on fixed logits, RNG state round trip, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ds4agent.engine.sampler import Sampler, SamplerError, splitmix64

V = 129280


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _counts(s: Sampler, logits, n: int, size: int) -> np.ndarray:
    out = np.zeros(size, np.int64)
    for _ in range(n):
        out[s.sample(logits)] += 1
    return out


def test_splitmix64_reference_values():
    # SplitMix64 from state 0: published first outputs of the generator
    state, a = splitmix64(0)
    state, b = splitmix64(state)
    assert (a, b) == (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4)
    assert state == (2 * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)


def test_uniforms_are_in_range_and_uniform():
    s = Sampler(seed=7)
    u = np.array([s.random() for _ in range(20000)])
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert _chi_square(counts, np.full(10, 0.1)) < 27.88  # df 9, p = 0.001


def test_distribution_matches_softmax_with_temperature():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], np.float32)
    for temp in (1.0, 0.7, 2.0):
        s = Sampler(temperature=temp, min_p=0.0, seed=42)
        e = np.exp(logits.astype(np.float64) / temp)
        p = e / e.sum()
        ids, probs = s.candidates(logits)
        assert list(ids) == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(probs, p, rtol=1e-12)
        counts = _counts(s, logits, 20000, 5)
        assert _chi_square(counts, p) < 18.47  # df 4, p = 0.001


def test_sampling_is_deterministic_and_state_round_trips():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(V) * 4).astype(np.float32)
    a = Sampler(seed=123)
    first = [a.sample(logits) for _ in range(5)]
    saved = a.rng_state
    rest = [a.sample(logits) for _ in range(20)]
    b = Sampler(seed=999)
    b.rng_state = saved
    assert [b.sample(logits) for _ in range(20)] == rest
    c = Sampler(seed=123)
    assert [c.sample(logits) for _ in range(25)] == first + rest
    assert len(set(first + rest)) > 1  # it really samples
    c.reseed(123)
    assert c.rng_state == 123 and c.sample(logits) == first[0]


def test_greedy_override_draws_nothing_and_breaks_ties_low():
    logits = np.array([0.0, 3.0, 3.0, 1.0], np.float32)
    s = Sampler(seed=5)
    before = s.rng_state
    assert s.sample(logits, greedy=True) == 1
    assert s.rng_state == before
    assert Sampler(temperature=0.0, seed=5).sample(logits) == 1


def test_min_p_edges():
    # p relative to max: exp(-1) = 0.3679, exp(-3) = 0.0498, exp(-2.99) = 0.0503
    logits = np.array([0.0, -1.0, -3.0, -2.99, -np.inf], np.float32)
    ids, _ = Sampler(min_p=0.05, seed=0).candidates(logits)
    assert sorted(ids) == [0, 1, 3]
    # just either side of the boundary (ratio 0.25)
    ids, _ = Sampler(min_p=0.2499, seed=0).candidates(np.array([0.0, -math.log(4.0)], np.float32))
    assert sorted(ids) == [0, 1]
    ids, _ = Sampler(min_p=0.2501, seed=0).candidates(np.array([0.0, -math.log(4.0)], np.float32))
    assert list(ids) == [0]
    # min-p 1 keeps only the maxima; min-p 0 keeps everything finite
    ids, p = Sampler(min_p=1.0, seed=0).candidates(np.array([1.0, 2.0, 2.0], np.float32))
    assert list(ids) == [1, 2] and np.allclose(p, 0.5)
    ids, _ = Sampler(min_p=0.0, seed=0).candidates(np.array([1.0, -50.0, -np.inf], np.float32))
    assert list(ids) == [0, 1]
    # min-p works on the tempered distribution: a higher temperature keeps more
    z = np.array([0.0, -4.0], np.float32)
    assert len(Sampler(min_p=0.05, temperature=1.0).candidates(z)[0]) == 1
    assert len(Sampler(min_p=0.05, temperature=2.0).candidates(z)[0]) == 2


def test_top_p_edges():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    s = Sampler(min_p=0.0, top_p=0.8, seed=0)
    ids, p = s.candidates(z)
    assert list(ids) == [0, 1]  # 0.5 + 0.3 reaches 0.8
    np.testing.assert_allclose(p, [0.625, 0.375], rtol=1e-6)
    assert list(Sampler(min_p=0.0, top_p=0.81).candidates(z)[0]) == [0, 1, 2]
    assert list(Sampler(min_p=0.0, top_p=0.1).candidates(z)[0]) == [0]  # at least one id
    assert list(Sampler(min_p=0.0, top_p=1.0).candidates(z)[0]) == [0, 1, 2, 3]
    # ties at the cut go to the lower id
    tie = np.zeros(4, np.float32)
    assert list(Sampler(min_p=0.0, top_p=0.5).candidates(tie)[0]) == [0, 1]
    counts = _counts(Sampler(min_p=0.0, top_p=0.8, seed=11), z, 10000, 4)
    assert counts[2] == counts[3] == 0
    assert _chi_square(counts[:2], np.array([0.625, 0.375])) < 10.83  # df 1, p = 0.001


def test_top_p_on_a_large_flat_vocabulary_grows_the_head():
    rng = np.random.default_rng(0)
    z = (rng.standard_normal(V) * 0.5).astype(np.float32)
    s = Sampler(min_p=0.0, top_p=0.9, seed=1)
    ids, p = s.candidates(z)
    full = np.exp(z.astype(np.float64) - z.max())
    order = np.lexsort((np.arange(V), -full))
    cum = np.cumsum(full[order]) / full.sum()
    n = int(np.searchsorted(cum, 0.9, side="left")) + 1
    assert len(ids) == n > 4096
    assert np.array_equal(ids, order[:n])


def test_top_k_with_ties_and_combination():
    z = np.array([1.0, 3.0, 2.0, 3.0, 2.0, -1.0], np.float32)
    ids, _ = Sampler(top_k=3, min_p=0.0).candidates(z)
    assert list(ids) == [1, 3, 2]
    ids, _ = Sampler(top_k=1, min_p=0.0).candidates(z)
    assert list(ids) == [1]
    counts = _counts(Sampler(top_k=2, min_p=0.0, seed=4), z, 4000, 6)
    assert set(np.flatnonzero(counts)) == {1, 3}
    assert _chi_square(counts[[1, 3]], np.array([0.5, 0.5])) < 10.83


def test_real_vocab_sample_is_cheap_and_valid():
    rng = np.random.default_rng(9)
    z = (rng.standard_normal(V) * 3).astype(np.float32)
    z[77] = 25.0
    s = Sampler(seed=1)  # defaults: temp 1, top-p 1, min-p 0.05
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (1.0, 0, 1.0, 0.05)
    assert s.sample(z) == 77
    assert s.sample(np.array(z, dtype=np.float16)) == 77


def test_bad_settings_and_logits():
    with pytest.raises(SamplerError, match="temperature"):
        Sampler(temperature=-1)
    with pytest.raises(SamplerError, match="top-p"):
        Sampler(top_p=0.0)
    with pytest.raises(SamplerError, match="min-p"):
        Sampler(min_p=1.5)
    with pytest.raises(SamplerError, match="top-k"):
        Sampler(top_k=-2)
    s = Sampler(seed=0)
    with pytest.raises(SamplerError, match="NaN"):
        s.sample(np.array([0.0, np.nan], np.float32))
    with pytest.raises(SamplerError, match="NaN"):
        s.sample(np.array([np.nan, 0.0], np.float32), greedy=True)
    with pytest.raises(SamplerError, match="-inf"):
        s.sample(np.full(3, -np.inf, np.float32))
    with pytest.raises(SamplerError, match="empty"):
        s.sample(np.zeros(0, np.float32))
    with pytest.raises(SamplerError, match="64-bit"):
        s.rng_state = -1
    assert s.sample(np.array([0.0, np.inf, 1.0], np.float32)) == 1
