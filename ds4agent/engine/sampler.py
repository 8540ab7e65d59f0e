"""Token sampler: greedy, temperature, top-k, min-p, top-p, with an explicit 64-bit RNG state.

Pipeline for one token (logits float32 [V]):
  1. greedy (per-call override, temperature 0) -> argmax, ties to the lower id; no RNG draw.
  2. temperature T scales the logits; every filter below sees the tempered distribution p, so a
     filter describes the distribution that is actually sampled (with the default T = 1 the order
     of temperature and filters does not matter).
  3. min-p: keep ids with p_i >= min_p * p_max, i.e. logit_i >= max + T*ln(min_p) -- one vectorised
     compare over V, which also shrinks the candidate set before anything is sorted or
     exponentiated (the usual case costs O(V) compares plus O(c log c) on c candidates).
  4. top-k (0 = off): the k most likely candidates, ties to the lower id.
  5. top-p (1 = off): the shortest prefix of the candidates (descending p, ties to the lower id)
     whose mass reaches top_p of the remaining mass; at least one id is kept.
  6. one uniform draw u in [0, 1) from the RNG picks from the cumulative distribution.

The RNG is SplitMix64 (Steele, Lea, Flood 2014): its whole state is one 64-bit integer that
advances by a constant, so `rng_state` can be saved and restored exactly and is portable across
machines and Python/numpy versions (numpy's generators are not a plain int). Every sampled
(non-greedy) token consumes exactly one draw, so a restored state reproduces the same tokens.
Probabilities are computed in float64 from float32 logits, deterministically for a given input.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

from ds4agent.engine.errors import EngineError

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class SamplerError(EngineError, ValueError):
    """Invalid sampler settings or logits (the message names the setting)."""


def splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: (new_state, 64-bit output)."""
    state = (state + _GOLDEN) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


class Sampler:
    def __init__(self, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.05, seed: int | None = None):
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self._check_settings()
        self._state = 0
        self.reseed(seed)

    def _check_settings(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplerError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SamplerError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplerError(f"top-p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise SamplerError(f"min-p must be in [0, 1], got {self.min_p}")

    # --- RNG state -------------------------------------------------------------------------
    @property
    def rng_state(self) -> int:
        """The whole RNG state: an int in [0, 2**64). Save it; assign it back to resume."""
        return self._state

    @rng_state.setter
    def rng_state(self, value: int) -> None:
        value = int(value)
        if not 0 <= value <= _MASK64:
            raise SamplerError(f"RNG state must be a 64-bit unsigned integer, got {value}")
        self._state = value

    def reseed(self, seed: int | None = None) -> None:
        """Start the RNG from `seed` (any int, taken mod 2**64); None draws a random seed."""
        self._state = secrets.randbits(64) if seed is None else int(seed) & _MASK64

    def random(self) -> float:
        """A uniform float in [0, 1) with 53 random bits; advances the state by one step."""
        self._state, z = splitmix64(self._state)
        return (z >> 11) * (1.0 / (1 << 53))

    # --- sampling --------------------------------------------------------------------------
    def candidates(self, logits) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the distribution a non-greedy sample draws from, ids in
        descending probability (ties: lower id first), probabilities float64 summing to 1."""
        ids, p = self._distribution(logits)
        order = np.lexsort((ids, -p))
        return ids[order], p[order]

    def sample(self, logits, *, greedy: bool = False) -> int:
        """Next token id. `greedy=True` (DSML structure) or temperature 0 -> argmax, no draw."""
        if greedy or self.temperature == 0.0:
            return self._argmax(logits)
        ids, p = self._distribution(logits)
        u = self.random()
        if len(ids) == 1:
            return int(ids[0])
        j = int(np.searchsorted(np.cumsum(p), u, side="right"))
        return int(ids[min(j, len(ids) - 1)])

    # --- internals -------------------------------------------------------------------------
    @staticmethod
    def _as_logits(logits) -> np.ndarray:
        z = np.asarray(logits, dtype=np.float32).reshape(-1)
        if z.size == 0:
            raise SamplerError("cannot sample from empty logits")
        return z

    def _argmax(self, logits) -> int:
        z = self._as_logits(logits)
        i = int(np.argmax(z))  # first maximum = lowest id; a NaN anywhere would be returned first
        if math.isnan(float(z[i])):
            raise SamplerError("logits contain NaN")
        return i

    def _distribution(self, logits) -> tuple[np.ndarray, np.ndarray]:
        """(ids, p) after every filter, p float64 normalised. The order of ids is deterministic
        (ascending id, or by descending p where top-k/top-p needed an order); the draw walks the
        cumulative sum in that order."""
        z = self._as_logits(logits)
        top = float(z.max())  # NaN anywhere propagates into the max: one pass over V checks both
        if math.isnan(top):
            raise SamplerError("logits contain NaN")
        if top == -math.inf:
            raise SamplerError("every logit is -inf: nothing can be sampled")
        t = self.temperature
        if top == math.inf or t == 0.0:  # all mass on the first maximum
            return np.array([int(np.argmax(z))], dtype=np.int64), np.ones(1)
        if self.min_p > 0:
            # float32 pre-filter one ulp below the cut, so rounding the cut cannot drop a survivor;
            # the exact test is then done in float64 on the (few) survivors
            log_min_p = math.log(self.min_p)
            cut = np.nextafter(np.float32(top + t * log_min_p), np.float32(-np.inf))
            ids = np.flatnonzero(z >= cut)
            vals = z[ids].astype(np.float64)
            keep = (vals - top) / t >= log_min_p
            ids, vals = ids[keep], vals[keep]
        else:
            ids = np.flatnonzero(z > -np.inf)
            vals = z[ids].astype(np.float64)
        if self.top_k and len(ids) > self.top_k:
            ids, vals = _top_by_value(ids, vals, self.top_k)
        p = np.exp((vals - top) / t)
        if self.top_p < 1.0 and len(ids) > 1:
            ids, p = _top_p_prefix(ids, p, self.top_p)
        return ids.astype(np.int64), p / p.sum()


def _top_by_value(ids: np.ndarray, vals: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The m largest values (ties to the lower id), sorted descending. Partition first, so only
    the m winners (plus ties at the boundary) are sorted."""
    kth = np.partition(vals, len(vals) - m)[len(vals) - m]
    keep = vals >= kth  # all ties at the boundary; the stable order below cuts them by id
    ids, vals = ids[keep], vals[keep]
    order = np.lexsort((ids, -vals))[:m]
    return ids[order], vals[order]


def _top_p_prefix(ids: np.ndarray, p: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Shortest prefix (descending p, ties to the lower id) whose mass reaches top_p of the total.

    Sorting 129280 candidates costs milliseconds, so grow a partitioned head (64, 512, ...) until
    it holds the needed mass, and sort only that head."""
    target = top_p * p.sum()
    m = 64
    while True:
        if m >= len(ids):
            hi, hp = _top_by_value(ids, p, len(ids))
        else:
            hi, hp = _top_by_value(ids, p, m)
        cum = np.cumsum(hp)
        if cum[-1] >= target or m >= len(ids):
            n = min(int(np.searchsorted(cum, target, side="left")) + 1, len(hi))
            return hi[:n], hp[:n]
        m *= 8
