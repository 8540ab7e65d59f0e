"""This process's place in MLX's distributed ring (the transport of engine/pipeline/).

    link = Link(rank, hostfile)          # join: hostfile = JSON list of each rank's ["ip:port"]
    link.send(array, dst, "what")        # to a neighbour in the ring
    a = link.recv(shape, dtype, src, "what", timeout=...)

mx.distributed with the "ring" backend (TCP; over Thunderbolt IP between Macs), set up from MLX's
own environment variables (MLX_RANK, MLX_HOSTFILE), as `mlx.launch` does; only neighbours in the
ring can exchange arrays. All traffic runs on one long-lived thread of this module, and the caller
waits for it with a timeout: a peer that dies closes its sockets (MLX reports the lost connection
at once), one that hangs runs into the timeout; either way PipelineError, and the link is finished
(every later call raises the same error).
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import PipelineError
from ..hostread import to_host

# A receive may wait this long before the peer counts as hung (a dead peer is reported at once;
# this is for one that stopped answering). Callers add per-token allowances.
TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 120.0  # all ranks loaded and connected (a model load is part of it)


_JOINED = threading.Lock()  # held for good by the first Link of the process


def joined() -> bool:
    """Whether this process already joined a ring (MLX keeps one per process: see Link)."""
    return _JOINED.locked()


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
        return [int(v) for v in to_host(self.recv((n,), mx.int32, src, what, timeout))]


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


def free_ports(n: int) -> list[int]:
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
