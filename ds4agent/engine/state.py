"""SessionState: everything needed to continue after T tokens (model.md §8), as MLX arrays.

Immutable by construction (frozen dataclasses of immutable MLX arrays and tuples): the forward
pass returns a NEW state and never mutates its input, so keeping a reference is an O(1)
snapshot (Snapshot) and rewinding is just using an older reference.

Per layer, a LayerState holds the arrays of ds4agent/statelayout.py (their names are
`sessions.payload.LayerPayload`'s, so conversion is attribute for attribute); `LayerState.layout`
gives their shapes after T tokens and `LayerState.state_bytes` their size, and every other place
that needs them (the empty state, the import check, the pipeline's wire format, the memory plan)
asks these two. Raw, compressed and indexer rows are F16-exact (model.md §5); the frontiers f32
(kvc-format.md §9.4).

Frontier rows outside the current partial window ALWAYS hold the canonical filler (kv 0.0,
score -1e30), in memory as on disk: exported payloads need no fix-up and two states that hold
the same tokens are equal array for array whatever the chunk schedule was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import numpy as np

from ds4agent.statelayout import FIELDS, FILL_KV, FILL_SCORE, FILLER, frontier_live_rows, layer_arrays

from .config import ModelConfig
from .errors import EngineError, StateError
from .hostread import to_host


@dataclass(frozen=True)
class LayerState:
    raw: mx.array
    comp: mx.array | None = None
    attn_kv: mx.array | None = None
    attn_score: mx.array | None = None
    index_comp: mx.array | None = None
    index_kv: mx.array | None = None
    index_score: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        """The arrays the layer holds, in statelayout.FIELDS order."""
        return [a for a in (getattr(self, name) for name in FIELDS) if a is not None]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    @staticmethod
    def layout(config: ModelConfig, layer: int, n_tokens: int) -> list[tuple[str, int, int]]:
        """(field, rows, columns) of layer `layer`'s arrays after n_tokens (the ones it has)."""
        return layer_arrays(config.ratios[layer], config.head_dim, config.indexer_dim, n_tokens,
                            min(n_tokens, config.window))

    @staticmethod
    def state_bytes(config: ModelConfig, layer: int, n_tokens: int) -> int:
        """Bytes of layer `layer`'s state after n_tokens (every array float32)."""
        return 4 * sum(rows * cols for _, rows, cols in LayerState.layout(config, layer, n_tokens))


@dataclass(frozen=True)
class SessionState:
    tokens: tuple[int, ...]
    logits: mx.array | None  # float32 [V]: logits after the last token (None when T = 0)
    layers: tuple[LayerState, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def empty(cls, config: ModelConfig) -> SessionState:
        return cls(tokens=(), logits=None, layers=tuple(empty_layer(config, li)
                                                         for li in range(config.n_layers)))

    def arrays(self) -> list[mx.array]:
        out = [a for lay in self.layers for a in lay.arrays()]
        if self.logits is not None:
            out.append(self.logits)
        return out

    def eval(self) -> SessionState:
        """Materialise every array (so a snapshot holds values, not a pending graph)."""
        mx.eval(self.arrays())
        return self


@dataclass(frozen=True, eq=False)
class Snapshot:
    """An O(1) handle on a session state (a reference to immutable arrays, nothing copied).

    `engine_id` is id() of the Engine whose session took it: a snapshot rewinds only sessions of
    that engine (Session.rewind checks)."""

    engine_id: int
    state: SessionState

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.state.tokens


def check_token_ids(tokens: Iterable[Any], vocab: int, *,
                    error: type[EngineError] = EngineError) -> tuple[int, ...]:
    """`tokens` as a tuple of ints, each a valid id of a `vocab`-sized vocabulary, else `error`
    naming the first bad id and its position (an out-of-range id would silently gather garbage
    rows of the embedding). The one check of every door tokens come in by: a session's requests,
    the forward pass, a pipeline's rank 0, an imported state."""
    try:
        out = tuple(int(t) for t in tokens)
    except (TypeError, ValueError):
        raise error("token ids must be integers") from None
    # min/max run in C: a 100k-token transcript is checked in well under a millisecond.
    if out and (min(out) < 0 or max(out) >= vocab):
        i, t = next((i, t) for i, t in enumerate(out) if not 0 <= t < vocab)
        raise error(f"token id {t} at position {i} is outside the vocabulary (0..{vocab - 1})")
    return out


def empty_layer(config: ModelConfig, layer: int) -> LayerState:
    """Layer `layer` before any token: no rows, frontiers all filler."""
    arrays = {name: (mx.full((rows, cols), FILLER[name], dtype=mx.float32) if name in FILLER
                     else mx.zeros((rows, cols), dtype=mx.float32))
              for name, rows, cols in LayerState.layout(config, layer, 0)}
    return LayerState(**arrays)


# ---- payload conversion ---------------------------------------------------------------------------


def _np(a: mx.array | None) -> np.ndarray | None:
    if a is None:
        return None
    return to_host(a, np.float32)


def to_payload(state: SessionState, config: ModelConfig, *, ctx: int, payload_cls: Any = None,
               layer_cls: Any = None) -> Any:
    """An object with `sessions.payload.PayloadState`'s attribute names (duck typed).

    payload_cls / layer_cls: constructors taking the attributes as keywords (e.g. the real
    PayloadState / LayerPayload); default SimpleNamespace (the engine never imports sessions).
    """
    mk_p = payload_cls or SimpleNamespace
    mk_l = layer_cls or SimpleNamespace
    state.eval()
    layers = [mk_l(**{name: _np(getattr(lay, name)) for name in FIELDS}) for lay in state.layers]
    logits = (to_host(state.logits, np.float32) if state.logits is not None
              else np.zeros(config.vocab, dtype=np.float32))
    return mk_p(ctx=int(ctx), tokens=np.asarray(state.tokens, dtype=np.uint32), logits=logits,
                layers=layers)


def _check(name: str, a: Any, shape: tuple[int, ...]) -> np.ndarray:
    if a is None:
        raise StateError(f"session state is missing {name} (expected shape {list(shape)})")
    arr = np.asarray(a)
    if tuple(arr.shape) != tuple(shape):
        raise StateError(f"session state {name} has shape {list(arr.shape)}, expected {list(shape)}")
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
        raise StateError(f"session state {name} holds non-finite values")
    return arr


def _canonical_frontier(kv: np.ndarray, sc: np.ndarray, r: int, T: int) -> tuple[mx.array, mx.array]:
    """Overwrite the rows outside the partial window with the filler (readers must not depend on
    them: ds4 may leave stale values there, kvc-format.md §9.4)."""
    lo, hi = frontier_live_rows(r, T)
    kv = kv.copy()
    sc = sc.copy()
    for a, fill in ((kv, FILL_KV), (sc, FILL_SCORE)):
        a[:lo] = fill
        a[hi:] = fill
    return mx.array(kv), mx.array(sc)


def from_payload(payload: Any, config: ModelConfig) -> SessionState:
    """Validate a PayloadState-shaped object against `config` and build a SessionState.

    Raises StateError naming the first offending array; builds nothing partially (the caller's
    live state is untouched on error).
    """
    c = config
    tokens = np.asarray(payload.tokens)
    if tokens.ndim != 1:
        raise StateError(f"session tokens must be 1-D, got shape {list(tokens.shape)}")
    token_ids = check_token_ids(tokens.tolist(), c.vocab, error=StateError)
    T = len(token_ids)
    layers_in = list(payload.layers)
    if len(layers_in) != c.n_layers:
        raise StateError(f"session state has {len(layers_in)} layers, the model has {c.n_layers}")
    logits = None
    if T:
        logits = mx.array(_check("logits", payload.logits, (c.vocab,)))
    out = []
    for li, lp in enumerate(layers_in):
        r = c.ratios[li]
        arrays = {name: _check(f"layer {li} {name}", getattr(lp, name, None), (rows, cols))
                  for name, rows, cols in LayerState.layout(c, li, T)}
        if r == 0:
            extra = [getattr(lp, name, None) for name in FIELDS if name not in arrays]
            if any(x is not None and np.asarray(x).size for x in extra):
                raise StateError(f"session state layer {li} is dense but carries compressor arrays")
        layer = {name: mx.array(arrays[name]) for name in arrays if name not in FILLER}
        for kv, score, ratio in (("attn_kv", "attn_score", r), ("index_kv", "index_score", 4)):
            if kv in arrays:
                layer[kv], layer[score] = _canonical_frontier(arrays[kv], arrays[score], ratio, T)
        out.append(LayerState(**layer))
    return SessionState(tokens=token_ids, logits=logits, layers=tuple(out))
