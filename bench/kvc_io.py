"""Benchmark: KVC session save/load vs plain buffered file I/O of the same number of bytes.

Saves and loads a full DeepSeek V4 Flash-shape state of 10,000 tokens (payload 161,630,668 bytes,
154.1 MiB, random arrays) through the session store, and in the same run writes/reads the same
number of bytes with plain buffered Python file I/O. Both writers fsync before close (the store
must, kvc-format.md §6.1), so the ratio measures the store's own overhead: header/validation,
per-array streaming, rename + directory fsync. Reads hit the page cache in both cases.

Each side runs `--repeat` times interleaved; the best time of each counts. Prints throughputs and
the ratios (store / plain, higher is better) and exits 1 when save or load is below 0.8x.

    .venv/bin/python bench/kvc_io.py [--tokens 10000] [--repeat 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ds4agent.sessions.payload import FLASH_SHAPE, blank_state, payload_size
from ds4agent.sessions.store import SessionStore

TARGET = 0.8
CTX = 100_000


def random_flash_state(n_tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    state = blank_state(FLASH_SHAPE, n_tokens, CTX)
    state.tokens[:] = rng.integers(0, FLASH_SHAPE.vocab, n_tokens, dtype=np.uint32)
    state.logits[:] = rng.standard_normal(FLASH_SHAPE.vocab, dtype=np.float32)
    for lp in state.layers:
        for name in ("raw", "comp", "index_comp"):
            arr = getattr(lp, name)
            if arr is not None:
                arr[:] = rng.standard_normal(arr.shape, dtype=np.float32)
    return state


def plain_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def plain_read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    args = ap.parse_args(argv)

    state = random_flash_state(args.tokens)
    text = b"<bench session text>" * 50
    payload = payload_size(FLASH_SHAPE, args.tokens, CTX)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = SessionStore(Path(tmp) / "kv")
        plain_path = Path(tmp) / "plain.bin"
        saved = store.save_session(text, state, shape=FLASH_SHAPE, quant_bits=2, now=1_760_000_000)
        nbytes = saved.path.stat().st_size
        blob = os.urandom(1024) * (nbytes // 1024) + os.urandom(nbytes % 1024)

        best = {"save": 1e9, "load": 1e9, "pwrite": 1e9, "pread": 1e9}
        for _ in range(args.repeat):
            t, _ = timed(lambda: store.save_session(text, state, shape=FLASH_SHAPE, quant_bits=2,
                                                    title=saved.title, created_at=saved.created_at))
            best["save"] = min(best["save"], t)
            t, _ = timed(lambda: plain_write(plain_path, blob))
            best["pwrite"] = min(best["pwrite"], t)
            t, loaded = timed(lambda: store.load_session(saved.id, shape=FLASH_SHAPE, ctx=CTX, model_id=0,
                                                         quant_bits=2))
            best["load"] = min(best["load"], t)
            assert len(loaded.payload.tokens) == args.tokens
            del loaded
            t, data = timed(lambda: plain_read(plain_path))
            best["pread"] = min(best["pread"], t)
            assert len(data) == nbytes
            del data

    mib = nbytes / 2**20
    save_ratio = best["pwrite"] / best["save"]
    load_ratio = best["pread"] / best["load"]
    print(f"KVC I/O benchmark: Flash shape, {args.tokens} tokens, payload {payload:,} bytes, "
          f"file {nbytes:,} bytes ({mib:.1f} MiB), best of {args.repeat}")
    print(f"  save (store, fsync+rename): {mib / best['save']:8.1f} MiB/s   "
          f"plain buffered write+fsync: {mib / best['pwrite']:8.1f} MiB/s   ratio {save_ratio:.2f}x")
    print(f"  load (store, validated):    {mib / best['load']:8.1f} MiB/s   "
          f"plain buffered read:        {mib / best['pread']:8.1f} MiB/s   ratio {load_ratio:.2f}x")
    ok = save_ratio >= TARGET and load_ratio >= TARGET
    print(f"  target >= {TARGET}x for both: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
