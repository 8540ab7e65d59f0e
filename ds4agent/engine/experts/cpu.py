"""Routed-expert products on the CPU, straight from GGUF blocks: `products(rows, qtype, d_in, xs)`.

One call multiplies R output rows of one expert (their raw blocks [R, row_bytes] uint8, e.g. a
slice of the memory-mapped tensor) by n input rows. It is the CPU half of `QuantExperts`
(experts/portable.py), which splits a decode or prefill call into row ranges over the worker
threads of `workers(n)`.

Why compiled kernels (numba). Each weight is used once per token, so the cost is decoding it and
one multiply-add; with MLX or numpy ops each of those steps is a separate pass over a float32
temporary, and on the Linux CPU build MLX's product is a reference BLAS that adds one product at
a time. Measured at Flash's real shape (bench/experts.py, 2 cores), no arrangement of those ops
read more than 0.38 GB/s of IQ2_XXS or 0.48 GB/s of Q2_K (decode at the Flash shape needs 0.5). A kernel decodes
a block of 16 rows into a small buffer that stays in L1 and multiplies it at once, and releases
the GIL, so the two worker threads run together.

Exactness contract (the same bits as `dense_experts` over the dequantised weights, so chunk
invariance holds, model.md §9):
  * dequantisation is bit-exact: the same float32 operations as `gguf.quants` / quant.py (every
    product there is exact; the K-quants round once, in their subtraction; see quant.py). The
    kernels are compiled without fast-math, so nothing is reordered or fused into an FMA;
  * each output is the in-order float32 dot product: from +0, acc = acc + round(w[k] * x[k]) for
    k = 0, 1, ..., one rounding per step. That is what the CPU BLAS under `dense_experts`
    computes (it accumulates one product at a time), and it depends on nothing but the row and
    the input: not on how many rows share the call, the row range, or the thread.
    tests/weights/test_cpu_experts.py and test_experts.py hold it to that sum and to the dense
    product bit for bit.
The 16 rows of a block are 16 independent sums (one per SIMD lane), never a split of one sum.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ds4agent.engine import quant


@lru_cache(maxsize=1)
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(f16 -> f32 for all 65,536 bit patterns, the signed IQ2_XXS codebook as float32
    [256 * 128 * 8]: entry (g*128 + c)*8 + p = position p of grid row g under sign code c)."""
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    table, _ = quant.iq2xxs_signed_codes()
    return f16, np.ascontiguousarray(table.astype(np.float32).reshape(-1))


_KIND = {quant.IQ2_XXS: 0, quant.Q2_K: 1, quant.Q4_K: 2, quant.Q8_0: 3}


def _kernel():
    """The compiled kernel (experts/cpu_kernels.py). numba is imported, and the kernel compiled or loaded
    from numba's on-disk cache, on first use only: a process on a GPU never pays for it (numba
    and its LLVM take about 120 MB once loaded). Concurrent first calls are safe: Python's import
    lock makes the second wait for the module, numba's compiler lock for the compilation."""
    from ds4agent.engine.experts import cpu_kernels

    return cpu_kernels.expert_rows


def products(rows: np.ndarray, qtype: int, d_in: int, xs: np.ndarray) -> np.ndarray:
    """rows [R, row_bytes] uint8: R rows of `d_in` weights as `qtype` blocks; xs [n, d_in] float32
    -> [n, R] float32, out[i, r] = the in-order dot product of dequantised row r with xs[i]."""
    if qtype not in quant.EXPERT_TYPES:
        raise quant.QuantError(f"no CPU expert product for {quant.type_name(qtype)}")
    block, size, name = quant.block_info(qtype)
    rb = quant.row_bytes(qtype, d_in)
    rows = np.asarray(rows)  # a memmap slice as a plain view (the kernels take ndarrays)
    if rows.ndim != 2 or rows.shape[1] != rb or rows.dtype != np.uint8:
        raise quant.QuantError(f"{name} rows of {d_in} weights must be uint8 [R, {rb}], got "
                               f"{list(rows.shape)} ({rows.dtype})")
    xs = np.ascontiguousarray(xs, dtype=np.float32)
    if xs.ndim != 2 or xs.shape[1] != d_in:
        raise quant.QuantError(f"expert inputs must be float32 [n, {d_in}], got {list(xs.shape)}")
    out = np.empty((xs.shape[0], rows.shape[0]), np.float32)
    f16, grid = _tables()
    _kernel()(rows, xs, out, _KIND[qtype], f16, grid)
    return out


class Workers:
    """Long-lived daemon threads for the CPU products: `run(fns)` calls fns[0] on the calling
    thread and fns[i] on worker thread i - 1, and returns their results in order (re-raising the
    first error, after every part has finished).

    Made once and never joined: a decode step makes several products per layer, and starting
    threads for each would cost about as much as a small call's work. The calling thread takes
    the first part itself: it would only wait otherwise, and a hand-off (a queue, a thread woken,
    the GIL passed) costs tens of microseconds, as much as a small product."""

    def __init__(self, n: int):
        self._inbox: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(max(0, n - 1))]
        for box in self._inbox:
            threading.Thread(target=self._serve, args=(box,), daemon=True, name="ds4-experts").start()

    @staticmethod
    def _serve(box: queue.SimpleQueue) -> None:
        while True:
            fn, done = box.get()
            try:
                done.put((True, fn()))
            except BaseException as err:  # handed to the caller, which re-raises it
                done.put((False, err))
            # An idle worker must not keep its last task (the experts, the call's inputs) alive.
            del fn, done

    def run(self, fns: Sequence[Callable[[], Any]]) -> list[Any]:
        if len(fns) > len(self._inbox) + 1:
            raise ValueError(f"{len(fns)} parts for a pool of {len(self._inbox) + 1} threads")
        done: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in fns[1:]]
        for box, fn, d in zip(self._inbox, fns[1:], done, strict=False):
            box.put((fn, d))
        first: tuple[bool, Any] = (True, None)
        if fns:
            try:
                first = (True, fns[0]())
            except BaseException as err:  # re-raised once the other parts are done
                first = (False, err)
        results = [first, *(d.get() for d in done)] if fns else []
        for ok, value in results:
            if not ok:
                raise value
        return [value for _, value in results]


_WORKERS: dict[int, Workers] = {}
_WORKERS_LOCK = threading.Lock()


def workers(n: int) -> Workers:
    """The process's pool for `n` parts: the calling thread and n - 1 worker threads (made on
    first use, then reused)."""
    with _WORKERS_LOCK:
        if n not in _WORKERS:
            _WORKERS[n] = Workers(n)
        return _WORKERS[n]
