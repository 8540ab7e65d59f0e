"""Engine (weights loaded once) and Session (one live KV state): the API the agent drives.

    engine = load_engine("model.gguf", ctx=100_000, progress=lambda f: ...)   # loader.py
    s = engine.new_session()
    s.sync(tokens, progress=lambda done, total: ..., should_stop=lambda: flag)  # prefill
    for tok in decode(s, sampler, max_tokens=n, greedy=...): ...                 # decode.py
    logits = s.step(token)                                     # one token, logits read back
    snap = s.snapshot(); ...; s.rewind(snap)                                     # O(1)
    payload = s.export_state(); other.import_state(payload)                      # exact resume

Why the pieces look the way they do:

* The live state is an immutable value (state.SessionState holds MLX arrays, which never change
  in place), so a snapshot is just a reference to it and rewinding is an assignment. Every
  method that changes the session computes the complete new state first and only then swaps it
  in: an exception (bad token, rejected import) never leaves a half-updated session behind, and
  an interrupted or failed prefill keeps the last completed chunk (a consistent prefix).
* Prefill runs on the fixed absolute chunk grid of chunks.py (the reason is there).
* `sync` keeps the longest common prefix of the live tokens and the request. When the request
  diverges inside the live state it restores the longest still-alive snapshot that is a prefix
  of the request (snapshots are tracked weakly: the caller decides what to keep) or starts from
  empty, then prefills the rest.
* Threads: MLX streams are thread-local, and an array that is still a lazy graph can only be
  evaluated on the thread that built it ("There is no Stream(cpu, 0) in current thread"). The
  TUI loads the model in a worker and runs it on another, so everything the engine keeps between
  calls is materialised on the thread that made it: the weights at load (`materialize`), the
  empty state, every state a forward pass or an import produces. Evaluated arrays carry no
  stream, so any thread can use them (new work goes to that thread's own default stream).
  A Session is still driven by one thread at a time; it just need not be the loading thread.
* Context: the live state may hold up to ctx tokens (positions 0..ctx-1); more is a
  ContextOverflowError. An imported state must hold fewer than ctx (kvc-format.md §9.5 step 3:
  the next token needs a position), which is also what ds4 accepts.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ds4agent import statelayout

from .chunks import chunk_cap, chunk_grid
from .device import current_device
from .duty import DutyCycle
from .errors import ContextOverflowError, EngineError, Interrupted, StateError
from .experts.base import describe_experts
from .hostread import to_host
from .model import build
from .model import forward as forward_pass
from .snapshots import SnapshotStore
from .state import SessionState, Snapshot, check_token_ids, from_payload, to_payload

MODEL_ID_FLASH = 0  # KVC header byte 7: 0 = DeepSeek V4 Flash (kvc-format.md §2)


@dataclass(frozen=True)
class EnginePayloadShape:
    """The model layout a saved payload must match: `sessions.payload.PayloadShape`'s attributes
    (the engine may not import `sessions`; the agent compares the fields or rebuilds the class)."""

    n_layers: int
    head_dim: int
    indexer_dim: int
    vocab: int
    window: int
    ratios: tuple[int, ...]

    def coff(self, layer: int) -> int:
        return statelayout.coff(self.ratios[layer])


@dataclass(frozen=True, eq=False)
class PendingStep:
    """A decode step on its way through the device, kept off the session until accepted.

    base: the state it extends (the live state when it was dispatched); logits: mx.array [V]
    after the token (being computed); finish(token_id): the new state (the id is known on the
    host only once read, and a state records its tokens as ints)."""

    base: Any
    logits: Any
    finish: Callable[[int], Any]
    parent: PendingStep | None = None  # the unaccepted step this one was dispatched after


def materialize(tree: Any) -> Any:
    """Evaluate every MLX array reachable from `tree` (weights dataclasses, Linear slots, expert
    backends, tuples, dicts) and return `tree`.

    Why at load: the loaders build lazy graphs (F16 -> f32 widening, Q8_0 -> affine repack), and
    a lazy array belongs to the loading thread's stream; once evaluated it is plain data any
    thread can read. It also moves the one-time conversion cost into the load (where the progress
    bar is) instead of the first prefill. numpy arrays (memory-mapped raw expert blocks) are left
    alone: they stay on disk until an expert is selected.
    """
    found: list[mx.array] = []
    seen: set[int] = set()
    stack = [tree]
    while stack:
        obj = stack.pop()
        if isinstance(obj, mx.array):
            found.append(obj)
            continue
        if obj is None or isinstance(obj, (np.ndarray, str, bytes, int, float, bool)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (tuple, list)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("ds4agent."):
            # Our own containers only: dataclasses and plain classes (__dict__), Linear and its
            # subclasses (__slots__ of every class in the MRO: a subclass lists only its own).
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for cls in type(obj).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                stack.extend(getattr(obj, name) for name in ((slots,) if isinstance(slots, str) else slots)
                             if hasattr(obj, name))
    if found:
        mx.eval(found)
    return tree


# ---------------------------------------------------------------------------------------------


FAST_CPU_CHUNK = 512  # the fast CPU set's prefill chunk cap (Engine.__init__ says why)


class Engine:
    """A loaded model: config, weights and the context size sessions run with."""

    @property
    def chains_steps(self) -> bool:
        """Whether decode.py may dispatch token n+1's step before token n is read: only where
        building a step reads nothing back (the GPU kernel set; the CPU kernel set's expert
        kernels read their ids while the graph is built, which would wait for token n's whole
        step before token n is handed out). A pipeline reads the id first: False there too."""
        return self.weights.kernels == "gpu"

    def __init__(self, *, config, weights, ctx: int, quant_bits: int = 2,
                 model_id: int = MODEL_ID_FLASH, path: Path | None = None,
                 chunk: int | None = None):
        check_sizes(ctx, chunk)
        self.config = config
        self.weights = materialize(weights)  # usable from any thread (module docstring)
        self.ctx = int(ctx)
        self.quant_bits = int(quant_bits)
        # Which routed-expert backend runs and why, in words (info, the status line):
        # "mxfp4 via MLX gather_qmm", "IQ2_XXS/Q2_K fast CPU kernels", "Q4_K portable MLX
        # (Metal kernels failed self-check: ...)".
        self.expert_backend = describe_experts(
            ex for lay in self.weights.layers for ex in (lay.ffn.gate_exps, lay.ffn.up_exps, lay.ffn.down_exps))
        self.model_id = int(model_id)
        self.path = path
        self.device = current_device()  # load_engine records the one it chose (with any notice)
        self.gguf: Any = None  # the open model file, kept by load_engine: expert blocks may be views into it
        # The grid cap; `chunk` overrides it (dump-logits --chunk, tests). The payload's h3 is
        # always chunk_cap(ctx), whatever this is, so saved files stay loadable by ds4.
        self.chunk = int(chunk) if chunk is not None else chunk_cap(self.ctx)
        if chunk is None and self.weights.kernels == "cpu":
            # The fast CPU set prefills a Flash-shape token in about half a second: a 4096-token
            # chunk would show no progress for half an hour and hold an interrupt for a minute per
            # layer. 512 tokens still give each routed expert about 12 tokens per weight read, and
            # the set is chunk-invariant, so the results are the same bits.
            self.chunk = min(self.chunk, FAST_CPU_CHUNK)

    def payload_shape(self) -> EnginePayloadShape:
        c = self.config
        return EnginePayloadShape(n_layers=c.n_layers, head_dim=c.head_dim,
                                  indexer_dim=c.indexer_dim, vocab=c.vocab, window=c.window,
                                  ratios=tuple(c.ratios))

    def new_session(self) -> Session:
        return Session(self)

    def close(self) -> None:
        """Release what the engine holds besides memory: a pipeline's other ranks
        (engine/pipeline/); nothing for one process."""

    # The four operations a Session asks of its engine's model: a pipeline's rank 0
    # (pipeline/rank0.py) overrides them to run the other layers on the other ranks.
    def empty_state(self) -> SessionState:
        # eval(): mx.zeros is lazy, and a lazy array cannot cross threads (module docstring).
        return SessionState.empty(self.config).eval()

    def forward(self, state: SessionState, tokens: Sequence[int], *, last_only: bool,
                should_stop: Callable[[], bool] | None = None):
        """(logits mx.array, new state) for a chunk of tokens appended to `state`; should_stop:
        model.run_layers' (an interrupt inside a prefill chunk raises Interrupted).

        last_only: only the last row of logits ([1, V]); prefill and decode need nothing else,
        and the output head (V x E) is the largest single matrix of a small model, so skipping
        the other rows is most of a prefill's work on the test configs. dump-logits asks for
        every row."""
        return forward_pass(self.weights, self.config, state, list(tokens), last_only=last_only,
                            should_stop=should_stop)

    def decode_step(self, state: SessionState, token: Any) -> PendingStep:
        """Dispatch one decode step whose token id is still on the device (the sampler's lazy
        int32 scalar): the graph is built and handed to the device with mx.async_eval, nothing is
        read back and `state` is untouched. decode.py accepts or drops the result."""
        logits, layers = build(self.weights, self.config, state, token.reshape(1).astype(mx.int32),
                               last_only=True)
        logits = logits[0]
        mx.async_eval(logits, *[a for lay in layers for a in lay.arrays()])

        def finish(tok: int) -> SessionState:
            return SessionState(tokens=state.tokens + (tok,), logits=logits, layers=layers)

        return PendingStep(base=state, logits=logits, finish=finish)

    def state_to_payload(self, state: SessionState) -> Any:
        return to_payload(state, self.config, ctx=self.ctx)

    def payload_to_state(self, payload: Any) -> SessionState:
        return from_payload(payload, self.config).eval()

    def snapshot_store(self, budget_bytes: int) -> SnapshotStore:
        """A SnapshotStore (snapshots.py): turn-boundary states sharing their append-only rows."""
        return SnapshotStore(self, budget_bytes)


def check_sizes(ctx: int, chunk: int | None) -> None:
    """Refuse a context or chunk size the engine cannot run (before anything is loaded)."""
    if ctx < 1:
        raise EngineError(f"context size must be at least 1 token (got {ctx})")
    if chunk is not None and chunk < 1:
        raise EngineError(f"prefill chunk must be at least 1 token (got {chunk})")


class Session:
    """One live KV state over an Engine. Not thread-safe: drive it from one worker thread."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._state = engine.empty_state()
        self._logits_np: np.ndarray | None = None
        self._snapshots: list[weakref.ref[Snapshot]] = []
        self.prefilled_total = 0  # tokens ever run through the model (tests assert reuse)
        # The last accepted decode step and the state it made: a step dispatched after it
        # (dispatch's `after`) is accepted only while that state is still the live one.
        self._accepted: PendingStep | None = None
        self._accepted_state: Any = None

    # ------------------------------------------------------------------ read-only views
    @property
    def tokens(self) -> tuple[int, ...]:
        return self._state.tokens

    @property
    def logits(self) -> np.ndarray | None:
        """float32 [V]: the logits after the last live token (None when the state is empty)."""
        if self._state.logits is None:
            return None
        if self._logits_np is None:
            # A read-only view of the evaluated MLX buffer, not a copy: this runs once per decoded
            # token, MLX arrays never change in place, and the view keeps its array alive.
            self._logits_np = to_host(self._state.logits, np.float32, view=True)
        return self._logits_np

    def __len__(self) -> int:
        return len(self._state.tokens)

    # ------------------------------------------------------------------ state swap
    def _commit(self, state) -> None:
        """The only place the live state changes: one assignment of a complete new state."""
        self._state = state
        self._logits_np = None

    def _check_tokens(self, tokens: Sequence[int]) -> tuple[int, ...]:
        out = check_token_ids(tokens, self.engine.config.vocab)
        if len(out) > self.engine.ctx:
            raise ContextOverflowError(len(out), self.engine.ctx)
        return out

    def _run(self, state, tokens: tuple[int, ...], *, last_only: bool = True,
             should_stop: Callable[[], bool] | None = None):
        # model.forward returns its state already evaluated (a state handed out as a snapshot
        # must hold values, not a lazy graph keeping every intermediate of the chunk alive), so
        # no second eval here: this is the per-token decode path.
        logits, new_state = self.engine.forward(state, tokens, last_only=last_only, should_stop=should_stop)
        self.prefilled_total += len(tokens)
        return logits, new_state

    # ------------------------------------------------------------------ prefill / decode
    def sync(self, tokens: Sequence[int], *, progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None, duty: DutyCycle | None = None) -> int:
        """Make the live state hold exactly `tokens`; returns how many tokens were prefilled.

        Keeps the longest common prefix with the live state; prefills the rest in chunks on the
        fixed absolute grid, calling `progress(done, total)` after each chunk. `should_stop()` is
        asked before every chunk and after every layer of one (so an interrupt acts within a
        layer's time: a Flash-shape chunk takes minutes on a CPU); when it says so, Interrupted is
        raised and the live state holds the prefix reached so far (a chunk boundary: a chunk cut
        inside is dropped): the next sync continues from there.
        `duty` rests after every chunk (duty.py). A chunk, not a layer, is the unit: a chunk's
        layers run as one evaluated graph, and a chunk takes seconds at most, far below the time a
        laptop takes to heat up, so resting per chunk keeps the same average load.
        """
        target = self._check_tokens(tokens)
        n = _common_prefix(self._state.tokens, target)
        if n < len(self._state.tokens):
            self._rewind_for(target)
        start = len(self._state.tokens)
        total = len(target) - start
        done = 0
        if duty is not None:
            duty.begin()
        for p0, p1 in chunk_grid(start, len(target), self.engine.chunk):
            if should_stop is not None and should_stop():
                raise Interrupted(f"prefill interrupted after {done} of {total} tokens",
                                  done=done, total=total)
            try:
                _, state = self._run(self._state, target[p0:p1], should_stop=should_stop)
            except Interrupted:  # inside the chunk: its work is dropped, the state stays at `done`
                raise Interrupted(f"prefill interrupted after {done} of {total} tokens",
                                  done=done, total=total) from None
            # Commit chunk by chunk: an interrupt (or an error in a later chunk) leaves the
            # state at this consistent prefix instead of throwing the work away.
            self._commit(state)
            done += p1 - p0
            if progress is not None:
                progress(done, total)
            if duty is not None:
                duty.pause()
        return done

    def step(self, token: int) -> np.ndarray:
        """Decode one token (a chunk of one) and return the new logits (float32 [V]).

        Synchronous and read back: for tests, tools and benchmarks. Generation runs through
        decode.py, which keeps the token on the device and the next step in flight."""
        (tok,) = self._check_tokens([token])
        if len(self._state.tokens) + 1 > self.engine.ctx:
            raise ContextOverflowError(len(self._state.tokens) + 1, self.engine.ctx)
        _, state = self._run(self._state, (tok,))
        self._commit(state)
        return self.logits  # type: ignore[return-value]

    # ---------------------------------------------------------- the decode primitive's seam
    # decode.py drives these four; nothing else should (Session.step is the one-token call).
    @property
    def next_logits(self):
        """mx.array [V]: the logits after the last live token, on the device (None if empty)."""
        return self._state.logits

    def dispatch(self, token, after: PendingStep | None = None) -> PendingStep:
        """Start decoding a device-side token id after the live state (which stays as it is), or
        after `after`, a step dispatched and not yet accepted (decode.py builds token n+1's step
        before token n is read). Such a step is accepted only right after `after`."""
        base = self._state
        if after is not None:
            # Its graph needs the layers and the length after `after`, not `after`'s token id
            # (not read yet): a stand-in id holds the place; accept() records the real ones.
            base = replace(after.finish(0), tokens=after.base.tokens + (0,))
        if len(base.tokens) + 1 > self.engine.ctx:
            raise ContextOverflowError(len(base.tokens) + 1, self.engine.ctx)
        step = self.engine.decode_step(base, token)
        return step if after is None else replace(step, parent=after)

    def accept(self, step: PendingStep, token: int) -> None:
        """Make a dispatched step live: `token` is its id, read back by the caller."""
        if step.parent is None:
            if step.base is not self._state:
                raise EngineError("the session changed while a decode step was in flight")
            new = step.finish(int(token))
        else:
            if self._accepted is not step.parent or self._state is not self._accepted_state:
                raise EngineError("the session changed while a decode step was in flight")
            new = replace(step.finish(int(token)), tokens=self._state.tokens + (int(token),))
        self._commit(new)
        self._accepted, self._accepted_state = step, new
        self.prefilled_total += 1

    def settle(self) -> None:
        """Wait for the live state's arrays: accepted steps are still being computed when they are
        accepted (that is the overlap), and a lazy or in-flight array must not cross threads."""
        self._state.eval()

    def forward_all(self, tokens: Sequence[int]) -> np.ndarray:
        """Prefill `tokens` after the live state on the chunk grid and return every row of logits
        (float32 [n, V], row i = logits after tokens[i]); used by dump-logits."""
        extra = self._check_tokens(tokens)
        target = self._state.tokens + extra
        if len(target) > self.engine.ctx:
            raise ContextOverflowError(len(target), self.engine.ctx)
        rows = []
        for p0, p1 in chunk_grid(len(self._state.tokens), len(target), self.engine.chunk):
            logits, state = self._run(self._state, target[p0:p1], last_only=False)
            rows.append(to_host(logits, np.float32).reshape(p1 - p0, -1))
            self._commit(state)
        if not rows:
            return np.zeros((0, self.engine.config.vocab), dtype=np.float32)
        return np.concatenate(rows, axis=0)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> Snapshot:
        """An O(1) handle on the current state (nothing is copied: the arrays are immutable)."""
        snap = Snapshot(id(self.engine), self._state)
        self._snapshots = [r for r in self._snapshots if r() is not None]
        self._snapshots.append(weakref.ref(snap))
        return snap

    def rewind(self, snap: Snapshot) -> None:
        """Restore a snapshot taken from a session of this engine (O(1))."""
        if not isinstance(snap, Snapshot) or snap.engine_id != id(self.engine):
            raise EngineError("cannot rewind to a snapshot taken from a different engine")
        self._commit(snap.state)

    def reset(self) -> None:
        """Drop the live state (empty session)."""
        self._commit(self.engine.empty_state())

    def _rewind_for(self, target: tuple[int, ...]) -> None:
        """Go back to the longest held snapshot that is a prefix of `target`, else to empty."""
        best = None
        alive = []
        for ref in self._snapshots:
            snap = ref()
            if snap is None:
                continue
            alive.append(ref)
            n = len(snap.tokens)
            if n <= len(target) and snap.tokens == target[:n] and (
                    best is None or n > len(best.tokens)):
                best = snap
        self._snapshots = alive
        if best is not None:
            self._commit(best.state)
        else:
            self.reset()

    # ------------------------------------------------------------------ export / import
    def export_state(self):
        """The live state as an object with `sessions.payload.PayloadState`'s attributes."""
        if not self._state.tokens:
            raise EngineError("nothing to export: the session holds no tokens")
        return self.engine.state_to_payload(self._state)

    def import_state(self, payload) -> None:
        """Replace the live state with a saved one. Validates everything first; on any error the
        live session is left exactly as it was (never half-applied)."""
        ctx = self.engine.ctx
        try:
            T = len(payload.tokens)
            saved_ctx = int(payload.ctx)
        except (AttributeError, TypeError, ValueError):
            raise StateError("not a session state: it lacks tokens or ctx") from None
        if T == 0:
            raise StateError("saved state holds no tokens")
        # The KVC reader's rule (kvc-format.md §9.5 step 3): the next token needs a position.
        if T >= ctx:
            raise StateError(
                f"saved state of {T} tokens does not fit the context of {ctx} tokens")
        if saved_ctx > ctx:
            raise StateError(f"saved state was written with a context of {saved_ctx} tokens, "
                             f"larger than this session's {ctx}")
        try:
            state = self.engine.payload_to_state(payload)
        except EngineError:
            raise
        except (ValueError, TypeError, AttributeError, IndexError) as err:
            raise StateError(f"saved state does not fit this model: {err}") from None
        self._commit(state)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: transcripts are long and usually share almost everything.
    step = 1024
    while i + step <= n and tuple(a[i:i + step]) == tuple(b[i:i + step]):
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i
