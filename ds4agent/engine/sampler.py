"""Token sampler on the device: greedy, temperature, min-p, top-k, top-p, with a saveable RNG state.

`draw(logits, greedy=...)` builds a small MLX graph over the logits (an mx.array [V], still being
computed is fine) and returns the token id as a lazy int32 scalar: nothing is read back, so the
decode loop (decode.py) can hand the id straight to the next forward pass and read it once.

Pipeline for one token (logits float32 [V]):
  1. greedy (per-call override, or temperature 0) -> argmax, ties to the lower id; no RNG draw.
  2. temperature T scales the logits; every filter below sees the tempered distribution p, so a
     filter describes the distribution that is actually sampled.
  3. min-p: keep ids with p_i >= min_p * p_max, i.e. z_i/T >= max/T + ln(min_p).
  4. top-k (0 = off): keep ids whose value is at least the k-th largest (ties at the boundary
     are all kept: a device-side cut by id would need a sort of the whole vocabulary).
  5. top-p (1 = off): sort the survivors by descending p and keep the shortest prefix whose mass
     reaches top_p of the survivors' mass (at least one id); again ties at the cut are kept.
  6. one categorical draw from the survivors with a fresh subkey (MLX's Gumbel-max sampler).

RNG: an MLX PRNG key (two uint32 words). Every sampled (non-greedy) token splits the key once,
so the state after n sampled tokens is a pure function of the seed and n: `rng_state` is that
key as one 64-bit int (`mx.random.key(seed)` is exactly [seed >> 32, seed & 0xffffffff], so a
seed and a state are the same kind of value) and assigning it back reproduces the same tokens on
the same device. Reading `rng_state` is one host read (only on save, never per token).

Bad logits (NaN anywhere, or nothing left to sample) cannot be checked on the host without a
read per token, so the graph folds them into the id: -1 for NaN, -2 for no candidate; `sample`
and decode.py turn those into a SamplerError when the id is read.
"""

from __future__ import annotations

import math
import secrets

import mlx.core as mx
import numpy as np

from ds4agent.engine.errors import EngineError
from ds4agent.engine.hostread import to_host, to_int

_MASK64 = (1 << 64) - 1
NAN_LOGITS = -1  # id the graph returns when the logits hold a NaN
NO_CANDIDATE = -2  # id the graph returns when every logit is -inf


class SamplerError(EngineError, ValueError):
    """Invalid sampler settings or logits (the message names the setting)."""


def check_token(token: int) -> int:
    """A drawn id as read back: the id itself, or the SamplerError its error code stands for."""
    if token == NAN_LOGITS:
        raise SamplerError("logits contain NaN")
    if token == NO_CANDIDATE:
        raise SamplerError("every logit is -inf: nothing can be sampled")
    return token


def _key_of(state: int) -> mx.array:
    return mx.array([(state >> 32) & 0xFFFFFFFF, state & 0xFFFFFFFF], dtype=mx.uint32)


class Sampler:
    def __init__(self, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.05, seed: int | None = None):
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self._check_settings()
        self._key = _key_of(0)
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
        hi, lo = (int(v) for v in to_host(self._key))
        return (hi << 32) | lo

    @rng_state.setter
    def rng_state(self, value: int) -> None:
        value = int(value)
        if not 0 <= value <= _MASK64:
            raise SamplerError(f"RNG state must be a 64-bit unsigned integer, got {value}")
        self._key = _key_of(value)

    def reseed(self, seed: int | None = None) -> None:
        """Start the RNG from `seed` (any int, taken mod 2**64); None draws a random seed."""
        self._key = _key_of(secrets.randbits(64) if seed is None else int(seed) & _MASK64)

    @property
    def key(self) -> mx.array:
        """The current key (lazy between draws): decode.py evaluates it with the token it drew."""
        return self._key

    @key.setter
    def key(self, value: mx.array) -> None:
        """Put back a key read from `key` (decode.py undoes a speculative draw with it)."""
        self._key = value

    # --- sampling --------------------------------------------------------------------------
    def draw(self, logits: mx.array, *, greedy: bool = False) -> mx.array:
        """The next token id as a lazy int32 scalar (see the module doc for error codes).

        Few passes over the vocabulary on purpose: on the CPU device each is a visible part of
        a small model's token (MLX's CPU ops are not fused)."""
        z = logits.reshape(-1)
        if z.dtype != mx.float32:
            z = z.astype(mx.float32)
        top = mx.max(z)  # a NaN anywhere propagates into the max: one pass finds both
        if greedy or self.temperature == 0.0:
            tok = mx.argmax(z).astype(mx.int32)  # first maximum: ties to the lower id
        else:
            pair = mx.random.split(self._key)
            self._key, sub = pair[0], pair[1]
            drawn = mx.random.categorical(self._filtered(z, top), key=sub).astype(mx.int32)
            # +inf: all mass on the first maximum (tempering it would make NaNs).
            tok = mx.where(top == math.inf, mx.argmax(z).astype(mx.int32), drawn)
            tok = mx.where(top == -math.inf, mx.array(NO_CANDIDATE, mx.int32), tok)
        return mx.where(mx.isnan(top), mx.array(NAN_LOGITS, mx.int32), tok)

    def sample(self, logits, *, greedy: bool = False) -> int:
        """Next token id, read back (one host read). Logits: numpy or MLX, float32 [V]."""
        z = logits if isinstance(logits, mx.array) else mx.array(np.asarray(logits, dtype=np.float32))
        if z.size == 0:
            raise SamplerError("cannot sample from empty logits")
        return check_token(to_int(self.draw(z, greedy=greedy)))

    def probabilities(self, logits) -> np.ndarray:
        """float64 [V]: the distribution a non-greedy draw samples from (zeros where filtered)."""
        z = logits if isinstance(logits, mx.array) else mx.array(np.asarray(logits, dtype=np.float32))
        z = z.reshape(-1).astype(mx.float32)
        f = to_host(self._filtered(z, mx.max(z)), np.float64)
        e = np.exp(f - f.max())
        return e / e.sum()

    # --- internals -------------------------------------------------------------------------
    def _filtered(self, z: mx.array, top: mx.array) -> mx.array:
        """Tempered logits with every filtered id at -inf; `top` = max(z)."""
        t = self.temperature
        if t != 1.0:
            # max(z * c) == max(z) * c exactly for c > 0 (rounding is monotonic)
            z, top = z * (1.0 / t), top * (1.0 / t)
        out = z
        if self.min_p > 0:
            out = mx.where(z - top >= math.log(self.min_p), z, -math.inf)
        V = out.shape[0]
        if 0 < self.top_k < V:
            kth = mx.min(mx.topk(out, self.top_k))
            out = mx.where(out >= kth, out, -math.inf)
        if self.top_p < 1.0:
            order = mx.argsort(-out)  # descending; filtered ids (-inf) last
            sorted_vals = out[order]
            p = mx.softmax(sorted_vals)
            before = mx.cumsum(p) - p  # mass strictly ahead of each id
            kept = before < self.top_p  # the first id is always kept (nothing ahead of it)
            cut = mx.min(mx.where(kept, sorted_vals, math.inf))
            out = mx.where(out >= cut, out, -math.inf)
        return out
