"""Starting a pipeline's ranks: local processes or one per host over ssh.

    engine = load_engine(model, ctx=..., ranks=2)          # loader.py: one process when ranks/hosts are None
    engine = load_engine(model, ctx=..., hosts="hosts.json")   # an mlx.launch hosts file

This process is rank 0. Every other rank is `python -m ds4agent.engine.pipeline.worker MODEL ...`
with MLX_RANK / MLX_HOSTFILE set (as mlx.launch sets them): locally a child process, on a host of
the hosts file started over ssh, as mlx.launch does (the app keeps this terminal, so ds4agent
starts them itself). A worker prints "ready" once its layers are loaded; rank 0 joins the ring
after every rank did (see _wait_ready), and reports a rank that exits with the last lines it wrote.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import PipelineError
from ..session import Engine
from .rank0 import PipelineEngine
from .ring import CONNECT_TIMEOUT_S, TIMEOUT_S, Link, free_ports, joined
from .split import plan_ranges


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


def worker_command(model_path, ctx: int, ranges: Sequence[tuple[int, int]], timeout: float) -> list[str]:
    split = ",".join(str(a) for a, _ in ranges[1:])
    return [sys.executable, "-m", "ds4agent.engine.pipeline.worker", str(Path(model_path).resolve()),
            "--ctx", str(ctx), "--split", split, "--timeout", str(timeout)]


def launch(model_path, load_part: Callable[[tuple[int, int]], Engine], *, ctx: int,
           ranks: int | None = None, hosts=None, split: Sequence[int] | None = None,
           timeout: float = TIMEOUT_S, port: int | None = None) -> PipelineEngine:
    """Start a pipeline: `ranks` local processes on 127.0.0.1, or one rank per host of an
    `mlx.launch` hosts file (`hosts`; rank k>0 started over ssh, as mlx.launch does, with the
    same Python and model paths as here; the ring listens on `port` + rank, default 5930).
    This process is rank 0: `load_part(layer_range)` loads its layers (loader.load_engine passes
    its one-process loader; taken as an argument because the loader is what calls this).
    Returns rank 0's engine."""
    if (ranks is None) == (hosts is None):
        raise PipelineError("a pipeline needs either a number of local ranks or a hosts file")
    if joined():
        raise PipelineError("this process already joined a pipeline (MLX keeps one ring per process)")
    host_list = read_hosts(hosts) if hosts is not None else None
    n = len(host_list) if host_list is not None else int(ranks or 0)
    if n < 2:
        raise PipelineError(f"a pipeline needs at least 2 ranks (got {n})")
    ranges = plan_ranges(model_path, n, split)
    if host_list is None:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
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
            log = open(os.path.join(logs.name, f"rank{k}.log"), "wb")  # kept by Popen
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
        part = load_part(ranges[0])

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
    streams = {k: p.stdout for k, p in enumerate(workers, start=1) if p.stdout is not None}  # all: PIPE
    waiting = {streams[k].fileno(): (k, p) for k, p in enumerate(workers, start=1)}
    while waiting:
        left = end - time.monotonic()
        if left <= 0:
            ranks = ", ".join(str(k) for k, _ in waiting.values())
            raise PipelineError(f"pipeline rank {ranks} did not start within {timeout:.0f} s")
        ready, _, _ = select.select(list(waiting), [], [], min(left, 0.5))
        for fd in ready:
            k, p = waiting.pop(fd)
            line = streams[k].readline()
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
