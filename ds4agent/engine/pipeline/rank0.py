"""Rank 0 of a pipeline: the Engine the agent drives (PipelineEngine), its layers here and the
rest on the other ranks (the room's docstring, pipeline/__init__.py, has the whole picture).

State: rank 0's SessionState carries a `key` (RankState); the other ranks keep their part of
each live state under the same key (key 0 = empty). A state that rank 0 garbage-collects (no
snapshot holds it any more) is forgotten on the other ranks with the next command, so
snapshots, rewind and sync's prefix reuse work unchanged and remote ranks hold what rank 0
holds. Export gathers every rank's layers into one full payload (the KVC bytes equal a
single-process save); import validates the whole payload on rank 0 first, then scatters the
layers. A lost rank is a PipelineError (an EngineLost: the agent journals the session and ends it).
"""

from __future__ import annotations

import subprocess
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..errors import PipelineError
from ..hostread import to_int
from ..model import embed, run_layers
from ..sampler import check_token
from ..session import Engine, PendingStep
from ..snapshots import ReferenceSnapshotStore
from ..state import SessionState, check_token_ids, empty_layer, from_payload, to_payload
from . import wire
from .ring import TIMEOUT_S, Link


@dataclass(frozen=True)
class RankState(SessionState):
    """Rank 0's part of a pipelined session state: its own layers, the tokens and logits, and
    the key under which the other ranks keep their layers of the same state."""

    key: int = 0


# ---- rank 0 ------------------------------------------------------------------------------------


class PipelineEngine(Engine):
    """Rank 0's Engine: sessions run as on one process; the forward pass, export and import reach
    the other ranks. Build it with `launch`."""

    @property
    def chains_steps(self) -> bool:
        return False  # decode_step reads the id first (see decode_step)

    link: Link
    ranges: list[tuple[int, int]]
    timeout: float
    _workers: list[subprocess.Popen]
    _cleanup: Callable[[], None] | None
    _report: Callable[[], str] | None
    _next_key: int
    _dropped: list[int]
    _lock: threading.RLock

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
        eng._dropped = []
        # Re-entrant: a collection inside _command (an allocation under the lock) runs _drop.
        eng._lock = threading.RLock()
        return eng

    @property
    def n_ranks(self) -> int:
        return len(self.ranges)

    def snapshot_store(self, budget_bytes: int):
        """Turn snapshots as handles (snapshots.ReferenceSnapshotStore): the layer arrays of a
        pipeline state live on the other ranks, so they cannot be packed on rank 0."""
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
        state.eval()
        return state

    def decode_step(self, state: SessionState, token) -> PendingStep:
        # The other ranks take their token ids over the ring as host ints, so a pipeline reads
        # the id first and runs the step at once: no overlap of graph building with the device
        # (the ring round trip dominates a pipeline's token anyway).
        tok = check_token(to_int(token))
        _, new = self.forward(state, [tok], last_only=True)
        return PendingStep(base=state, logits=new.logits, finish=lambda _tok: new)

    # The states a PipelineEngine's sessions hold are the RankStates it made (typed as the base
    # class's SessionState, which the Session seam passes through unchanged).
    def forward(self, state: SessionState, tokens: Sequence[int], *, last_only: bool, should_stop=None):
        # should_stop: a pipeline's chunk runs on every rank at once; it is asked between chunks only.
        assert isinstance(state, RankState)
        if self.link.broken:
            raise PipelineError(self.link.broken)
        c = self.config
        toks_list = list(check_token_ids(tokens, c.vocab))
        n = len(toks_list)
        if n == 0:
            return mx.zeros((0, c.vocab), dtype=mx.float32), state
        key = self._new_key()
        wait = self.timeout + wire.PER_TOKEN_S * n

        def run():
            self._command(wire.FORWARD, state.key, key, n, int(last_only), toks_list)
            toks = mx.array(np.asarray(toks_list, dtype=np.int32))
            R = embed(self.weights, c, toks)
            R, layers = run_layers(self.weights.layers, c, state.layers, R, toks, state.n_tokens,
                                   first_layer=0, kernels=self.weights.kernels)
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

    def state_to_payload(self, state: SessionState):
        assert isinstance(state, RankState)
        c = self.config
        T = state.n_tokens

        def gather():
            # Ranks 1.. append their layers to what reaches them; the last one sends it all here.
            self._command(wire.EXPORT, state.key, 0, T)
            rest = (self.ranges[1][0], self.ranges[-1][1])
            flat = self.link.recv((wire.flat_size(c, rest, T),), mx.float32, self.n_ranks - 1,
                                  "receiving the other ranks' state", timeout=self.timeout * self.n_ranks)
            return list(state.layers) + list(wire.unflatten_layers(flat, c, rest, T))

        layers = self._guard("saving the session", gather)
        full = SessionState(tokens=state.tokens, logits=state.logits, layers=tuple(layers))
        return to_payload(full, c, ctx=self.ctx)

    def payload_to_state(self, payload) -> RankState:
        c = self.config
        full = from_payload(payload, c).eval()  # every layer validated before any rank changes
        T = full.n_tokens
        key = self._new_key()

        def scatter():
            # Rank 1 gets every other rank's layers, keeps its own and passes the rest on.
            self._command(wire.IMPORT, 0, key, T, tokens=full.tokens)
            self.link.send(wire.flatten_layers(full.layers[self.ranges[1][0]:]), 1, "sending the state")

        self._guard("loading the session", scatter)
        mine = RankState(tokens=full.tokens, logits=full.logits, layers=full.layers[slice(*self.ranges[0])],
                         key=key)
        return self._adopt(mine)

    def close(self) -> None:
        """Stop the other ranks (they exit) and wait for local ones; safe to call twice."""
        healthy = not self.link.broken
        if healthy:
            try:
                self._command(wire.STOP, 0, 0, 0)
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
