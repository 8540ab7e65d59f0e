"""A worker rank of a pipeline (ranks 1..): `serve`, the loop that runs rank 0's commands on this
rank's layers, and `worker_main`, the process that launch.py starts (`python -m
ds4agent.engine.pipeline.worker MODEL ...`).

Worker ranks wait for commands without a time limit and exit when rank 0's connection goes away.
A worker prints one line, "ready", once its layers are loaded (launch waits for it before it joins
the ring); errors go to stderr, which launch reads back when the rank fails. A process entry
point, so it prints; nothing else in the engine does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import mlx.core as mx
import numpy as np

from ..errors import EngineError, PipelineError
from ..loader import load_local
from ..model import output_head, run_layers
from ..session import Engine
from ..state import SessionState, empty_layer
from . import wire
from .ring import CONNECT_TIMEOUT_S, TIMEOUT_S, Link
from .split import plan_ranges


def serve(link: Link, part: Engine, ranges: Sequence[tuple[int, int]], *,
          timeout: float = TIMEOUT_S) -> None:
    """A worker rank's loop: run rank 0's commands on this rank's layers until STOP (or until
    rank 0 goes away: the link raises and the process ends)."""
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
        header = relay(link.recv_ints(wire.HEADER, prev, "waiting for a command", None))
        op, base, new, n, flag, n_dropped = header
        dropped = relay(link.recv_ints(n_dropped, prev, "receiving a command")) if n_dropped else []
        if op == wire.STOP:
            return
        toks_list = relay(link.recv_ints(n, prev, "receiving tokens")) if op in (wire.FORWARD, wire.IMPORT) else []
        if op == wire.FORWARD:
            state = states[base]
            R = link.recv((n, c.hc_count, c.dim), mx.float32, rank - 1, "waiting for activations",
                          timeout + wire.PER_TOKEN_S * n * rank)
            toks = mx.array(np.asarray(toks_list, dtype=np.int32))
            R, layers = run_layers(w.layers, c, state.layers, R, toks, state.n_tokens, first_layer=mine[0],
                                   kernels=w.kernels)
            new_state = SessionState(tokens=state.tokens + tuple(toks_list), logits=None, layers=layers)
            if last:
                logits = output_head(w, c, R[-1:] if flag else R)
                mx.eval(logits, *new_state.arrays())
                link.send(logits, 0, "sending the logits")
            else:
                mx.eval(R, *new_state.arrays())
                link.send(R, rank + 1, f"sending activations to rank {rank + 1}")
            states[new] = new_state
        elif op == wire.EXPORT:
            # What ranks 1..rank-1 sent, then this rank's layers, on to the next (last: to 0).
            own = wire.flatten_layers(states[base].layers)
            if rank > 1:
                before = link.recv((wire.flat_size(c, (ranges[1][0], mine[0]), n),), mx.float32, prev,
                                   "receiving the state", timeout * rank)
                own = mx.concatenate([before, own])
            link.send(own, nxt, "sending the state")
        elif op == wire.IMPORT:
            flat = link.recv((wire.flat_size(c, (mine[0], ranges[-1][1]), n),), mx.float32, prev,
                             "receiving the state")
            size = wire.flat_size(c, mine, n)
            if not last:
                link.send(flat[size:], nxt, "passing the state on")
            layers = wire.unflatten_layers(flat[:size], c, mine, n)
            states[new] = SessionState(tokens=tuple(toks_list), logits=None, layers=layers).eval()
        else:
            raise PipelineError(f"unknown pipeline command {op}")
        # After the command, so that a dropped key is never one the command still needed.
        for key in dropped:
            states.pop(key, None)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """`python -m ds4agent.engine.pipeline.worker MODEL --ctx N --split S --timeout T`: one worker rank
    (MLX_RANK / MLX_HOSTFILE in the environment, as launch() or mlx.launch set them)."""
    p = argparse.ArgumentParser(prog="ds4agent-pipeline-rank")
    p.add_argument("model")
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = p.parse_args(argv)
    rank = int(os.environ.get("MLX_RANK", "-1"))
    split = [int(s) for s in args.split.split(",") if s]
    try:
        ranges = plan_ranges(args.model, len(split) + 1, split)
        if not 1 <= rank < len(ranges):
            raise PipelineError(f"MLX_RANK={rank} is not a worker rank of {len(ranges)}")
        part = load_local(args.model, ctx=args.ctx, layer_range=ranges[rank])
        _tell_launcher(sys.stdout, "ready")  # launch() joins the ring only once every rank is here
        link = Link(rank, os.environ.get("MLX_HOSTFILE", ""), connect_timeout=max(args.timeout, CONNECT_TIMEOUT_S))
        serve(link, part, ranges, timeout=args.timeout)
    except (EngineError, RuntimeError) as err:
        _tell_launcher(sys.stderr, f"ds4agent pipeline rank {rank}: {err}")
        return 1
    return 0


def _tell_launcher(stream: TextIO, line: str) -> None:
    """A worker rank's stdout and stderr are pipes read by rank 0's launcher (launch.py), not a
    terminal: "ready" is the start-up handshake, and an error line becomes the PipelineError that
    rank 0 reports. Flushed at once: the launcher waits on these lines."""
    stream.write(line + "\n")
    stream.flush()


if __name__ == "__main__":  # pragma: no cover
    code = worker_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip MLX's C++ teardown (cli.entry explains why)
