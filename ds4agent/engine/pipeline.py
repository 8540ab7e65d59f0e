"""Pipeline parallelism: the model's layers split over the ranks of MLX's distributed ring.

    engine = launch(model_path, ctx=..., ranks=2)              # local ranks on 127.0.0.1
    engine = launch(model_path, ctx=..., hosts="hosts.json")   # one rank per machine (ssh)
    s = engine.new_session(); s.sync(tokens); s.step(tok)      # the ordinary Session API
    engine.close()

Rank 0 is this process: it holds the embedding and the first layers and runs the agent; rank k
holds the next contiguous range of layers, the last rank also the output head. A forward pass of
a chunk is: rank 0 sends every other rank the command (state keys and the chunk's token ids, which
hash-routed layers need), runs its layers and sends the hyper-connection residual R [n, hc, E] f32
to rank 1; each rank runs its layers and passes R on; the last rank runs the head and sends the
logits (one row, or every row for dump-logits) back to rank 0. Nothing else crosses the network
per token. The per-layer math is model.run_layers, exactly what one process runs, and CPU results
do not depend on where a graph is cut, so logits and state are bit-identical to one process.

State: every rank keeps its own layers' state. Rank 0's SessionState carries a `key`; the other
ranks keep their part of each live state under the same key (key 0 = empty). A state that rank 0
garbage-collects (no snapshot holds it any more) is forgotten on the other ranks with the next
command, so snapshots, rewind and sync's prefix reuse work unchanged and remote ranks hold what
rank 0 holds. Export gathers every rank's layers into one full payload (the KVC bytes equal a
single-process save); import validates the whole payload on rank 0 first, then scatters the layers.

Failure: all ring traffic runs on one long-lived thread of this module, and rank 0 waits for it
with a timeout: a rank that dies closes its sockets (MLX reports the lost connection at once), one
that hangs runs into the timeout; either way rank 0 raises PipelineError and the pipeline is
finished (every later call raises the same error). Worker ranks wait for commands without a time
limit and exit when rank 0's connection goes away.

Transport: mx.distributed with the "ring" backend (TCP; over Thunderbolt IP between Macs), set
up from MLX's own environment variables (MLX_RANK, MLX_HOSTFILE: a JSON list of each rank's
"ip:port"), as `mlx.launch` does.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from .errors import EngineError, EngineLost
from .session import Engine
from .state import LayerState, SessionState, empty_layer

# A receive on rank 0 may wait this long plus PER_TOKEN_S per token of the chunk before the
# peer counts as hung (a dead peer is reported at once; this is for one that stopped answering).
TIMEOUT_S = 120.0
PER_TOKEN_S = 0.05
CONNECT_TIMEOUT_S = 120.0  # all ranks loaded and connected (a model load is part of it)

_FORWARD, _EXPORT, _IMPORT, _STOP = 1, 2, 3, 4
_HEADER = 6  # op, base key, new key, token count, flag (last_only), dropped-key count
_LAYER_FIELDS = ("raw", "comp", "attn_kv", "attn_score", "index_comp", "index_kv", "index_score")


class PipelineError(EngineLost):
    """A pipeline rank died, hung, or could not be started; the pipeline cannot continue."""


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
    from .info import _memory_bytes

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
    from .config import from_metadata
    from .gguf import GGUFFile
    from .testmodel import TEST_MODEL_KEY

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


# ---- ring traffic ------------------------------------------------------------------------------


_JOINED = threading.Lock()  # held for good by the first Link of the process


class Link:
    """This process's rank in the ring. Every send and receive runs on one long-lived thread
    (MLX streams are per thread, and a receive that never returns must not hold the caller):
    the caller waits for it with a timeout and gets PipelineError instead of a hang."""

    def __init__(self, rank: int, hostfile: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 lost: Callable[[], str] | None = None):
        """Join the ring as `rank` of the ring hostfile `hostfile` (JSON list of ["ip:port"] per
        rank). `lost()` names a rank known to be gone ("" while all live): local ranks are
        watched that way, so a rank that exits is reported at once, even while connecting."""
        # MLX keeps the first ring it joins as the process's group for good (a second init returns
        # it, connected to the first pipeline's peers): one pipeline per process.
        if not _JOINED.acquire(blocking=False):
            raise PipelineError("this process already joined a pipeline (MLX keeps one ring per process)")
        self._jobs: queue.Queue = queue.Queue()
        self._broken: str | None = None
        self._lost = lost
        self._thread = threading.Thread(target=self._serve, name="ds4agent-pipeline-link", daemon=True)
        self._thread.start()

        def connect():
            # MLX reads its ring settings from the environment; set them only for this call so
            # that programs the agent runs later do not inherit them.
            saved = {k: os.environ.get(k) for k in ("MLX_RANK", "MLX_HOSTFILE")}
            os.environ["MLX_RANK"], os.environ["MLX_HOSTFILE"] = str(rank), hostfile
            try:
                return mx.distributed.init(backend="ring", strict=True)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        self.group = self._call(connect, connect_timeout, "connecting the pipeline ranks")
        self.rank, self.size = self.group.rank(), self.group.size()
        self._left = _ring_socket_from_left(hostfile, rank)

    def _serve(self) -> None:
        while True:
            fn, box, done = self._jobs.get()
            try:
                box.append((True, fn()))
            except BaseException as err:  # reported to the waiting caller
                box.append((False, err))
            done.set()

    def _call(self, fn: Callable, timeout: float | None, what: str):
        if self._broken is not None:
            raise PipelineError(self._broken)
        done = threading.Event()
        box: list = []
        self._jobs.put((fn, box, done))
        try:
            finished = self._wait(done, timeout)
        except BaseException:
            # Interrupted while the ring is mid-message: the ranks are out of step for good.
            self._broken = f"the pipeline was interrupted while {what}"
            raise
        if not finished:
            self._broken = f"a pipeline rank did not answer within {timeout:.0f} s while {what}"
            raise PipelineError(self._broken)
        if finished is not True:
            self._broken = f"pipeline {finished} while {what}"
            raise PipelineError(self._broken)
        ok, value = box[0]
        if not ok:
            self._broken = f"a pipeline rank was lost while {what} ({value})"
            raise PipelineError(self._broken)
        return value

    def _wait(self, done: threading.Event, timeout: float | None) -> bool | str:
        """True when done, False on timeout, or the lost() message of a rank that is gone."""
        if self._lost is None:
            return done.wait(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 0.2 if end is None else max(0.0, min(0.2, end - time.monotonic()))
            if done.wait(step):
                return True
            gone = self._lost()
            if gone:
                return done.is_set() or gone
            if end is not None and time.monotonic() >= end:
                return False

    @property
    def broken(self) -> str | None:
        return self._broken

    def break_with(self, message: str) -> None:
        self._broken = message

    def send(self, a: mx.array, dst: int, what: str, timeout: float | None = TIMEOUT_S) -> None:
        a = mx.contiguous(a)
        mx.eval(a)  # evaluated here: a lazy graph cannot cross to the link's thread
        self._call(lambda: mx.eval(mx.distributed.send(a, dst, group=self.group)), timeout, what)

    def recv(self, shape: Sequence[int], dtype, src: int, what: str,
             timeout: float | None = TIMEOUT_S) -> mx.array:
        # MLX's ring polls a socket without sleeping while a receive is posted, so a rank that
        # waits (for the next command, for the logits) would keep a CPU core busy the whole time
        # (measured: an idle worker rank used half of this 2-core machine). All our receives come
        # from the left neighbour; wait in select() until its socket has data, then post it.
        start = time.monotonic()
        if src == (self.rank - 1) % self.size:
            self._wait_readable(timeout, what)
        if timeout is not None:
            timeout = max(1.0, timeout - (time.monotonic() - start))

        def job():
            out = mx.distributed.recv(tuple(shape), dtype, src, group=self.group)
            mx.eval(out)
            return out

        return self._call(job, timeout, what)

    def _wait_readable(self, timeout: float | None, what: str) -> None:
        if self._left is None or self._broken is not None:
            return  # not found: the posted receive waits (and polls) instead
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 0.2 if self._lost is not None else None
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    self._broken = f"a pipeline rank did not answer within {timeout:.0f} s while {what}"
                    raise PipelineError(self._broken)
                step = left if step is None else min(step, left)
            try:
                ready, _, _ = select.select([self._left], [], [], step)
            except (OSError, ValueError):
                return  # the socket went away: the receive reports the lost connection
            if ready:
                return  # data or EOF: the receive gets the message or reports the lost peer
            gone = self._lost() if self._lost is not None else ""
            if gone:
                self._broken = f"pipeline {gone} while {what}"
                raise PipelineError(self._broken)

    def send_ints(self, values: Sequence[int], dst: int, what: str) -> None:
        self.send(mx.array(np.asarray(values, dtype=np.int32)), dst, what)

    def recv_ints(self, n: int, src: int, what: str, timeout: float | None = TIMEOUT_S) -> list[int]:
        return [int(v) for v in np.array(self.recv((n,), mx.int32, src, what, timeout))]


def _ring_socket_from_left(hostfile: str, rank: int) -> int | None:
    """The file descriptor of MLX's ring connection from our left neighbour, or None.

    MLX's ring accepts that connection on this rank's own hostfile address (one per address),
    so it is the one TCP socket of this process whose local address is ours and whose peer is
    not. Found by looking at the process's sockets; used only to wait for readability (select),
    never read, so MLX's own receive still gets every byte."""
    try:
        ip, port = json.loads(Path(hostfile).read_text())[rank][0].rsplit(":", 1)
        ours = (socket.gethostbyname(ip), int(port))
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    found = []
    for fd in _open_fds():
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET:
                local, peer = sock.getsockname(), sock.getpeername()
                if (local[0], local[1]) == ours and peer != local:
                    found.append(fd)
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays MLX's
    return found[0] if len(found) == 1 else None


def _open_fds() -> list[int]:
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return sorted(int(name) for name in os.listdir(where) if name.isdigit())
        except OSError:
            continue
    return list(range(3, 1024))


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
        eng._lock = threading.Lock()
        return eng

    @property
    def n_ranks(self) -> int:
        return len(self.ranges)

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
        from .model import embed, run_layers

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
        from .state import to_payload

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
        from .state import from_payload

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
    from .model import output_head, run_layers

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


# ---- starting the ranks ------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def read_hosts(path) -> list[dict]:
    """An `mlx.launch` hosts file: {"hosts": [{"ssh": name, "ips": [ip, ...]}, ...]} (or the bare
    list). Rank k runs on hosts[k]; rank 0 is this machine; the ring uses each host's first ip."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise PipelineError(f"cannot read hosts file {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise PipelineError(f"hosts file {path} is not JSON: {err}") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or len(hosts) < 2:
        raise PipelineError(f"hosts file {path} must list at least two hosts")
    for i, h in enumerate(hosts):
        if not (isinstance(h, dict) and isinstance(h.get("ssh"), str) and h.get("ips")
                and all(isinstance(ip, str) for ip in h["ips"])):
            raise PipelineError(f'hosts file {path}: host {i} needs "ssh" (a name) and "ips" (a list of '
                                "addresses the ring connects to)")
    return hosts


def load_engine(model_path, *, ctx: int, chunk: int | None = None,
                progress: Callable[[float], None] | None = None, ranks: int | None = None, hosts=None,
                split: Sequence[int] | None = None) -> Engine:
    """The engine a command runs: one process (Engine.load), or a pipeline when `ranks` (local
    processes) or `hosts` (an mlx.launch hosts file) is given. Call close() when done."""
    if ranks is None and hosts is None:
        if split:
            raise PipelineError("a pipeline split needs --pipeline N or --hosts FILE")
        return Engine.load(model_path, ctx=ctx, chunk=chunk, progress=progress)
    return launch(model_path, ctx=ctx, ranks=ranks, hosts=hosts, split=split, chunk=chunk,
                  progress=progress)


def worker_command(model_path, ctx: int, ranges: Sequence[tuple[int, int]], timeout: float) -> list[str]:
    split = ",".join(str(a) for a, _ in ranges[1:])
    return [sys.executable, "-m", "ds4agent.engine.pipeline", str(Path(model_path).resolve()),
            "--ctx", str(ctx), "--split", split, "--timeout", str(timeout)]


def launch(model_path, *, ctx: int, ranks: int | None = None, hosts=None,
           split: Sequence[int] | None = None, chunk: int | None = None,
           progress: Callable[[float], None] | None = None, timeout: float = TIMEOUT_S,
           port: int | None = None) -> PipelineEngine:
    """Start a pipeline: `ranks` local processes on 127.0.0.1, or one rank per host of an
    `mlx.launch` hosts file (`hosts`; rank k>0 started over ssh, as mlx.launch does, with the
    same Python and model paths as here; the ring listens on `port` + rank, default 5930).
    This process is rank 0. Returns rank 0's engine."""
    if (ranks is None) == (hosts is None):
        raise PipelineError("a pipeline needs either a number of local ranks or a hosts file")
    if _JOINED.locked():
        raise PipelineError("this process already joined a pipeline (MLX keeps one ring per process)")
    host_list = read_hosts(hosts) if hosts is not None else None
    n = len(host_list) if host_list is not None else int(ranks)
    if n < 2:
        raise PipelineError(f"a pipeline needs at least 2 ranks (got {n})")
    ranges = plan_ranges(model_path, n, split)
    if host_list is None:
        addrs = [f"127.0.0.1:{p}" for p in _free_ports(n)]
    else:
        base = port or 5930
        addrs = [f"{h['ips'][0]}:{base + i}" for i, h in enumerate(host_list)]
    ring = json.dumps([[a] for a in addrs])
    fd, hostfile = tempfile.mkstemp(prefix="ds4agent-ring-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(ring)
    logs = tempfile.TemporaryDirectory(prefix="ds4agent-ranks-")
    cmd = worker_command(model_path, ctx, ranges, timeout)
    workers: list[subprocess.Popen] = []

    def cleanup() -> None:
        for p in workers:
            if p.poll() is None:
                p.kill()
                p.wait()
        Path(hostfile).unlink(missing_ok=True)
        logs.cleanup()

    try:
        for k in range(1, n):
            log = open(os.path.join(logs.name, f"rank{k}.log"), "wb")  # noqa: SIM115 (kept by Popen)
            env = {**os.environ, "MLX_RANK": str(k), "MLX_HOSTFILE": hostfile}
            if host_list is None:
                argv = cmd
            else:
                # No cd: a worker needs only the model (an absolute path), not this directory.
                remote = (f"MLX_RANK={k} MLX_HOSTFILE=$(mktemp) && "
                          f"echo {shlex.quote(ring)} > $MLX_HOSTFILE && export MLX_RANK MLX_HOSTFILE && "
                          f"exec {shlex.join(cmd)}")
                argv = ["ssh", host_list[k]["ssh"], remote]
            # stdout: the worker's one "ready" line; stderr: its log (read back when it fails)
            workers.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=log))
            log.close()
        part = Engine.load(model_path, ctx=ctx, chunk=chunk, progress=progress, layer_range=ranges[0])

        def lost() -> str:
            return next((f"rank {k} exited (status {p.poll()})" for k, p in enumerate(workers, start=1)
                         if p.poll() is not None), "")

        def report() -> str:
            return _worker_report(workers, logs.name)

        try:
            _wait_ready(workers, max(timeout, CONNECT_TIMEOUT_S))
            link = Link(0, hostfile, connect_timeout=max(timeout, CONNECT_TIMEOUT_S), lost=lost)
        except PipelineError as err:
            detail = report()
            raise PipelineError(f"pipeline {detail} (while connecting)" if detail else str(err)) from None
    except BaseException:
        cleanup()
        raise
    engine = PipelineEngine.attach(part, link, ranges, workers, cleanup, timeout, report)
    # Stop the other ranks however this process ends (cli.entry runs exit handlers first).
    atexit.register(engine.close)
    return engine


def _wait_ready(workers: Sequence[subprocess.Popen], timeout: float) -> None:
    """Wait until every worker has loaded its layers and is about to join the ring.

    Why before joining: MLX's ring set-up (mx.distributed.init) blocks in accept() holding the
    GIL, so while it waits nothing else in this process runs, not even a timeout; a rank that
    never comes would hang rank 0 for good. Each worker prints one "ready" line first."""
    end = time.monotonic() + timeout
    waiting = {p.stdout.fileno(): (k, p) for k, p in enumerate(workers, start=1)}
    while waiting:
        left = end - time.monotonic()
        if left <= 0:
            ranks = ", ".join(str(k) for k, _ in waiting.values())
            raise PipelineError(f"pipeline rank {ranks} did not start within {timeout:.0f} s")
        ready, _, _ = select.select(list(waiting), [], [], min(left, 0.5))
        for fd in ready:
            k, p = waiting.pop(fd)
            line = p.stdout.readline()
            if line.strip() != b"ready":
                p.wait()
                raise PipelineError(f"pipeline rank {k} exited (status {p.returncode}) before it was ready")


def _worker_report(workers: Sequence[subprocess.Popen], log_dir: str) -> str:
    """Which local ranks exited, with the last lines each wrote ("" when all run)."""
    lines = []
    for k, p in enumerate(workers, start=1):
        code = p.poll()
        if code is None:
            continue
        try:
            tail = Path(log_dir, f"rank{k}.log").read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        tail = [t for t in tail if not t.startswith("[ring]")]
        lines.append(f"rank {k} exited (status {code})" + (": " + " / ".join(tail) if tail else ""))
    return "; ".join(lines)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """`python -m ds4agent.engine.pipeline MODEL --ctx N --split S --timeout T`: one worker rank
    (MLX_RANK / MLX_HOSTFILE in the environment, as launch() or mlx.launch set them)."""
    import argparse

    p = argparse.ArgumentParser(prog="ds4agent-pipeline-rank")
    p.add_argument("model")
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = p.parse_args(argv)
    rank = int(os.environ.get("MLX_RANK", "-1"))
    split = [int(s) for s in args.split.split(",") if s]
    try:
        from .gguf import GGUFFile  # noqa: F401  (import errors show before the ring starts)

        ranges = plan_ranges(args.model, len(split) + 1, split)
        if not 1 <= rank < len(ranges):
            raise PipelineError(f"MLX_RANK={rank} is not a worker rank of {len(ranges)}")
        part = Engine.load(args.model, ctx=args.ctx, layer_range=ranges[rank])
        print("ready", flush=True)  # launch() joins the ring only once every rank is here
        link = Link(rank, os.environ.get("MLX_HOSTFILE", ""), connect_timeout=max(args.timeout, CONNECT_TIMEOUT_S))
        serve(link, part, ranges, timeout=args.timeout)
    except (EngineError, RuntimeError) as err:
        print(f"ds4agent pipeline rank {rank}: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    code = worker_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip MLX's C++ teardown (cli.entry explains why)
