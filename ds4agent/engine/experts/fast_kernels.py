"""numba kernels of the fast CPU set's routed-expert products (experts/cpu.py: `fast_products`).

Imported on first use only. One row at a time, straight from its GGUF blocks, in f32 with the
sums reassociated (fastmath): a block's weights are never written out as floats (the exact
kernels, cpu_kernels.py, decode 16 rows into a buffer first so that 16 in-order sums run as SIMD
lanes). Here each group of 8 IQ2_XXS weights is one 8-byte signed-grid lookup multiplied into 8
partial sums, and a K-quant sub-block's scale and minimum are applied once to Σ q·x and Σ x:

    Q2_K / Q4_K:  Σ_l (d·sc·q_l - dmin·mn)·x_l = d·sc·Σ q_l·x_l - dmin·mn·Σ x_l

For a decoded token this reads each weight once with a few vector instructions per 8 weights.
The result of a row depends on the row and its input alone; not bit-equal to the reference
(docs/numerics-fast-cpu.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ds4agent.engine.experts.cpu_kernels import scale_min_k4

_jit = njit(nogil=True, fastmath=True, cache=True)


@_jit
def _u32(row, at):  # pragma: no cover - compiled
    return (np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
            | (np.uint32(row[at + 2]) << np.uint32(16)) | (np.uint32(row[at + 3]) << np.uint32(24)))


@_jit
def _half(row, at, f16):  # pragma: no cover - compiled
    return f16[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@_jit
def iq2_xxs_rows(rows, x, out, f16, sgrid):  # pragma: no cover - compiled
    """66-byte blocks of 256: f16 d, then 8 groups of 32: four grid-row bytes (a), four 7-bit sign
    codes and a 4-bit scale ls (b); w = d·(0.5 + ls)/4 · signed grid (sgrid: int8 [256·128·8]).
    The 8 products of a grid row are one expression (scalars the compiler keeps in registers and
    vectorises; a small accumulator array here ran at half the speed)."""
    n, cols = x.shape
    for r in range(rows.shape[0]):
        row = rows[r]
        for m in range(n):
            xm = x[m]
            total = np.float32(0.0)
            for b in range(cols // 256):
                o = b * 66
                d = _half(row, o, f16)
                for g in range(8):
                    a = _u32(row, o + 2 + 8 * g)
                    bits = _u32(row, o + 6 + 8 * g)
                    db = d * (np.float32(0.5) + np.float32(bits >> np.uint32(28))) * np.float32(0.25)
                    s = np.float32(0.0)
                    for j in range(4):
                        at = np.int64((((a >> np.uint32(8 * j)) & np.uint32(255)) << np.uint32(7))
                                      | ((bits >> np.uint32(7 * j)) & np.uint32(127))) * 8
                        k = b * 256 + g * 32 + j * 8
                        s += (np.float32(sgrid[at]) * xm[k] + np.float32(sgrid[at + 1]) * xm[k + 1]
                              + np.float32(sgrid[at + 2]) * xm[k + 2] + np.float32(sgrid[at + 3]) * xm[k + 3]
                              + np.float32(sgrid[at + 4]) * xm[k + 4] + np.float32(sgrid[at + 5]) * xm[k + 5]
                              + np.float32(sgrid[at + 6]) * xm[k + 6] + np.float32(sgrid[at + 7]) * xm[k + 7])
                    total += db * s
            out[m, r] = total


@_jit
def q2_k_rows(rows, x, out, f16):  # pragma: no cover - compiled
    """84-byte blocks: scales[16] (low nibble scale, high nibble min of each 16), qs[64] (byte l of
    half h holds weights h·128 + s·32 + l at shift 2s), f16 d, f16 dmin."""
    n, cols = x.shape
    for r in range(rows.shape[0]):
        row = rows[r]
        for m in range(n):
            acc = np.float32(0.0)
            for b in range(cols // 256):
                o = b * 84
                d = _half(row, o + 80, f16)
                dmin = _half(row, o + 82, f16)
                for h in range(2):
                    for s in range(4):
                        for second in range(2):
                            sc = np.int64(row[o + h * 8 + s * 2 + second])
                            at = o + 16 + h * 32 + second * 16
                            k = b * 256 + h * 128 + s * 32 + second * 16
                            t = np.float32(0.0)
                            xs = np.float32(0.0)
                            for li in range(16):
                                t += np.float32((row[at + li] >> (2 * s)) & 3) * x[m, k + li]
                                xs += x[m, k + li]
                            acc += d * np.float32(sc & 15) * t - dmin * np.float32(sc >> 4) * xs
            out[m, r] = acc


@_jit
def q4_k_rows(rows, x, out, f16):  # pragma: no cover - compiled
    """144-byte blocks: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins (ggml's
    get_scale_min_k4), qs[128]: 32-byte chunk c holds sub-block 2c in its low nibbles, 2c+1 in its
    high ones."""
    n, cols = x.shape
    for r in range(rows.shape[0]):
        row = rows[r]
        for m in range(n):
            acc = np.float32(0.0)
            for b in range(cols // 256):
                o = b * 144
                d = _half(row, o, f16)
                dmin = _half(row, o + 2, f16)
                for sub in range(8):
                    sc, mn = scale_min_k4(row, o, sub)
                    at = o + 16 + (sub // 2) * 32
                    shift = 4 * (sub % 2)
                    k = b * 256 + sub * 32
                    t = np.float32(0.0)
                    xs = np.float32(0.0)
                    for li in range(32):
                        t += np.float32((row[at + li] >> shift) & 15) * x[m, k + li]
                        xs += x[m, k + li]
                    acc += d * np.float32(sc) * t - dmin * np.float32(mn) * xs
            out[m, r] = acc
