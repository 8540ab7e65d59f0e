"""Pipeline parallelism: the model's layers split over the ranks of MLX's distributed ring.

    engine = pipeline_launch.launch(model_path, ctx=..., ranks=2)   # or hosts="hosts.json"
    s = engine.new_session(); s.sync(tokens); s.step(tok)           # the ordinary Session API
    engine.close()

This module is the model's side: the layer split, rank 0's Engine (PipelineEngine) and the loop
the other ranks run (serve). ring.py moves the arrays; pipeline_launch.py starts the ranks.

Rank 0 is this process: it holds the embedding and the first layers and runs the agent; rank k
holds the next contiguous range of layers, the last rank also the output head. A forward pass of
a chunk is: rank 0 sends the command (state keys and the chunk's token ids, which hash-routed
layers need) down the chain — MLX's ring links neighbours only, so each rank passes it on — runs
its layers and sends the hyper-connection residual R [n, hc, E] f32 to rank 1; each rank runs its
layers and passes R on; the last rank runs the head and sends the logits (one row, or every row
for dump-logits) to rank 0, its neighbour across the ring's wrap. Nothing else crosses the network
per token. The per-layer math is model.run_layers, exactly what one process runs, and CPU results
do not depend on where a graph is cut, so logits and state are bit-identical to one process.

State: every rank keeps its own layers' state. Rank 0's SessionState carries a `key`; the other
ranks keep their part of each live state under the same key (key 0 = empty). A state that rank 0
garbage-collects (no snapshot holds it any more) is forgotten on the other ranks with the next
command, so snapshots, rewind and sync's prefix reuse work unchanged and remote ranks hold what
rank 0 holds. Export gathers every rank's layers into one full payload (the KVC bytes equal a
single-process save); import validates the whole payload on rank 0 first, then scatters the layers.

Failure: rank 0 waits for every receive with a timeout (ring.Link); a lost rank is a
PipelineError (an EngineLost: the agent journals the session and ends it). Worker ranks wait for
commands without a time limit and exit when rank 0's connection goes away.
"""

from __future__ import annotations

import subprocess
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import EngineError, PipelineError
from ..session import Engine
from ..state import LayerState, SessionState, empty_layer
from .ring import TIMEOUT_S, Link

PER_TOKEN_S = 0.05  # added to a receive's timeout per token of the chunk

_FORWARD, _EXPORT, _IMPORT, _STOP = 1, 2, 3, 4
_HEADER = 6  # op, base key, new key, token count, flag (last_only), dropped-key count
_LAYER_FIELDS = ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score")


# ---- layer split ----------------------------------------------------------------------------------


def balance(layer_bytes: Sequence[int], ranks: int, *, first_extra: int = 0,
            last_extra: int = 0) -> list[tuple[int, int]]:
    """Contiguous layer ranges [(start, stop)] for `ranks` ranks, each with at least one layer,
    that minimise the largest rank's bytes (rank 0 also holds `first_extra`: the embedding; the
    last rank `last_extra`: the output head)."""
    L = len(layer_bytes)
    if not 1 <= ranks <= L:
        raise PipelineError(f"cannot split {L} layers over {ranks} ranks (1..{L} ranks)")
    pre = np.concatenate([[0], np.cumsum(layer_bytes)]).astype(np.int64)

    def cost(k: int, a: int, b: int) -> int:
        c = int(pre[b] - pre[a])
        return c + (first_extra if k == 0 else 0) + (last_extra if k == ranks - 1 else 0)

    inf = float("inf")
    # best[k][b]: the smallest max-load of ranks 0..k covering layers 0..b-1 (k+1 ranks).
    best = [[inf] * (L + 1) for _ in range(ranks)]
    cut = [[0] * (L + 1) for _ in range(ranks)]
    for b in range(1, L + 1):
        best[0][b] = cost(0, 0, b)
    for k in range(1, ranks):
        for b in range(k + 1, L + 1):
            for a in range(k, b):
                v = max(best[k - 1][a], cost(k, a, b))
                if v < best[k][b]:
                    best[k][b], cut[k][b] = v, a
    bounds, b = [L], L
    for k in range(ranks - 1, 0, -1):
        b = cut[k][b]
        bounds.append(b)
    bounds.append(0)
    bounds.reverse()
    return list(zip(bounds, bounds[1:], strict=False))


def ranges_from_split(split: Sequence[int], n_layers: int) -> list[tuple[int, int]]:
    """The ranges of an explicit split: the first layer of ranks 1..N-1 (e.g. [22] for two)."""
    bounds = [0, *[int(s) for s in split], n_layers]
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise PipelineError(f"pipeline split {list(split)} must be increasing layer numbers in "
                            f"1..{n_layers - 1}")
    return list(zip(bounds, bounds[1:], strict=False))


def gguf_layer_bytes(tensors, config) -> tuple[list[int], int, int]:
    """(bytes per layer, embedding bytes, head bytes) of a GGUF directory, as memory holds them
    (info's accounting: what a rank's share of the model costs)."""
    from ..memory import _memory_bytes

    per = [0] * config.n_layers
    emb = head = 0
    for ti in tensors:
        size = _memory_bytes(ti.name, ti.type_name, ti.n_elements, ti.nbytes)
        if ti.name.startswith("blk."):
            per[int(ti.name.split(".", 2)[1])] += size
        elif ti.name == "token_embd.weight":
            emb += size
        else:
            head += size
    return per, emb, head


def plan_ranges(model_path, ranks: int, split: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The layer ranges of a pipeline of `ranks` over a GGUF model (balanced unless `split`)."""
    from ds4agent.testmodels.writer import TEST_MODEL_KEY

    from ..config import from_metadata
    from ..gguf import GGUFFile

    if Path(model_path).is_dir():
        raise PipelineError(f"{model_path}: a pipeline runs GGUF files only, not converted MLX directories")
    with GGUFFile.open(model_path) as gf:
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        mode = "test" if gf.metadata.get(TEST_MODEL_KEY) else "flash"
        config = from_metadata(gf.metadata, mode=mode, types=types)
        if split:
            ranges = ranges_from_split(split, config.n_layers)
            if len(ranges) != ranks:
                raise PipelineError(f"pipeline split {list(split)} gives {len(ranges)} ranks, not {ranks}")
            return ranges
        per, emb, head = gguf_layer_bytes(gf.tensors.values(), config)
    return balance(per, ranks, first_extra=emb, last_extra=head)


# ---- state layout -------------------------------------------------------------------------------


def layer_shapes(config, layer: int, n_tokens: int) -> list[tuple[int, int]]:
    """Shapes of a layer state's arrays after n_tokens, in _LAYER_FIELDS order (present ones)."""
    c, T = config, n_tokens
    Dh, Di, r, coff = c.head_dim, c.indexer_dim, c.ratios[layer], c.coff(layer)
    shapes = [(min(T, c.window), Dh)]
    if r:
        shapes += [(T // r, Dh), (coff * r, coff * Dh), (coff * r, coff * Dh)]
    if r == 4:
        shapes += [(T // 4, Di), (8, 2 * Di), (8, 2 * Di)]
    return shapes


def flat_size(config, layer_range: tuple[int, int], n_tokens: int) -> int:
    return sum(a * b for li in range(*layer_range) for a, b in layer_shapes(config, li, n_tokens))


def flatten_layers(layers: Sequence[LayerState]) -> mx.array:
    parts = [getattr(lay, f).reshape(-1) for lay in layers for f in _LAYER_FIELDS
             if getattr(lay, f) is not None]
    return mx.concatenate(parts) if parts else mx.zeros((0,), dtype=mx.float32)


def unflatten_layers(flat: mx.array, config, layer_range: tuple[int, int],
                     n_tokens: int) -> tuple[LayerState, ...]:
    out, off = [], 0
    for li in range(*layer_range):
        arrays = []
        for a, b in layer_shapes(config, li, n_tokens):
            arrays.append(flat[off:off + a * b].reshape(a, b))
            off += a * b
        out.append(LayerState(**dict(zip(_LAYER_FIELDS, arrays, strict=False))))
    return tuple(out)


@dataclass(frozen=True)
class RankState(SessionState):
    """Rank 0's part of a pipelined session state: its own layers, the tokens and logits, and
    the key under which the other ranks keep their layers of the same state."""

    key: int = 0


# ---- rank 0 ------------------------------------------------------------------------------------


class PipelineEngine(Engine):
    """Rank 0's Engine: sessions run as on one process; the forward pass, export and import reach
    the other ranks. Build it with `launch`."""

    link: Link
    ranges: list[tuple[int, int]]

    @classmethod
    def attach(cls, part: Engine, link: Link, ranges: list[tuple[int, int]],
               workers: Sequence[subprocess.Popen] = (), cleanup: Callable[[], None] | None = None,
               timeout: float = TIMEOUT_S, report: Callable[[], str] | None = None) -> PipelineEngine:
        eng = cls.__new__(cls)
        eng.__dict__.update(part.__dict__)
        eng.link, eng.ranges, eng.timeout = link, list(ranges), float(timeout)
        eng._workers = list(workers)
        eng._cleanup = cleanup
        eng._report = report
        eng._next_key = 1
        eng._dropped: list[int] = []
        # Re-entrant: a collection inside _command (an allocation under the lock) runs _drop.
        eng._lock = threading.RLock()
        return eng

    @property
    def n_ranks(self) -> int:
        return len(self.ranges)

    def snapshot_store(self, budget_bytes: int):
        """Turn snapshots as handles (snapshots.ReferenceSnapshotStore): the layer arrays of a
        pipeline state live on the other ranks, so they cannot be packed on rank 0."""
        from ..snapshots import ReferenceSnapshotStore

        return ReferenceSnapshotStore(self)

    def describe(self) -> str:
        """The model line the agent shows at start: name and where each layer range runs."""
        parts = ", ".join(f"rank {k}: layers {a}-{b - 1}" for k, (a, b) in enumerate(self.ranges))
        return f"{self.config.name} on a pipeline of {self.n_ranks} ({parts})"

    # -- keys
    def _new_key(self) -> int:
        key = self._next_key
        self._next_key += 1
        return key

    def _adopt(self, state: RankState) -> RankState:
        """Track a new state: once nothing here holds it, the other ranks forget their part."""
        weakref.finalize(state, self._drop, state.key)
        return state

    def _drop(self, key: int) -> None:
        # Runs in whatever thread collects the state; sent with the next command.
        with self._lock:
            self._dropped.append(key)

    def _command(self, op: int, base: int, new: int, n: int, flag: int = 0,
                 tokens: Sequence[int] = ()) -> None:
        """Send a command down the chain (each rank passes it on: the ring links neighbours
        only), with the keys rank 0 has dropped since the last one and the command's tokens."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
        self.link.send_ints([op, base, new, n, flag, len(dropped)], 1, "sending a command")
        if dropped:
            self.link.send_ints(dropped, 1, "sending a command")
        if tokens:
            self.link.send_ints(tokens, 1, "sending tokens")

    def _guard(self, what: str, fn: Callable):
        """Run fn; a lost rank becomes one PipelineError naming it where it is known (local
        ranks: which one exited, with the last lines it wrote)."""
        try:
            return fn()
        except PipelineError:
            detail = self._report() if self._report is not None else ""
            if detail:
                message = f"pipeline {detail} (while {what})"
                self.link.break_with(message)
                raise PipelineError(message) from None
            raise

    # -- the Session seam (session.Engine)
    def empty_state(self) -> RankState:
        c = self.config
        state = RankState(tokens=(), logits=None,
                          layers=tuple(empty_layer(c, li) for li in range(*self.ranges[0])), key=0)
        return state.eval()

    def forward(self, state: RankState, tokens: Sequence[int], *, last_only: bool):
        from ..model import embed, run_layers

        if self.link.broken:
            raise PipelineError(self.link.broken)
        c = self.config
        toks_list = [int(t) for t in tokens]
        n = len(toks_list)
        if n == 0:
            return mx.zeros((0, c.vocab), dtype=mx.float32), state
        bad = [t for t in toks_list if not 0 <= t < c.vocab]
        if bad:
            raise EngineError(f"token id {bad[0]} is outside the vocabulary 0..{c.vocab - 1}")
        key = self._new_key()
        wait = self.timeout + PER_TOKEN_S * n

        def run():
            self._command(_FORWARD, state.key, key, n, int(last_only), toks_list)
            toks = mx.array(np.asarray(toks_list, dtype=np.int32))
            R = embed(self.weights, c, toks)
            R, layers = run_layers(self.weights.layers, c, state.layers, R, toks, state.n_tokens,
                                   first_layer=0)
            mx.eval(R, *[a for lay in layers for a in lay.arrays()])
            self.link.send(R, 1, "sending activations to rank 1")
            rows = 1 if last_only else n
            logits = self.link.recv((rows, c.vocab), mx.float32, self.n_ranks - 1,
                                    "waiting for the logits", timeout=wait * self.n_ranks)
            return logits, layers

        logits, layers = self._guard("running the model", run)
        new = RankState(tokens=state.tokens + tuple(toks_list), logits=logits[-1], layers=layers, key=key)
        mx.eval(new.logits)
        return logits, self._adopt(new)

    def state_to_payload(self, state: RankState):
        from ..state import to_payload

        c = self.config
        T = state.n_tokens

        def gather():
            # Ranks 1.. append their layers to what reaches them; the last one sends it all here.
            self._command(_EXPORT, state.key, 0, T)
            rest = (self.ranges[1][0], self.ranges[-1][1])
            flat = self.link.recv((flat_size(c, rest, T),), mx.float32, self.n_ranks - 1,
                                  "receiving the other ranks' state", timeout=self.timeout * self.n_ranks)
            return list(state.layers) + list(unflatten_layers(flat, c, rest, T))

        layers = self._guard("saving the session", gather)
        full = SessionState(tokens=state.tokens, logits=state.logits, layers=tuple(layers))
        return to_payload(full, c, ctx=self.ctx)

    def payload_to_state(self, payload) -> RankState:
        from ..state import from_payload

        c = self.config
        full = from_payload(payload, c).eval()  # every layer validated before any rank changes
        T = full.n_tokens
        key = self._new_key()

        def scatter():
            # Rank 1 gets every other rank's layers, keeps its own and passes the rest on.
            self._command(_IMPORT, 0, key, T, tokens=full.tokens)
            self.link.send(flatten_layers(full.layers[self.ranges[1][0]:]), 1, "sending the state")

        self._guard("loading the session", scatter)
        mine = RankState(tokens=full.tokens, logits=full.logits, layers=full.layers[slice(*self.ranges[0])],
                         key=key)
        return self._adopt(mine)

    def close(self) -> None:
        """Stop the other ranks (they exit) and wait for local ones; safe to call twice."""
        healthy = not self.link.broken
        if healthy:
            try:
                self._command(_STOP, 0, 0, 0)
            except PipelineError:
                healthy = False
            self.link.break_with("the pipeline is closed")
        for p in self._workers:
            try:
                # A rank that got STOP exits at once; after a failure a live one may be hung.
                p.wait(timeout=10 if healthy else 0.5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None


# ---- ranks 1.. -------------------------------------------------------------------------------


def serve(link: Link, part: Engine, ranges: Sequence[tuple[int, int]], *,
          timeout: float = TIMEOUT_S) -> None:
    """A worker rank's loop: run rank 0's commands on this rank's layers until STOP (or until
    rank 0 goes away: the link raises and the process ends)."""
    from ..model import output_head, run_layers

    c, w, rank = part.config, part.weights, link.rank
    mine = ranges[rank]
    last = rank == len(ranges) - 1
    empty = SessionState(tokens=(), logits=None, layers=tuple(empty_layer(c, li) for li in range(*mine)))
    states: dict[int, SessionState] = {0: empty.eval()}
    prev, nxt = rank - 1, (rank + 1) % len(ranges)

    def relay(values: list[int]) -> list[int]:
        if not last:
            link.send_ints(values, nxt, "passing a command on")
        return values

    while True:
        header = relay(link.recv_ints(_HEADER, prev, "waiting for a command", None))
        op, base, new, n, flag, n_dropped = header
        dropped = relay(link.recv_ints(n_dropped, prev, "receiving a command")) if n_dropped else []
        if op == _STOP:
            return
        toks_list = relay(link.recv_ints(n, prev, "receiving tokens")) if op in (_FORWARD, _IMPORT) else []
        if op == _FORWARD:
            state = states[base]
            R = link.recv((n, c.hc_count, c.dim), mx.float32, rank - 1, "waiting for activations",
                          timeout + PER_TOKEN_S * n * rank)
            toks = mx.array(np.asarray(toks_list, dtype=np.int32))
            R, layers = run_layers(w.layers, c, state.layers, R, toks, state.n_tokens, first_layer=mine[0])
            new_state = SessionState(tokens=state.tokens + tuple(toks_list), logits=None, layers=layers)
            if last:
                logits = output_head(w, c, R[-1:] if flag else R)
                mx.eval(logits, *new_state.arrays())
                link.send(logits, 0, "sending the logits")
            else:
                mx.eval(R, *new_state.arrays())
                link.send(R, rank + 1, f"sending activations to rank {rank + 1}")
            states[new] = new_state
        elif op == _EXPORT:
            # What ranks 1..rank-1 sent, then this rank's layers, on to the next (last: to 0).
            own = flatten_layers(states[base].layers)
            if rank > 1:
                before = link.recv((flat_size(c, (ranges[1][0], mine[0]), n),), mx.float32, prev,
                                   "receiving the state", timeout * rank)
                own = mx.concatenate([before, own])
            link.send(own, nxt, "sending the state")
        elif op == _IMPORT:
            flat = link.recv((flat_size(c, (mine[0], ranges[-1][1]), n),), mx.float32, prev,
                             "receiving the state")
            size = flat_size(c, mine, n)
            if not last:
                link.send(flat[size:], nxt, "passing the state on")
            layers = unflatten_layers(flat[:size], c, mine, n)
            states[new] = SessionState(tokens=tuple(toks_list), logits=None, layers=layers).eval()
        else:
            raise PipelineError(f"unknown pipeline command {op}")
        # After the command, so that a dropped key is never one the command still needed.
        for key in dropped:
            states.pop(key, None)
