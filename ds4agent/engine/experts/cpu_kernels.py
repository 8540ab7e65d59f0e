"""numba kernels of the CPU routed-expert product (experts/cpu.py has the contract and the why).

Imported on first use only (importing numba and loading its cached machine code takes a moment).
`expert_rows(rows, x, out, kind, f16, grid)`: out[m, r] = the in-order float32 dot product of row r
of `rows` (raw GGUF blocks of GGML type `kind`: 0 IQ2_XXS, 1 Q2_K, 2 Q4_K, 3 Q8_0), dequantised
exactly, with x[m].

Layout: LANES rows at a time are decoded, one column of 256 weights (one K-quant block, or 8 Q8_0
blocks) at a time, into w[256, LANES] (16 KiB, in L1; the K-quants through a small table of
each sub-block's possible weights, computed as gguf computes them); then for k = 0..255 every lane adds
w[k, lane] * x[k] to its own sum: LANES independent in-order sums that the compiler runs as SIMD
lanes. Compiled without fast-math: no reassociation, no FMA contraction (exactness).
"""

from __future__ import annotations

import numpy as np
from numba import njit

LANES = 16
_jit = njit(nogil=True)  # no fast-math; on-disk caching is switched on at the end of the module


@_jit
def _u32(row, at):
    return (np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
            | (np.uint32(row[at + 2]) << np.uint32(16)) | (np.uint32(row[at + 3]) << np.uint32(24)))


@_jit
def _half(row, at, f16):
    return f16[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@_jit
def _iq2_xxs(row, o, lane, w, f16, grid):
    # 66 bytes: f16 d, then 8 groups of 32 weights: a (four grid-row bytes), b (four 7-bit sign
    # codes at bits 0, 7, 14, 21 and a 4-bit scale at 28..31); w = d*(0.5 + scale)/4 * signed grid
    d = _half(row, o, f16)
    for g in range(8):
        a = _u32(row, o + 2 + 8 * g)
        b = _u32(row, o + 6 + 8 * g)
        db = d * (np.float32(0.5) + np.float32(b >> np.uint32(28))) * np.float32(0.25)
        for j in range(4):
            at = np.int64((((a >> np.uint32(8 * j)) & np.uint32(255)) << np.uint32(7))
                          | ((b >> np.uint32(7 * j)) & np.uint32(127))) * 8
            for p in range(8):
                w[g * 32 + j * 8 + p, lane] = db * grid[at + p]


@_jit
def _q2_k(row, o, lane, w, f16, values):
    # 84 bytes: scales[16] (low nibble scale, high nibble min of each 16 weights), qs[64], f16 d,
    # f16 dmin; byte l of half h holds weights h*128 + s*32 + l at shift 2s (l < 32).
    # values[j, q] = d*scale_j*q - dmin*min_j: a sub-block's 4 weights, each computed (and rounded)
    # exactly as gguf computes it; every weight is then one lookup.
    d = _half(row, o + 80, f16)
    dmin = _half(row, o + 82, f16)
    for j in range(16):
        sc = np.int64(row[o + j])
        dl = d * np.float32(sc & 15)
        ml = dmin * np.float32(sc >> 4)
        for q in range(4):
            values[j, q] = dl * np.float32(q) - ml
    for h in range(2):
        for s in range(4):
            for second in range(2):
                sub = h * 8 + s * 2 + second
                base = h * 128 + s * 32 + second * 16
                at = o + 16 + h * 32 + second * 16
                for l in range(16):
                    w[base + l, lane] = values[sub, (np.int64(row[at + l]) >> (2 * s)) & 3]


@_jit
def scale_min_k4(row, o, sub):
    """(scale, min) of sub-block `sub` of the Q4_K block at `o`: 6-bit values packed in 12 bytes
    (ggml's get_scale_min_k4 layout)."""
    if sub < 4:
        return np.int64(row[o + 4 + sub]) & 63, np.int64(row[o + 8 + sub]) & 63
    sc = (np.int64(row[o + 8 + sub]) & 15) | ((np.int64(row[o + sub]) >> 6) << 4)
    mn = (np.int64(row[o + 8 + sub]) >> 4) | ((np.int64(row[o + 4 + sub]) >> 6) << 4)
    return sc, mn


@_jit
def _q4_k(row, o, lane, w, f16, values):
    # 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4),
    # qs[128]: chunk c of 32 bytes holds sub-block 2c in its low nibbles, 2c+1 in its high ones.
    # values[sub, q] as in _q2_k (16 per sub-block of 32 weights).
    d = _half(row, o, f16)
    dmin = _half(row, o + 2, f16)
    for sub in range(8):
        sc, mn = scale_min_k4(row, o, sub)
        dl = d * np.float32(sc)
        ml = dmin * np.float32(mn)
        for q in range(16):
            values[sub, q] = dl * np.float32(q) - ml
    for sub in range(8):
        at = o + 16 + (sub // 2) * 32
        shift = 4 * (sub % 2)
        for l in range(32):
            w[sub * 32 + l, lane] = values[sub, (np.int64(row[at + l]) >> shift) & 15]


@_jit
def _q8_0(row, o, blocks, lane, w, f16):
    # 34-byte blocks: f16 d, int8 q[32]; w = d*q
    for blk in range(blocks):
        at = o + 34 * blk
        d = _half(row, at, f16)
        for l in range(32):
            q = np.int64(row[at + 2 + l])
            w[blk * 32 + l, lane] = d * np.float32(q - 256 if q >= 128 else q)


@_jit
def expert_rows(rows, x, out, kind, f16, grid):
    n_rows, d_in, n = rows.shape[0], x.shape[1], x.shape[0]
    w = np.zeros((256, LANES), np.float32)
    values = np.empty((16, 16), np.float32)  # a K-quant block's possible weights, by sub-block
    acc = np.empty((n, LANES), np.float32)
    for r0 in range(0, n_rows, LANES):
        used = min(LANES, n_rows - r0)
        acc[:] = 0.0  # +0, where the BLAS accumulator starts (it decides the sign of a zero sum)
        if used < LANES:
            w[:] = 0.0  # lanes without a row multiply zeros: no stale NaN, no denormal slowdown
        for k0 in range(0, d_in, 256):
            width = min(256, d_in - k0)
            if kind == 0:
                for lane in range(used):
                    _iq2_xxs(rows[r0 + lane], k0 // 256 * 66, lane, w, f16, grid)
            elif kind == 1:
                for lane in range(used):
                    _q2_k(rows[r0 + lane], k0 // 256 * 84, lane, w, f16, values)
            elif kind == 2:
                for lane in range(used):
                    _q4_k(rows[r0 + lane], k0 // 256 * 144, lane, w, f16, values)
            else:
                for lane in range(used):
                    _q8_0(rows[r0 + lane], k0 // 32 * 34, width // 32, lane, w, f16)
            for m in range(n):
                for k in range(width):
                    xv = x[m, k0 + k]
                    for lane in range(LANES):
                        acc[m, lane] += w[k, lane] * xv
        for m in range(n):
            for lane in range(used):
                out[m, r0 + lane] = acc[m, lane]


for _kernel in (_u32, _half, _iq2_xxs, _q2_k, scale_min_k4, _q4_k, _q8_0, expert_rows):
    # Keep the machine code on disk (beside this module, else in numba's user cache): later
    # processes load it in milliseconds instead of compiling for about a second. Where no such
    # place is writable numba refuses to cache, and each process compiles instead.
    try:
        _kernel.enable_caching()
    except RuntimeError:
        pass
