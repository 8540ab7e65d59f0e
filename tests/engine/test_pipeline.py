"""Pipeline parallelism: ranks on 127.0.0.1 over MLX's ring backend give exactly the
model one process runs (logits, states, session bytes), and a lost rank is an error, not a hang.

MLX keeps one ring per process, so every pipeline here runs with its rank 0 in a fresh (spawned)
process; the scenario functions return plain values and the test compares them with this
process's single-process engine."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import traceback

import numpy as np
import pytest

from ds4agent.engine import PipelineError, load_engine
from ds4agent.engine.loader import load_local
from ds4agent.engine.pipeline import launch as pipeline_launch
from ds4agent.engine.pipeline import split, wire, worker
from ds4agent.engine.pipeline.ring import free_ports
from ds4agent.engine.pipeline.split import balance, ranges_from_split
from ds4agent.statelayout import FIELDS
from ds4agent.testmodels import make_test_model

# 21 tokens: past micro's window (8) and several ratio-4 and ratio-16 compressions
TOKENS = [3, 17, 250, 9, 9, 41, 100, 7, 300, 2, 5, 77, 12, 501, 64, 33, 1, 8, 90, 91, 92]
CTX = 64


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("pipe") / "micro.gguf", "micro", seed=3)


def _launch(path, **kw):
    """A pipeline over `path` at CTX, rank 0's part loaded as loader.load_engine loads it."""
    return pipeline_launch.launch(path, lambda layers: load_local(path, ctx=CTX, layer_range=layers), ctx=CTX, **kw)


@pytest.fixture(scope="module")
def single(micro_path):
    return load_engine(micro_path, ctx=CTX)


def payload_bytes(engine, payload) -> bytes:
    from ds4agent.sessions.payload import PayloadShape, write_payload

    s = engine.payload_shape()
    shape = PayloadShape(n_layers=s.n_layers, head_dim=s.head_dim, indexer_dim=s.indexer_dim,
                         vocab=s.vocab, window=s.window, ratios=s.ratios)
    buf = io.BytesIO()
    write_payload(buf, payload, shape)
    return buf.getvalue()


def _child(queue, fn, args):
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


def in_fresh_process(fn, *args):
    """fn(*args) in a spawned process (its own MLX ring); returns its result."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, fn, args))
    proc.start()
    try:
        status, value = queue.get(timeout=300)  # a guard against a hang, not a timing check
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert status == "ok", value
    return value


# ---- scenarios (rank 0 side) ---------------------------------------------------------------------


def _logits_for_chunkings(path, split, chunks):
    engine = _launch(path, ranks=2, split=split)
    try:
        out = {"ranges": engine.ranges, "layers": len(engine.weights.layers),
               "head": engine.weights.output is not None, "embedding": engine.weights.token_embd is not None,
               # waits sleep in select() on MLX's socket from the left neighbour (found, not polled)
               "left_socket": engine.link._left is not None}
        for chunk in chunks:
            engine.chunk = chunk
            out[chunk] = engine.new_session().forward_all(TOKENS)
        engine.chunk = 5
        s = engine.new_session()
        s.sync(TOKENS[:9])
        out["steps"] = [s.step(t).copy() for t in TOKENS[9:]]
    finally:
        engine.close()
    out["exits"] = [w.returncode for w in engine._workers]
    return out


def _sessions_both_ways(path, alone_payload):
    engine = _launch(path, ranks=2)
    try:
        s = engine.new_session()
        s.sync(TOKENS)
        piped = s.export_state()
        t = engine.new_session()
        t.import_state(alone_payload)
        out = {"payload": piped, "tokens": t.tokens, "next": [t.step(77).copy(), t.step(5).copy()],
               "bytes": payload_bytes(engine, piped)}
        # the decode generator over a pipeline: the same tokens, the in-flight step dropped
        from ds4agent.engine import generate
        from ds4agent.engine.sampler import Sampler

        out["decoded"] = list(generate(s, Sampler(temperature=0.0), max_tokens=5))
        out["decoded_state"] = payload_bytes(engine, s.export_state())
        return out
    finally:
        engine.close()


def _snapshots(path):
    engine = _launch(path, ranks=2)
    try:
        p = engine.new_session()
        p.sync(TOKENS[:10])
        snap = p.snapshot()
        for t in TOKENS[10:15]:
            p.step(t)
        p.rewind(snap)
        after_rewind = p.step(TOKENS[10]).copy()
        p.sync(TOKENS[:10] + [400, 401])  # diverges after the snapshot: restarts from it
        out = {"after_rewind": after_rewind, "diverged": p.logits.copy(),
               "bytes": payload_bytes(engine, p.export_state()), "reused": p.prefilled_total}
        # an interrupt stops every rank at a chunk boundary; the next sync goes on from there
        from ds4agent.engine import Interrupted

        engine.chunk = 4
        q, asked = engine.new_session(), []
        try:
            q.sync(TOKENS, should_stop=lambda: asked.append(1) or len(asked) > 2)
        except Interrupted:
            out["interrupted_at"] = q.tokens
        q.sync(TOKENS)
        out["resumed"] = q.logits.copy()
        # the agent's turn snapshots on a pipeline: handles, restored exactly
        engine.chunk = CTX
        store = engine.snapshot_store(1 << 30)
        r = engine.new_session()
        r.sync(TOKENS[:6])
        store.keep(r)
        r.sync(TOKENS[:12])
        store.keep(r)
        r.sync(TOKENS[:3] + [9, 9])  # a branch that left both kept states
        out["store_served"] = store.restore(r, TOKENS[:12] + [400])
        out["store_tokens"] = r.tokens
        out["store_next"] = r.step(400).copy()
        return out
    finally:
        engine.close()


def _three_ranks(path, alone_payload):
    engine = _launch(path, ranks=3, split=[1, 3])
    try:
        p = engine.new_session()
        p.sync(TOKENS[:15])
        out = {"step": p.step(42).copy(), "bytes": payload_bytes(engine, p.export_state())}
        q = engine.new_session()
        q.import_state(alone_payload)
        out["after_import"] = q.step(8).copy()
        return out
    finally:
        engine.close()


def _killed_rank(path):
    engine = _launch(path, ranks=2)
    try:
        p = engine.new_session()
        p.sync(TOKENS[:5])
        engine._workers[0].kill()
        engine._workers[0].wait()
        errors = []
        for _ in range(2):
            try:
                p.step(7)
            except PipelineError as err:
                errors.append(str(err))
        return {"errors": errors, "tokens": p.tokens}
    finally:
        engine.close()


def _hung_rank(path):
    engine = _launch(path, ranks=2, timeout=1.0)
    worker = engine._workers[0]
    try:
        p = engine.new_session()
        p.sync(TOKENS[:5])
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            p.step(7)
        except PipelineError as err:
            return str(err)
        return "no error"
    finally:
        worker.kill()
        engine.close()


# ---- tests ---------------------------------------------------------------------------------------


def test_balance_minimises_the_largest_rank_and_keeps_layers_contiguous():
    assert balance([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    # the embedding on rank 0 and the head on the last rank count toward their loads
    assert balance([10, 10, 10, 10], 2, first_extra=15) == [(0, 1), (1, 4)]
    assert balance([10, 10, 10, 10], 2, last_extra=15) == [(0, 3), (3, 4)]
    assert balance([1, 1, 1, 1, 100, 1], 3) == [(0, 4), (4, 5), (5, 6)]
    assert balance([5, 5, 5], 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(PipelineError, match="cannot split 3 layers over 4 ranks"):
        balance([1, 1, 1], 4)
    assert ranges_from_split([1, 3], 4) == [(0, 1), (1, 3), (3, 4)]
    with pytest.raises(PipelineError, match="increasing layer numbers"):
        ranges_from_split([3, 3], 4)


# micro's ratios are (0, 0, 4, 16): the splits put the boundary before a dense layer, before the
# ratio-4 (indexer) layer and before the ratio-16 layer.
@pytest.mark.parametrize("split", [[1], [2], [3]])
def test_two_ranks_give_the_single_process_logits_for_every_chunking(micro_path, single, split):
    chunks = (1, 3, 8, 21)
    got = in_fresh_process(_logits_for_chunkings, micro_path, split, chunks)
    assert got["ranges"] == [(0, split[0]), (split[0], 4)]
    # rank 0 loaded only its layers and the embedding; the head lives on rank 1
    assert got["layers"] == split[0] and got["embedding"] and not got["head"]
    assert got["left_socket"]
    for chunk in chunks:
        single.chunk = chunk
        want = single.new_session().forward_all(TOKENS)
        assert got[chunk].shape == (len(TOKENS), 512)
        assert np.array_equal(got[chunk], want), chunk
    single.chunk = 5
    s = single.new_session()
    s.sync(TOKENS[:9])
    for row, t in zip(got["steps"], TOKENS[9:], strict=True):
        assert np.array_equal(row, s.step(t))
    assert got["exits"] == [0]  # close() stops the worker cleanly


def test_sessions_are_topology_agnostic(micro_path, single):
    s = single.new_session()
    s.sync(TOKENS)
    alone = s.export_state()
    got = in_fresh_process(_sessions_both_ways, micro_path, alone)
    # /save on the pipeline writes exactly the bytes one process writes
    assert got["bytes"] == payload_bytes(single, alone)
    # a one-process save loads on the pipeline, a pipeline save in one process; both continue alike
    assert got["tokens"] == tuple(TOKENS)
    t = single.new_session()
    t.import_state(got["payload"])
    assert np.array_equal(got["next"][0], t.step(77))
    assert np.array_equal(got["next"][1], t.step(5))
    from ds4agent.engine import generate
    from ds4agent.engine.sampler import Sampler

    assert got["decoded"] == list(generate(s, Sampler(temperature=0.0), max_tokens=5))
    assert got["decoded_state"] == payload_bytes(single, s.export_state())


def test_snapshots_and_rewind_reach_every_rank(micro_path, single):
    got = in_fresh_process(_snapshots, micro_path)
    s = single.new_session()
    s.sync(TOKENS[:11])
    # the other rank continued from its state of the snapshot, not from the live one
    assert np.array_equal(got["after_rewind"], s.logits)
    s.sync(TOKENS[:10] + [400, 401])
    assert np.array_equal(got["diverged"], s.logits)
    assert got["bytes"] == payload_bytes(single, s.export_state())
    assert got["reused"] == 10 + 5 + 1 + 2  # the diverging sync prefilled 2 tokens, not 12
    assert got["interrupted_at"] == tuple(TOKENS[:8])  # two chunks of 4 ran before the stop
    s.sync(TOKENS)
    assert np.array_equal(got["resumed"], s.logits)
    assert got["store_served"] == 12 and got["store_tokens"] == tuple(TOKENS[:12])
    s.sync(TOKENS[:12] + [400])
    assert np.array_equal(got["store_next"], s.logits)


def test_three_ranks_pass_activations_and_state_along_the_ring(micro_path, single):
    s = single.new_session()
    s.sync(TOKENS[:15])
    got = in_fresh_process(_three_ranks, micro_path, s.export_state())
    imported = single.new_session()
    imported.import_state(s.export_state())
    assert np.array_equal(got["after_import"], imported.step(8))
    assert np.array_equal(got["step"], s.step(42))
    assert got["bytes"] == payload_bytes(single, s.export_state())


def test_a_killed_rank_is_a_clear_error_not_a_hang(micro_path):
    got = in_fresh_process(_killed_rank, micro_path)
    assert len(got["errors"]) == 2
    assert "rank 1 exited" in got["errors"][0] and got["errors"][1] == got["errors"][0]
    assert got["tokens"] == tuple(TOKENS[:5])  # the session keeps its last good state


def test_a_hung_rank_runs_into_the_timeout(micro_path):
    message = in_fresh_process(_hung_rank, micro_path)
    assert "did not answer within" in message


def test_bad_pipeline_requests_are_refused_before_anything_starts(micro_path, tmp_path):
    with pytest.raises(PipelineError, match="at least 2 ranks"):
        _launch(micro_path, ranks=1)
    with pytest.raises(PipelineError, match="cannot split 4 layers over 5 ranks"):
        _launch(micro_path, ranks=5)
    with pytest.raises(PipelineError, match=r"gives 3 ranks, not 2"):
        _launch(micro_path, ranks=2, split=[1, 2])
    bad = tmp_path / "hosts.json"
    bad.write_text('{"hosts": [{"ssh": "a"}]}')
    with pytest.raises(PipelineError, match="at least two hosts"):
        _launch(micro_path, hosts=bad)
    bad.write_text('{"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]}')
    with pytest.raises(PipelineError, match='host 1 needs "ssh"'):
        _launch(micro_path, hosts=bad)


@pytest.mark.parametrize("layer_range", [(0, 1), (1, 3), (3, 4)])
def test_a_rank_builds_only_its_layers_and_reads_no_other_tensor(layer_range):
    from ds4agent.engine.config import test_config
    from ds4agent.engine.weights import build_weights, tensor_in_range
    from ds4agent.testmodels.random_weights import random_tensors

    cfg = test_config("micro")
    tensors = random_tensors(cfg, seed=1)
    asked: list[str] = []

    def get(name):
        asked.append(name)
        return tensors[name]

    part = build_weights(cfg, get, has=lambda name: name in tensors, layer_range=layer_range)
    assert set(asked) == {n for n in tensors if tensor_in_range(n, cfg, layer_range)}
    assert part.first_layer == layer_range[0] and len(part.layers) == layer_range[1] - layer_range[0]
    assert (part.token_embd is not None) == (layer_range[0] == 0)
    assert (part.output is not None) == (layer_range[1] == 4)
    assert any(n.startswith(f"blk.{layer_range[0]}.") for n in asked)
    assert not any(n.startswith(f"blk.{layer_range[1]}.") for n in asked)


def test_dump_logits_on_a_pipeline_writes_the_single_process_file(micro_path, tmp_path):
    import subprocess
    import sys

    from ds4agent import cli

    base = ["dump-logits", "--model", str(micro_path), "--tokens", ",".join(map(str, TOKENS)),
            "--chunk", "4"]
    assert cli.main([*base, "--out", str(tmp_path / "one.npy")]) == 0
    # a fresh process: MLX keeps one ring per process
    run = subprocess.run([sys.executable, "-m", "ds4agent.cli", *base, "--pipeline", "2",
                          "--pipeline-split", "3", "--out", str(tmp_path / "two.npy")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "wrote" in run.stdout
    assert np.array_equal(np.load(tmp_path / "two.npy"), np.load(tmp_path / "one.npy"))
    # no ring hostfile or rank log left behind
    assert not list(tmp_path.glob("*.tmp"))


def test_pipeline_flags_are_checked(micro_path, tmp_path, capsys):
    from ds4agent import cli

    with pytest.raises(SystemExit):
        cli.main(["dump-logits", "--model", str(micro_path), "--tokens", "1", "--out",
                  str(tmp_path / "x.npy"), "--pipeline", "2", "--hosts", "h.json"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["dump-logits", "--model", str(micro_path), "--tokens", "1", "--out",
                  str(tmp_path / "x.npy"), "--pipeline", "2", "--pipeline-split", "x"])
    assert "give the first layer of ranks" in capsys.readouterr().err
    # a split without a pipeline is refused before loading anything
    assert cli.main(["dump-logits", "--model", str(micro_path), "--tokens", "1", "--out",
                     str(tmp_path / "x.npy"), "--pipeline-split", "2"]) != 0
    assert "needs --pipeline N or --hosts FILE" in capsys.readouterr().err
    assert not (tmp_path / "x.npy").exists()


def test_the_headless_agent_samples_the_same_tokens_on_a_pipeline(tmp_path):
    import json
    import subprocess
    import sys
    from datetime import datetime

    from ds4agent.engine import EngineLost

    assert issubclass(PipelineError, EngineLost)  # the agent ends the session on it (journal first)
    model = make_test_model(tmp_path / "tiny.gguf", "tiny", seed=2)

    def run(*extra):
        res = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--model", str(model), "--kv-dir",
                              str(tmp_path / "kv"), "-c", "4096", "-n", "12", "--seed", "5", "--nothink",
                              "--permission", "read-only", "--json", *extra, "-p", "hello"],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)
        events = [json.loads(line) for line in res.stdout.splitlines()]
        text = "".join(e["text"] for e in events if e["type"] in ("TextDelta", "ThinkingDelta"))
        generated = [e["generated"] for e in events if e["type"] == "TurnEnded"]
        ready = [e for e in events if e["type"] == "Ready"]
        return (text, generated), ready[0]["model"] if ready else res.stderr

    # The session's prompt carries the local date and time to the minute: two runs on either
    # side of a minute's turn see different prompts and sample different tokens. So the pair is
    # run again until both runs began within one minute (a pair takes seconds: one retry at most,
    # unless the machine is very loaded).
    for _ in range(3):
        minute = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M")
        alone, model_line = run()
        piped, piped_line = run("--pipeline", "2")
        if datetime.now().astimezone().strftime("%Y-%m-%d %H:%M") == minute:
            break
    else:
        pytest.fail("three pairs of runs each straddled a minute's turn")
    assert alone[1] == [12] and len(alone[0]) > 12
    assert piped == alone  # the same 12 sampled tokens
    assert piped_line.startswith(f"{model_line} on a pipeline of 2 (rank 0: layers 0-")


def test_info_prints_the_memory_each_rank_needs(tmp_path, capsys):
    from ds4agent import cli
    from ds4agent.engine.gguf import GGUFFile
    from ds4agent.engine.memory import model_info, payload_bytes, rank_plans
    from tests.weights.flashfile import write_sparse_flash

    # the real q2 directory over a file hole: only the header is read, never tensor data
    path = write_sparse_flash(tmp_path / "ds4flash-q2.gguf")
    info = model_info(path, ctx=100_000)
    ranges = split.plan_ranges(path, 2)
    assert ranges == [(0, 21), (21, 43)]  # balanced by bytes: the embedding tips layer 21 over
    with GGUFFile.open(path) as gf:
        plans = rank_plans(gf.tensors.values(), info.config, 100_000, ranges)
    # every tensor and every layer's state is on exactly one rank
    assert sum(p.weights for p in plans) == info.plan.weights
    assert sum(p.experts for p in plans) == info.plan.experts
    assert sum(p.state for p in plans) == payload_bytes(info.config, 100_000) - 52 - 8 * 43
    assert cli.main(["info", str(path), "--pipeline", "2"]) == 0
    out = capsys.readouterr().out
    assert "pipeline    2 ranks (memory per rank at --ctx 100000):" in out
    assert "rank 0: layers 0-20 + embedding: weights 4.73 GiB, routed experts 35.44 GiB" in out
    assert "rank 1: layers 21-42 + output head: weights 4.56 GiB, routed experts 37.12 GiB" in out


def _free_run(n):
    """A port p with p .. p+n-1 all free now: a hosts-file ring listens on port + rank, so a free
    first port alone (free_ports) leaves the next one to chance, and under xdist the other worker's
    servers take ports from the same range."""
    import socket

    for _ in range(100):
        first = free_ports(1)[0]
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no run of {n} free ports found")


def _over_ssh(path, hosts, stub_dir):
    # `ssh HOST CMD` runs CMD here (a stand-in for the second machine), so the hosts-file path
    # is exercised end to end: the ring file written remotely, MLX_RANK set, the worker started.
    os.environ["PATH"] = f"{stub_dir}{os.pathsep}{os.environ['PATH']}"
    engine = _launch(path, hosts=hosts, port=_free_run(2))
    try:
        s = engine.new_session()
        s.sync(TOKENS[:12])
        return {"logits": s.logits.copy(), "ranges": engine.ranges}
    finally:
        engine.close()


def test_a_hosts_file_starts_the_other_ranks_over_ssh(micro_path, single, tmp_path):
    import json
    import stat

    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "ssh").write_text('#!/bin/sh\n[ "$1" = second-mac ] || exit 255\nshift\nexec /bin/sh -c "$1"\n')
    (stub / "ssh").chmod(stat.S_IRWXU)
    hosts = tmp_path / "hosts.json"  # mlx.distributed_config's format
    hosts.write_text(json.dumps({"backend": "ring", "envs": [], "hosts": [
        {"ssh": "this-mac", "ips": ["127.0.0.1"]}, {"ssh": "second-mac", "ips": ["127.0.0.1"]}]}))
    got = in_fresh_process(_over_ssh, micro_path, hosts, stub)
    s = single.new_session()
    s.sync(TOKENS[:12])
    assert got["ranges"] == [(0, 2), (2, 4)]
    assert np.array_equal(got["logits"], s.logits)
    # a host ssh cannot reach: a clear error naming the rank and what it said, not a 2-minute wait
    hosts.write_text(json.dumps({"hosts": [{"ssh": "this-mac", "ips": ["127.0.0.1"]},
                                           {"ssh": "unknown-mac", "ips": ["127.0.0.1"]}]}))
    (stub / "ssh").write_text('#!/bin/sh\necho "ssh: Could not resolve hostname $1" >&2\nexit 255\n')
    message = in_fresh_process(_failed_start, micro_path, hosts, stub)
    assert message.startswith("pipeline rank 1 exited (status 255): ssh: Could not resolve hostname "
                              "unknown-mac (while connecting)"), message


def _failed_start(path, hosts, stub_dir):
    os.environ["PATH"] = f"{stub_dir}{os.pathsep}{os.environ['PATH']}"
    try:
        _launch(path, hosts=hosts, port=_free_run(2))
    except PipelineError as err:
        return str(err)
    return "started"


class _ScriptedLink:
    """A stand-in Link for serve(): hands out scripted messages, records what is sent."""

    def __init__(self, rank, messages):
        self.rank, self.messages, self.sent = rank, list(messages), []

    def recv_ints(self, n, src, what, timeout=None):
        values = self.messages.pop(0)
        assert len(values) == n, what
        return list(values)

    def recv(self, shape, dtype, src, what, timeout=None):
        import mlx.core as mx

        a = self.messages.pop(0)
        assert tuple(a.shape) == tuple(shape), what
        return mx.array(a)

    def send(self, a, dst, what, timeout=None):
        self.sent.append((dst, np.array(a)))

    def send_ints(self, values, dst, what):
        self.sent.append((dst, np.asarray(values)))


def test_a_worker_forgets_the_states_rank_0_dropped(micro_path, single):
    from ds4agent.engine import model

    part = load_local(micro_path, ctx=CTX, layer_range=(2, 4))
    c = part.config
    # rank 0's side, computed here: R after layers 0-1 for two chunks
    import mlx.core as mx

    def r_after(tokens, state):
        toks = mx.array(np.asarray(tokens, dtype=np.int32))
        R, layers = model.run_layers(single.weights.layers[:2], c, state.layers[:2],
                                     model.embed(single.weights, c, toks), toks, state.n_tokens,
                                     first_layer=0, kernels=single.weights.kernels)
        return np.array(R), state

    s = single.new_session()
    R1, _ = r_after(TOKENS[:5], s._state)
    s.sync(TOKENS[:5])
    R2, _ = r_after(TOKENS[5:8], s._state)
    F, X, STOP = wire.FORWARD, wire.EXPORT, wire.STOP
    link = _ScriptedLink(1, [
        [F, 0, 1, 5, 1, 0], TOKENS[:5], R1,          # key 1 = 5 tokens
        [F, 1, 2, 3, 1, 1], [1], TOKENS[5:8], R2,    # key 2 = 8 tokens; rank 0 dropped key 1
        [X, 2, 0, 8, 0, 0],                          # export key 2: fine
        [STOP, 0, 0, 0, 0, 0],
    ])
    worker.serve(link, part, [(0, 2), (2, 4)])
    s.sync(TOKENS[:8])
    logits = [a for dst, a in link.sent if a.shape == (1, 512)]
    assert len(logits) == 2 and np.array_equal(logits[1][0], s.logits)
    # the export of key 2 holds layers 2-3 of the 8-token state, flattened in payload order
    full = s.export_state()
    want = np.concatenate([getattr(full.layers[li], f).reshape(-1) for li in (2, 3)
                           for f in FIELDS if getattr(full.layers[li], f) is not None])
    assert np.array_equal(link.sent[-1][1], want)
    # key 1 is gone: asking for it now is an error (the worker kept only what rank 0 holds)
    link = _ScriptedLink(1, [[F, 0, 1, 5, 1, 0], TOKENS[:5], R1, [F, 1, 2, 3, 1, 1], [1], TOKENS[5:8], R2,
                             [X, 1, 0, 5, 0, 0]])
    with pytest.raises(KeyError):
        worker.serve(link, part, [(0, 2), (2, 4)])


def test_rank_0_tells_the_other_ranks_every_state_it_drops(micro_path):
    import gc

    from ds4agent.engine.pipeline.rank0 import PipelineEngine, RankState

    class Recorder:
        broken = None

        def __init__(self):
            self.sent = []

        def send_ints(self, values, dst, what):
            self.sent.append(list(values))

    link = Recorder()
    engine = PipelineEngine.attach(load_local(micro_path, ctx=CTX, layer_range=(0, 2)), link, [(0, 2), (2, 4)])
    first = engine._adopt(RankState(tokens=(1,), logits=None, layers=(), key=engine._new_key()))
    second = engine._adopt(RankState(tokens=(1, 2), logits=None, layers=(), key=engine._new_key()))
    del first
    gc.collect()
    engine._command(wire.EXPORT, second.key, 0, 2)
    assert link.sent == [[wire.EXPORT, 2, 0, 2, 0, 1], [1]]
    # a state collected after a command went out rides with the next one
    del second
    gc.collect()
    link.sent.clear()
    engine._command(wire.STOP, 0, 0, 0)
    assert link.sent == [[wire.STOP, 0, 0, 0, 0, 1], [2]]
