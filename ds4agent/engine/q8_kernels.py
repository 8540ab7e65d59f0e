"""The fast CPU kernel set's compiled products of Q8_0 matrices (numba; see q8_product.py).

Every Q8_0 matrix is held as MLX affine 8-bit (quant.q8_0_to_affine): codes u = q + 128 as
uint8 [R, C] and one f32 scale d per 32 (bias = -128·d), so w = d·(u - 128). The kernels read
those arrays in place (zero-copy numpy views): the fast set adds no resident memory.

Two kernels, chosen by how many input rows a call has:

* `q8_gemv` (1 or 2 rows: decode): the input row is rounded per block of 32 to 8 bits
  (xd = max|x|/127, xq = round(x/xd), as ds4's CPU path and ggml's Q8_0 activations do) and each
  block's dot product is an integer sum, Σ u·xq - 128·Σ xq, scaled once by d·xd. Integer
  multiply-adds of bytes are what the CPU does fastest, and a decoded token reads every weight
  once: this is a memory-bound product, about 4x MLX's quantized_matmul on this machine.
* `q8_gemm` (3 or more rows: prefill): activations stay f32 and weights are widened on the fly;
  four weight rows meet each input column at once (the inner loop runs over the rows of the
  chunk, contiguous: it vectorises), so each weight is read once per chunk from memory and the
  chunk's inputs stay in cache. Compute-bound: about 30x MLX on a 64-token chunk here.

Both run on all cores (numba prange over output rows) and release the GIL. Compiled without
strict IEEE order (fastmath): sums are reassociated, so results are deterministic for a given
machine and thread count but are not the reference's in-order sums (the fast set's contract,
docs/numerics-fast-cpu.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_BLOCK = 32
_ROWS_PER_TILE = 4


@njit(cache=True, nogil=True, fastmath=True)
def quantize_rows(x, xq, xd, xsum):  # pragma: no cover - compiled
    """x f32 [N, C] -> xq int8 [N, C], xd f32 [N, C/32] (the scale of each block), xsum int32
    [N, C/32] (Σ xq of each block: it carries the -128 of the weight codes)."""
    n_rows, cols = x.shape
    for n in range(n_rows):
        for b in range(cols // _BLOCK):
            base = b * _BLOCK
            amax = np.float32(0.0)
            for i in range(_BLOCK):
                a = abs(x[n, base + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            total = 0
            for i in range(_BLOCK):
                q = np.int8(np.rint(x[n, base + i] * inv))
                xq[n, base + i] = q
                total += q
            xd[n, b] = d
            xsum[n, b] = total


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def q8_gemv(u, sc, xq, xd, xsum, out):  # pragma: no cover - compiled
    """out [N, R] = (d·(u - 128)) @ dequantised(xq) for N small (see module docstring)."""
    rows, cols = u.shape
    n_in = xq.shape[0]
    blocks = cols // _BLOCK
    for r in prange(rows):
        ur = u[r]
        for n in range(n_in):
            xr = xq[n]
            acc = np.float32(0.0)
            for b in range(blocks):
                base = b * _BLOCK
                # Every step truncated to int32: numba would widen an int32 sum to int64, and the
                # loop would then run 8 lanes wide instead of becoming int16 multiply-adds
                # (vpmaddwd / VNNI's vpdpwssd), about 2x faster.
                s = np.int32(0)
                for i in range(_BLOCK):
                    s = np.int32(s + np.int32(np.int16(ur[base + i]) * np.int16(xr[base + i])))
                acc += sc[r, b] * xd[n, b] * np.float32(s - 128 * xsum[n, b])
            out[n, r] = acc


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def q8_gemm(u, sc, xt, out):  # pragma: no cover - compiled
    """out [R, N] = (d·(u - 128)) @ xt, xt f32 [C, N] (the chunk's inputs, transposed)."""
    rows, cols = u.shape
    n_in = xt.shape[1]
    blocks = cols // _BLOCK
    tiles = (rows + _ROWS_PER_TILE - 1) // _ROWS_PER_TILE
    for t in prange(tiles):
        r0 = t * _ROWS_PER_TILE
        acc = np.zeros((_ROWS_PER_TILE, n_in), np.float32)
        part = np.zeros((_ROWS_PER_TILE, n_in), np.float32)
        if r0 + _ROWS_PER_TILE <= rows:
            for b in range(blocks):
                part[:, :] = 0.0
                for i in range(_BLOCK):
                    k = b * _BLOCK + i
                    w0 = np.float32(np.int32(u[r0, k]) - 128)
                    w1 = np.float32(np.int32(u[r0 + 1, k]) - 128)
                    w2 = np.float32(np.int32(u[r0 + 2, k]) - 128)
                    w3 = np.float32(np.int32(u[r0 + 3, k]) - 128)
                    for n in range(n_in):
                        xv = xt[k, n]
                        part[0, n] += w0 * xv
                        part[1, n] += w1 * xv
                        part[2, n] += w2 * xv
                        part[3, n] += w3 * xv
                for j in range(_ROWS_PER_TILE):
                    s = sc[r0 + j, b]
                    for n in range(n_in):
                        acc[j, n] += s * part[j, n]
            for j in range(_ROWS_PER_TILE):
                for n in range(n_in):
                    out[r0 + j, n] = acc[j, n]
        else:  # the last rows, fewer than a tile
            for r in range(r0, rows):
                for n in range(n_in):
                    total = np.float32(0.0)
                    for b in range(blocks):
                        s = np.float32(0.0)
                        for i in range(_BLOCK):
                            k = b * _BLOCK + i
                            s += np.float32(np.int32(u[r, k]) - 128) * xt[k, n]
                        total += sc[r, b] * s
                    out[r, n] = total
