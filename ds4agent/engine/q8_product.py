"""The fast CPU kernel set's product with a Q8_0 matrix: `Q8Product(wq, scales)(x)`.

weights.Linear hands its quantised products here when the engine was loaded with the fast CPU
kernel set (device.kernel_set() == "cpu"). The matrix stays where it is (MLX affine 8-bit, the
exact image of the file's Q8_0 blocks); the kernels (q8_kernels.py) read it through numpy views,
so this costs no memory. A call evaluates its input (the kernels run on the host), which the CPU
device does anyway at the next host read: on a GPU this class is never used.

What it computes, and how close that is to the reference, is the fast set's contract
(docs/numerics-fast-cpu.md): 1-2 input rows (a decoded token, a one-token prefill) round the
input to 8 bits per 32 and sum integers; 3 or more rows (a prefill chunk) keep f32 inputs.
Either way the result for a row depends only on that row and on how many rows the call has
(1-2 or more), never on the chunk's other rows' values or on the thread count.
"""

from __future__ import annotations

import threading
from functools import cache
from types import ModuleType

import mlx.core as mx
import numpy as np

# Up to this many rows a call takes the 8-bit kernel (decode); beyond it, the f32 chunk kernel.
GEMV_MAX_ROWS = 2
# numba's default thread pool must not be entered by two threads at once (two sessions on two
# threads of one process): the parallel kernels take turns.
_POOL = threading.Lock()


@cache
def _kernels() -> ModuleType:
    """numba and the compiled kernels, loaded on the first product (or from numba's disk cache):
    a process on a GPU never pays for them."""
    from ds4agent.engine import q8_kernels

    return q8_kernels


class Q8Product:
    """y = W·x over the last axis of x, for W [R, C] given as MLX affine 8-bit, group 32, with
    bias = -128·scale (quant.q8_0_to_affine)."""

    __slots__ = ("_arrays", "codes", "scales", "rows", "cols")

    def __init__(self, wq: mx.array, scales: mx.array, cols: int):
        mx.eval(wq, scales)
        self._arrays = (wq, scales)  # the views below read their memory: kept alive with them
        self.rows, self.cols = int(wq.shape[0]), int(cols)
        self.codes = np.asarray(wq).view(np.uint8).reshape(self.rows, self.cols)
        self.scales = np.asarray(scales, dtype=np.float32).reshape(self.rows, self.cols // 32)

    def __call__(self, x: mx.array) -> mx.array:
        lead = tuple(int(s) for s in x.shape[:-1])
        xs = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1, self.cols))
        n = xs.shape[0]
        k = _kernels()
        if n <= GEMV_MAX_ROWS:
            xq = np.empty((n, self.cols), np.int8)
            xd = np.empty((n, self.cols // 32), np.float32)
            xsum = np.empty((n, self.cols // 32), np.int32)
            out = np.empty((n, self.rows), np.float32)
            k.quantize_rows(xs, xq, xd, xsum)
            with _POOL:
                k.q8_gemv(self.codes, self.scales, xq, xd, xsum, out)
        else:
            out_t = np.empty((self.rows, n), np.float32)
            with _POOL:
                k.q8_gemm(self.codes, self.scales, np.ascontiguousarray(xs.T), out_t)
            out = out_t.T
        return mx.array(out).reshape(*lead, self.rows)
