"""Turn snapshots: many states of one conversation kept in little more memory than one.

    store = SnapshotStore(engine, budget_bytes=2 << 30)
    store.keep(session)                         # pack the live state (a user-turn boundary)
    served = store.restore(session, tokens)     # live state := the longest kept prefix of tokens
    session.sync(tokens)                        # prefills only what no snapshot held

Why packing: `Session.snapshot()` is an O(1) reference to an immutable state, but two states a
turn apart share no memory. The forward pass grows the compressed rows with `mx.concatenate`,
which copies the whole array into a new buffer at every chunk, and an MLX slice keeps its
parent's buffer alive; so N plain references cost N full states. A packed state instead holds
each append-only array (comp, index_comp) as a tuple of row segments: packing reuses the segment
tuple of the longest kept state whose tokens are a prefix of the new one and copies only the rows
added since (an `astype` makes a fresh buffer, never a view). Unpacking concatenates the
segments back into exactly the arrays the live state had.

Two more savings, both exact: raw and compressed rows are F16-exact (model.md §5), so they are
kept as float16 (half the bytes, the same values); the compressor frontiers keep only the rows
that hold values, because every other row is the canonical filler (state.py), which unpacking
writes back.

Past `budget_bytes` (distinct buffers, shared segments counted once) snapshots are dropped, the
oldest first but never the first one (the system prefix boundary), so going back to a dropped
point re-prefills from the nearest earlier snapshot; `restore` returns how many tokens it served,
and the caller's `sync` reports what was prefilled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from ds4agent.statelayout import FILL_KV, FILL_SCORE, coff, frontier_live_rows

from .config import ModelConfig
from .state import LayerState, SessionState, Snapshot


class StoreEngine(Protocol):
    """What the store reads of its engine (session.Engine; typed here, not imported: the
    engine's module builds the store)."""

    config: ModelConfig


class StoreSession(Protocol):
    """What the store asks of a session (session.Session)."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    def snapshot(self) -> Snapshot: ...

    def rewind(self, snap: Snapshot) -> None: ...


F16 = mx.float16
F32 = mx.float32

DEFAULT_BUDGET = 2 << 30  # 2 GiB: about 12 snapshots of a 100k-token Flash state's own rows


@dataclass(frozen=True)
class _PackedLayer:
    raw: mx.array  # float16 [R, Dh]
    comp: tuple[mx.array, ...] | None  # float16 row segments, concatenated = comp
    attn_kv: mx.array | None  # the live rows only (statelayout.frontier_live_rows)
    attn_score: mx.array | None
    index_comp: tuple[mx.array, ...] | None
    index_kv: mx.array | None
    index_score: mx.array | None


@dataclass(frozen=True, eq=False)
class PackedState:
    tokens: tuple[int, ...]
    logits: mx.array | None
    layers: tuple[_PackedLayer, ...]

    def arrays(self) -> list[mx.array]:
        out = [] if self.logits is None else [self.logits]
        for lay in self.layers:
            out.append(lay.raw)
            for a in (lay.attn_kv, lay.attn_score, lay.index_kv, lay.index_score):
                if a is not None:
                    out.append(a)
            for segs in (lay.comp, lay.index_comp):
                if segs is not None:
                    out.extend(segs)
        return out


def _rows(segs: tuple[mx.array, ...]) -> int:
    return sum(int(s.shape[0]) for s in segs)


def _grow(segs: tuple[mx.array, ...] | None, full: mx.array | None) -> tuple[mx.array, ...] | None:
    """`segs` (a prefix of `full`'s rows) plus a fresh float16 copy of the rows after it."""
    if full is None:
        return None
    segs = segs or ()
    have = _rows(segs)
    if int(full.shape[0]) > have:
        segs = segs + (full[have:].astype(F16),)
    return segs


def _concat(segs: tuple[mx.array, ...], width: int) -> mx.array:
    if not segs:
        return mx.zeros((0, width), dtype=F32)
    if len(segs) == 1:
        return segs[0].astype(F32)
    return mx.concatenate(list(segs), axis=0).astype(F32)


def _trim(a: mx.array | None, lo: int, hi: int) -> mx.array | None:
    # mx.array() copies: a slice would keep the whole frontier buffer alive.
    return None if a is None else mx.array(a[lo:hi])


def _pad(a: mx.array | None, lo: int, rows: int, fill: float) -> mx.array | None:
    if a is None:
        return None
    width = int(a.shape[1])
    parts = []
    if lo:
        parts.append(mx.full((lo, width), fill, dtype=F32))
    parts.append(a)
    tail = rows - lo - int(a.shape[0])
    if tail:
        parts.append(mx.full((tail, width), fill, dtype=F32))
    return mx.concatenate(parts, axis=0) if len(parts) > 1 else a


def pack(state: SessionState, ratios: Sequence[int], base: PackedState | None = None) -> PackedState:
    """`state` packed, sharing `base`'s segments (base.tokens must be a prefix of state.tokens)."""
    T = len(state.tokens)
    layers = []
    for li, lay in enumerate(state.layers):
        blay = base.layers[li] if base is not None else None
        lo, hi = frontier_live_rows(ratios[li], T) if ratios[li] else (0, 0)
        ilo, ihi = frontier_live_rows(4, T)
        layers.append(_PackedLayer(
            raw=lay.raw.astype(F16),
            comp=_grow(blay.comp if blay else None, lay.comp),
            attn_kv=_trim(lay.attn_kv, lo, hi), attn_score=_trim(lay.attn_score, lo, hi),
            index_comp=_grow(blay.index_comp if blay else None, lay.index_comp),
            index_kv=_trim(lay.index_kv, ilo, ihi), index_score=_trim(lay.index_score, ilo, ihi),
        ))
    packed = PackedState(state.tokens, state.logits, tuple(layers))
    mx.eval(packed.arrays())
    return packed


def unpack(packed: PackedState, ratios: Sequence[int], head_dim: int, indexer_dim: int) -> SessionState:
    """The exact SessionState that was packed (every array equal, bit for bit)."""
    T = len(packed.tokens)
    layers = []
    for li, lay in enumerate(packed.layers):
        r = ratios[li]
        lo = frontier_live_rows(r, T)[0] if r else 0
        rows = coff(r) * r  # the frontier rows (statelayout)
        ilo = frontier_live_rows(4, T)[0]
        layers.append(LayerState(
            raw=lay.raw.astype(F32),
            comp=None if lay.comp is None else _concat(lay.comp, head_dim),
            attn_kv=_pad(lay.attn_kv, lo, rows, FILL_KV),
            attn_score=_pad(lay.attn_score, lo, rows, FILL_SCORE),
            index_comp=None if lay.index_comp is None else _concat(lay.index_comp, indexer_dim),
            index_kv=_pad(lay.index_kv, ilo, coff(4) * 4, FILL_KV),
            index_score=_pad(lay.index_score, ilo, coff(4) * 4, FILL_SCORE),
        ))
    # Evaluated here, on the caller's thread: a lazy state must not cross threads (session.py).
    return SessionState(packed.tokens, packed.logits, tuple(layers)).eval()


def _is_prefix(short: tuple[int, ...], long: Sequence[int]) -> bool:
    n = len(short)
    return n <= len(long) and tuple(long[:n]) == short


class SnapshotStore:
    """Packed states of one session's conversation, bounded by a memory budget (module docstring)."""

    def __init__(self, engine: StoreEngine, budget_bytes: int = DEFAULT_BUDGET) -> None:
        self.engine = engine
        self.budget_bytes = int(budget_bytes)
        self._kept: list[PackedState | Snapshot] = []  # in the order kept (handles: ReferenceSnapshotStore)
        self.dropped = 0  # snapshots dropped for the budget (tests, status)

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def token_counts(self) -> list[int]:
        return [len(p.tokens) for p in self._kept]

    def nbytes(self) -> int:
        """Bytes of the distinct buffers the kept snapshots hold (a shared segment counts once)."""
        seen: dict[int, int] = {}
        for p in self._kept:
            for a in p.arrays() if isinstance(p, PackedState) else ():
                seen[id(a)] = a.nbytes
        return sum(seen.values())

    def _best(self, tokens: Sequence[int]) -> PackedState | Snapshot | None:
        best = None
        for p in self._kept:
            if (best is None or len(p.tokens) > len(best.tokens)) and _is_prefix(p.tokens, tokens):
                best = p
        return best

    def keep(self, session: StoreSession) -> None:
        """Pack the session's live state (no-op when that exact state is already kept)."""
        state = session.snapshot().state
        base = self._best(state.tokens)
        if base is not None and len(base.tokens) == len(state.tokens):
            return
        c = self.engine.config
        assert not isinstance(base, Snapshot)  # this store keeps packed states only
        self._kept.append(pack(state, c.ratios, base))
        self._enforce_budget()

    def _enforce_budget(self) -> None:
        # Never the first (the cheapest fallback: the system prefix) nor the newest (just kept).
        while len(self._kept) > 2 and self.nbytes() > self.budget_bytes:
            del self._kept[1]
            self.dropped += 1

    def restore(self, session: StoreSession, tokens: Sequence[int]) -> int:
        """Make the live state the longest kept snapshot that is a prefix of `tokens`, unless the
        live state already holds a longer prefix; returns how many tokens are now served."""
        live = session.tokens
        n_live = len(live) if _is_prefix(tuple(live), tokens) else 0
        best = self._best(tokens)
        if best is None or len(best.tokens) <= n_live:
            return n_live
        c = self.engine.config
        assert isinstance(best, PackedState)  # this store keeps packed states only
        state = unpack(best, c.ratios, c.head_dim, c.indexer_dim)
        session.rewind(Snapshot(id(self.engine), state))
        return len(best.tokens)

    def retain_prefixes_of(self, tokens: Sequence[int]) -> None:
        """Forget snapshots that are not a prefix of `tokens` (an abandoned branch)."""
        self._kept = [p for p in self._kept if _is_prefix(p.tokens, tokens)]

    def clear(self) -> None:
        self._kept.clear()


class ReferenceSnapshotStore(SnapshotStore):
    """The same store for an engine whose states cannot be packed here: a pipeline's rank 0
    (pipeline/rank0.py) holds handles whose layer arrays live on the other ranks. It keeps
    `Session.snapshot()` handles instead (O(1); each rank keeps a state's arrays for as long as
    rank 0 holds its handle), at most `max_kept` of them, dropping the middle ones like the
    budget does (rank 0 cannot measure the other ranks' bytes)."""

    def __init__(self, engine: StoreEngine, max_kept: int = 16) -> None:
        super().__init__(engine, 0)
        self.max_kept = max(2, int(max_kept))

    def nbytes(self) -> int:
        return 0  # held on the other ranks, not here

    def keep(self, session: StoreSession) -> None:
        snap = session.snapshot()
        base = self._best(snap.tokens)
        if base is not None and len(base.tokens) == len(snap.tokens):
            return
        self._kept.append(snap)
        while len(self._kept) > self.max_kept:
            del self._kept[1]
            self.dropped += 1

    def restore(self, session: StoreSession, tokens: Sequence[int]) -> int:
        live = session.tokens
        n_live = len(live) if _is_prefix(tuple(live), tokens) else 0
        best = self._best(tokens)
        if best is None or len(best.tokens) <= n_live:
            return n_live
        assert isinstance(best, Snapshot)  # this store keeps handles only
        session.rewind(best)
        return len(best.tokens)
