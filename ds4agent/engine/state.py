"""SessionState: everything needed to continue after T tokens (model.md §8), as MLX arrays.

Immutable by construction (frozen dataclasses of immutable MLX arrays and tuples): the forward
pass returns a NEW state and never mutates its input, so keeping a reference is an O(1)
snapshot and rewinding is just using an older reference.

Per layer (field names = `sessions.payload.LayerPayload`'s, so conversion is attribute for
attribute):

    raw          [R, Dh]   R = min(T, window) raw KV rows in LOGICAL order (positions T-R .. T-1),
                           F16-exact (model.md §5)
    comp         [T // r, Dh]         compressed rows (ratio r != 0), F16-exact
    attn_kv      [coff·r, coff·Dh]    compressor frontier projections, f32 (kvc-format.md §9.4)
    attn_score   [coff·r, coff·Dh]    frontier scores (APE added)
    index_comp   [T // 4, Di]         indexer rows (ratio 4), F16-exact
    index_kv / index_score [8, 2·Di]  indexer frontier (ratio 4)

Frontier rows outside the current partial window ALWAYS hold the canonical filler (kv 0.0,
score -1e30), in memory as on disk: exported payloads need no fix-up and two states that hold
the same tokens are equal array for array whatever the chunk schedule was.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import numpy as np

from .config import ModelConfig
from .errors import StateError
from .hostread import to_host

FILL_KV = 0.0
FILL_SCORE = -1.0e30  # not -inf: kvc-format.md §9.4 canonical filler


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
        return [a for a in (self.raw, self.comp, self.attn_kv, self.attn_score, self.index_comp,
                            self.index_kv, self.index_score) if a is not None]


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



def frontier_filler(rows: int, cols: int) -> tuple[mx.array, mx.array]:
    return (mx.full((rows, cols), FILL_KV, dtype=mx.float32),
            mx.full((rows, cols), FILL_SCORE, dtype=mx.float32))


def empty_layer(config: ModelConfig, layer: int) -> LayerState:
    Dh, Di = config.head_dim, config.indexer_dim
    r, coff = config.ratios[layer], config.coff(layer)
    raw = mx.zeros((0, Dh), dtype=mx.float32)
    if r == 0:
        return LayerState(raw=raw)
    kv, sc = frontier_filler(coff * r, coff * Dh)
    if r != 4:
        return LayerState(raw=raw, comp=mx.zeros((0, Dh), dtype=mx.float32), attn_kv=kv, attn_score=sc)
    ikv, isc = frontier_filler(8, 2 * Di)
    return LayerState(raw=raw, comp=mx.zeros((0, Dh), dtype=mx.float32), attn_kv=kv, attn_score=sc,
                      index_comp=mx.zeros((0, Di), dtype=mx.float32), index_kv=ikv, index_score=isc)


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
    layers = []
    for lay in state.layers:
        layers.append(mk_l(raw=_np(lay.raw), comp=_np(lay.comp), attn_kv=_np(lay.attn_kv),
                           attn_score=_np(lay.attn_score), index_comp=_np(lay.index_comp),
                           index_kv=_np(lay.index_kv), index_score=_np(lay.index_score)))
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
    kv = kv.copy()
    sc = sc.copy()
    if r == 4:
        keep = np.zeros(8, dtype=bool)
        keep[4:4 + T % 4] = True
        keep[0:4] = T >= 4  # previous complete group exists once one group completed
    else:
        keep = np.zeros(r, dtype=bool)
        keep[: T % r] = True
    kv[~keep] = FILL_KV
    sc[~keep] = FILL_SCORE
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
    T = int(tokens.shape[0])
    if T and (tokens.min() < 0 or tokens.max() >= c.vocab):
        raise StateError(f"session state has a token id outside 0..{c.vocab - 1}")
    layers_in = list(payload.layers)
    if len(layers_in) != c.n_layers:
        raise StateError(f"session state has {len(layers_in)} layers, the model has {c.n_layers}")
    logits = None
    if T:
        logits = mx.array(_check("logits", payload.logits, (c.vocab,)))
    Dh, Di, W = c.head_dim, c.indexer_dim, c.window
    R = min(T, W)
    out = []
    for li, lp in enumerate(layers_in):
        r, coff = c.ratios[li], c.coff(li)
        raw = mx.array(_check(f"layer {li} raw", lp.raw, (R, Dh)))
        if r == 0:
            extra = [getattr(lp, k, None) for k in ("comp", "attn_kv", "index_comp")]
            if any(x is not None and np.asarray(x).size for x in extra):
                raise StateError(f"session state layer {li} is dense but carries compressor arrays")
            out.append(LayerState(raw=raw))
            continue
        comp = mx.array(_check(f"layer {li} comp", lp.comp, (T // r, Dh)))
        kv = _check(f"layer {li} attn_kv", lp.attn_kv, (coff * r, coff * Dh))
        sc = _check(f"layer {li} attn_score", lp.attn_score, (coff * r, coff * Dh))
        akv, asc = _canonical_frontier(kv, sc, r, T)
        if r != 4:
            out.append(LayerState(raw=raw, comp=comp, attn_kv=akv, attn_score=asc))
            continue
        icomp = mx.array(_check(f"layer {li} index_comp", lp.index_comp, (T // 4, Di)))
        ikv = _check(f"layer {li} index_kv", lp.index_kv, (8, 2 * Di))
        isc = _check(f"layer {li} index_score", lp.index_score, (8, 2 * Di))
        ikv_, isc_ = _canonical_frontier(ikv, isc, 4, T)
        out.append(LayerState(raw=raw, comp=comp, attn_kv=akv, attn_score=asc, index_comp=icomp,
                              index_kv=ikv_, index_score=isc_))
    return SessionState(tokens=tuple(int(t) for t in tokens), logits=logits, layers=tuple(out))

