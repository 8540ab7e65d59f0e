"""The product at the real DS4 Flash shape (issue 13 items 1-3): 43 layers, width 4096, 256 experts
in ds4's q2 types, vocab 129,280, ctx 32768 — on this 2-core CPU, one Flash process at a time.

What each test proves:
* the file passes the strict Flash validation a real file gets, and `info` plans its memory;
* a truncated file, a wrong tensor type, a missing tensor: one line naming it, exit 1, at once;
* dump-logits at full shape: finite, varied logits, bit-identical whatever the chunking, with peak
  resident memory inside issue 13's budget;
* the agent at full shape: headless `-p`; plain mode with /save (a Flash-layout file `kv verify`
  accepts), /new, /load with no prefill, a next turn, kill -9, and the crash resume of the next
  start; the TUI's load progress. The system prompt's KV comes from the cache (see stage.py).
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.flash.conftest import DS4AGENT, flash_env
from tests.flash.stage import seed_sysprompt_cache

GiB = 1 << 30
CTX = "32768"


def _run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*DS4AGENT, *args], capture_output=True, text=True, **kw)


def test_flash_file_passes_strict_validation_and_plans_its_memory(flash_file):
    r = _run(["info", str(flash_file), "--ctx", CTX], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "DeepSeek V4 Flash (strict metadata check passed)" in r.stdout
    assert "43 layers, width 4096, vocab 129280" in r.stdout
    assert "IQ2_XXS" in r.stdout and "Q2_K" in r.stdout and "Q8_0" in r.stdout
    peak = re.search(r"expected peak at --ctx 32768: ([\d.]+) GiB", r.stdout)
    assert peak and 10 < float(peak.group(1)) < 20, r.stdout


def _patched_copy(src: Path, dst: Path, edit) -> Path:
    """A sparse copy of the header and directory (tensor data left as a hole), edited."""
    from ds4agent.engine.gguf import GGUFFile

    with GGUFFile.open(src) as gf:
        head = bytes(gf._buf[: gf.data_offset])
        size = gf.file_size
        infos = dict(gf.tensors)
    head = edit(bytearray(head), infos)
    with open(dst, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return dst


def _type_field(head: bytearray, name: str) -> int:
    """Byte offset of a tensor's u32 GGML type in the directory."""
    key = len(name).to_bytes(8, "little") + name.encode()
    at = head.index(key) + len(key)
    n_dims = int.from_bytes(head[at:at + 4], "little")
    return at + 4 + 8 * n_dims


def test_bad_flash_files_are_refused_in_one_line_naming_the_tensor(flash_file, tmp_path):
    def wrong_type(head, infos):
        at = _type_field(head, "blk.40.attn_q_b.weight")
        head[at:at + 4] = (2).to_bytes(4, "little")  # Q4_0 (smaller: still inside the file) for Q8_0
        return bytes(head)

    def missing(head, infos):
        name = b"blk.42.ffn_down_shexp.weight"
        return bytes(head).replace(name, b"blk.42.ffn_down_shexq.weight")

    cases = {
        "wrong type": (_patched_copy(flash_file, tmp_path / "t.gguf", wrong_type),
                       "tensor 'blk.40.attn_q_b.weight' has type Q4_0, expected F32 or F16 or Q8_0"),
        "missing": (_patched_copy(flash_file, tmp_path / "m.gguf", missing),
                    "tensor 'blk.42.ffn_down_shexp.weight' is missing"),
    }
    # The whole header and directory, the data cut 4 KiB short: the last tensor runs past the end.
    truncated = _patched_copy(flash_file, tmp_path / "cut.gguf", lambda head, infos: bytes(head))
    with open(truncated, "r+b") as fh:
        fh.truncate(flash_file.stat().st_size - 4096)
    cases["truncated"] = (truncated, "extends past the end of the file (truncated?)")
    for label, (path, message) in cases.items():
        t = time.monotonic()
        r = _run(["dump-logits", "--model", str(path), "--tokens", "1,2", "--ctx", CTX,
                  "--out", str(tmp_path / "o.npy")], timeout=120)
        assert r.returncode == 1, (label, r.stderr)
        assert message in r.stderr, (label, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, label
        assert time.monotonic() - t < 60, label  # refused before any weight is read
    assert not (tmp_path / "o.npy").exists()


_SCRIPT = r"""
import json, resource, sys
import numpy as np
from ds4agent.engine.session import Engine
path, out = sys.argv[1], sys.argv[2]
engine = Engine.load(path, ctx=32768)
tokens = [100, 2000, 30000]
whole = engine.new_session().forward_all(tokens)
engine.chunk = 1
one_by_one = engine.new_session().forward_all(tokens)
np.save(out + ".whole.npy", whole)
np.save(out + ".single.npy", one_by_one)
json.dump({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, open(out + ".json", "w"))
"""


def test_full_shape_logits_are_finite_chunk_invariant_and_within_the_memory_budget(flash_file, tmp_path):
    from ds4agent.engine.config import flash_config
    from ds4agent.engine.gguf import GGUFFile
    from ds4agent.engine.info import memory_plan

    out = str(tmp_path / "l")
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(flash_file), out], capture_output=True, text=True,
                       timeout=1500)
    assert r.returncode == 0, r.stderr
    whole, single = np.load(out + ".whole.npy"), np.load(out + ".single.npy")
    assert whole.shape == (3, 129280)
    assert np.isfinite(whole).all()
    assert (whole.std(axis=1) > 0.1).all()  # not constant: activations survive 43 layers
    assert np.array_equal(whole, single)  # chunk-invariant bit for bit
    peak = json.load(open(out + ".json"))["maxrss"]
    with GGUFFile.open(flash_file) as gf:
        non_expert = sum(ti.nbytes for ti in gf.tensors.values() if "_exps." not in ti.name)
        plan = memory_plan(gf.tensors.values(), flash_config(), 32768)
    # Issue 13's budget, with every routed-expert byte of the file counted as touched (an upper
    # bound of what 3 tokens page in) and the state of 3 tokens (< 20 MiB) rounded up.
    budget = 1.3 * non_expert + plan.experts + (20 << 20) + 2 * GiB
    assert peak <= budget, f"peak {peak / GiB:.2f} GiB > budget {budget / GiB:.2f} GiB"


class Lines:
    """A child process's stdout, read line by line on a thread (so waits can time out)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.q.put(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            for line in self.seen:
                m = rx.search(line)
                if m:
                    self.seen.remove(line)
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r}; got:\n{''.join(self.seen)}")
            try:
                self.seen.append(self.q.get(timeout=left))
            except queue.Empty:
                continue

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()


def _agent_args(flash_file: Path, kv: Path, trace: Path, *extra: str) -> list[str]:
    return ["--model", str(flash_file), "--ctx", CTX, "--kv-dir", str(kv), "--nothink", "--tokens", "1",
            "--seed", "3", "--trace", str(trace), *extra]


def test_agent_headless_at_full_shape(flash_file, tmp_path):
    work, kv = tmp_path / "work", tmp_path / "kv"
    work.mkdir()
    args = _agent_args(flash_file, kv, tmp_path / "trace.txt", "-p", "hi", "--permission", "auto")
    n_sys = seed_sysprompt_cache(args, work, kv)
    r = subprocess.run([*DS4AGENT, *args], capture_output=True, text=True, cwd=work, env=flash_env(tmp_path),
                       timeout=900)
    trace = (tmp_path / "trace.txt").read_text()
    assert f"system prefix {n_sys} tokens" in trace and "sysprompt cache hit" in trace, trace
    assert "Traceback" not in r.stderr
    assert "token cap" in r.stderr  # one token allowed: the verdict says the answer was cut
    prefills = [int(n) for n in re.findall(r"prefill (\d+) tokens", trace)]
    assert prefills and max(prefills) < 20  # only the user turn was computed, never the prefix


def test_agent_plain_save_load_and_crash_resume_at_full_shape(flash_file, tmp_path):
    work, kv = tmp_path / "work", tmp_path / "kv"
    work.mkdir()
    trace = tmp_path / "trace.txt"
    args = _agent_args(flash_file, kv, trace, "--plain")
    seed_sysprompt_cache(args, work, kv)
    env = flash_env(tmp_path)
    proc = subprocess.Popen([*DS4AGENT, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=work, env=env)
    out = Lines(proc)
    try:
        out.send("hi")
        out.wait_for(r"token limit|token cap|generation stopped", timeout=900)
        out.send("/save")
        sid = out.wait_for(r"saved session ([0-9a-f]{8})", timeout=300).group(1)
        verify = _run(["kv", "verify", "--kv-dir", str(kv)], timeout=300)
        assert verify.returncode == 0 and sid in verify.stdout, verify.stdout + verify.stderr
        out.send("/new")
        out.wait_for(r"new session|started a new", timeout=300)
        mark = len(trace.read_text())
        out.send(f"/load {sid}")
        out.wait_for(rf"switched to session {sid}", timeout=300)
        assert "prefill" not in trace.read_text()[mark:]  # /load restored the state: nothing computed
        out.send("and now?")
        out.wait_for(r"token limit|token cap|generation stopped", timeout=900)
        assert max(int(n) for n in re.findall(r"prefill (\d+) tokens", trace.read_text()[mark:])) < 20
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash after the second turn: the journal must keep it
        proc.wait(timeout=60)
    resumed = subprocess.run([*DS4AGENT, *args], input="y\n/quit\nn\n", capture_output=True, text=True,
                             cwd=work, env=env, timeout=900)
    assert "Traceback" not in resumed.stdout + resumed.stderr
    m = re.search(r"resumed the unsaved session \((\d+) tokens, (\d+) prefilled\)", resumed.stdout)
    assert m, resumed.stdout + resumed.stderr
    assert "and now?" in resumed.stdout  # the replayed turns include the one before the crash


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_tui_shows_load_progress_at_full_shape(flash_file, tmp_path):
    from tests.ui.test_tmux import Tmux, _status_line

    work, kv = tmp_path / "work", tmp_path / "kv"
    work.mkdir()
    args = _agent_args(flash_file, kv, tmp_path / "trace.txt")
    seed_sysprompt_cache(args, work, kv)
    tmux = Tmux(flash_env(tmp_path))
    cmd = " ".join([f"cd {work} &&", *DS4AGENT, *args, "; echo EXITED-$?; sleep 30"])
    try:
        tmux.run("-f", "/dev/null", "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", cmd)
        tmux.run("resize-window", "-t", "app", "-x", "120", "-y", "30")
        seen = tmux.wait_for(lambda s: re.search(r"loading model… ?\d+%", s) is not None, "load progress",
                             timeout=300)
        assert "%" in _status_line(seen)
        tmux.wait_for(lambda s: _status_line(s).startswith("idle"), "model loaded and idle", timeout=600)
        tmux.type("/quit")
        tmux.key("Enter")
        tmux.wait_for(lambda s: "EXITED-0" in s, "exit status 0", timeout=120)
    finally:
        tmux.kill()
