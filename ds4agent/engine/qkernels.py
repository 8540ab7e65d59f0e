"""numba kernels of the fast CPU kernel set (qmatrix.py has the public objects and the contract).

Imported on first use only (numba and its cached machine code take a moment to load). Every
kernel is compiled `nogil` and works on a range of output rows [r0, r1) for every token of the
call, so qmatrix.py splits a product into row ranges over worker threads; a row's result never
depends on the range it falls in (it is computed by the same code, in the same order).

Activations (`quantize_q8_0`, `quantize_q8_k`) are rounded as ds4's CPU path rounds them:
  Q8_0 (blocks of 32):  d = amax/127, q = rint(x/d) (half to even), clamped to [-128, 127]
  Q8_K (blocks of 256): m = the element of largest |x| (its sign kept, the first on a tie),
                        iscale = -127/m, q = rint(iscale*x) clamped, d = 1/iscale,
                        bsums[j] = sum of q over elements 16j..16j+15.
Products (per output (token t, row r); integer sums are exact, so their order is free; the
float steps below are in this order, from +0, one rounding each, no fused multiply-add):
  Q8_0    acc += (wd_b * xd_b) * float(sum_i wq_i * xq_i)                   per block b of 32
  Q2_K    acc += (xd*d) * float(isum) - (xd*dmin) * float(summs)            per block of 256
          isum = sum_j sc_j * dot16_j, summs = sum_j m_j * bsums_j (16 sub-blocks)
  Q4_K    as Q2_K with 8 sub-blocks of 32: summs = sum_j m_j * (bsums_2j + bsums_2j+1)
  IQ2_XXS acc += (d*xd) * float(sum_g (2 s_g + 1) * dot32_g); result = 0.125 * acc
  F16/F32 16 lane sums: lane l adds w_c*x_c for c = l, l+16, ... in order (an f16 weight
          widened exactly); then lanes summed pairwise (l with l+8, then +4, +2, +1).
These are ds4's CPU formulas (its portable C path) for the quantised types.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ds4agent.engine import qsimd

_jit = njit(nogil=True, cache=True)


# ---- activations ------------------------------------------------------------------------------


@_jit
def quantize_q8_0(x, xq, xd, xs):
    """x [n, cols] f32 (cols % 32 == 0) -> xq [n, cols] int8, xd [n, cols // 32] f32,
    xs [n, cols // 32] int32 (each block's code sum)."""
    n, cols = x.shape
    for t in range(n):
        for b in range(cols // 32):
            o = b * 32
            amax = np.float32(0.0)
            for i in range(32):
                a = abs(x[t, o + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            xd[t, b] = d
            for i in range(32):
                v = np.rint(x[t, o + i] * inv)
                v = min(max(v, np.float32(-128.0)), np.float32(127.0))
                xq[t, o + i] = np.int8(v)
            s = 0
            for i in range(32):
                s += np.int32(xq[t, o + i])
            xs[t, b] = s


@_jit
def quantize_q8_k(x, xq, xd, bsums, x16):
    """x [n, cols] f32 (cols % 256 == 0) -> xq [n, cols] int8, xd [n, cols // 256] f32,
    bsums [n, cols // 16] int32, x16 [n, cols] int16 (xq widened, for the 16-bit products)."""
    n, cols = x.shape
    for t in range(n):
        for b in range(cols // 256):
            o = b * 256
            amax = np.float32(0.0)
            m = np.float32(0.0)
            for i in range(256):
                a = abs(x[t, o + i])
                if a > amax:
                    amax = a
                    m = x[t, o + i]
            if amax == 0:
                xd[t, b] = 0.0
                for i in range(256):
                    xq[t, o + i] = 0
                for j in range(16):
                    bsums[t, b * 16 + j] = 0
                continue
            iscale = np.float32(-127.0) / m
            for i in range(256):
                v = np.rint(iscale * x[t, o + i])
                v = min(max(v, np.float32(-128.0)), np.float32(127.0))
                xq[t, o + i] = np.int8(v)
            for j in range(16):
                s = 0
                for i in range(16):
                    s += np.int32(xq[t, o + 16 * j + i])
                bsums[t, b * 16 + j] = s
            xd[t, b] = np.float32(1.0) / iscale
        qsimd.widen_s8(xq, t * cols, x16, t * cols, cols)


# ---- products ---------------------------------------------------------------------------------
# Each kernel walks its rows one at a time: the row's blocks are decoded once (into `buf`, in
# L1) and then multiplied with the activations of tokens t0..t1, so a batch reads each weight
# once. Offsets passed to the qsimd intrinsics are flat element offsets into C-contiguous arrays.

Q8_0, Q2_K, Q4_K, IQ2_XXS = 8, 10, 12, 16  # GGML type ids (quant.py)
# Up to this many tokens on a row range, an IQ2_XXS row is multiplied straight from its blocks
# (qsimd.iq2_xxs_dot); more, and decoding each block once to 16-bit weights pays.
IQ2_FUSED_TOKENS = 1


@_jit
def _q8_0_rows(wi, wd, xq, xd, xs, out, r0, r1, t0, t1):
    # wi [groups, nb * 512] uint8: 16 rows interleaved (qsimd's Q8_0 layout, codes + 128),
    # wd [groups, nb * 16] f32; xs: the activation blocks' code sums (sum (q + 128) * x - 128 *
    # sum x = sum q * x). Tokens four at a time (the weights read once per four), then one by one.
    rows = out.shape[1]
    cols = xq.shape[1]
    nb = cols // 32
    res = np.empty(64, np.float32)
    for g in range(r0 // 16, (r1 + 15) // 16):
        lo, hi = max(r0, 16 * g), min(r1, 16 * g + 16, rows)
        t = t0
        while t < t1:
            count = 4 if t + 4 <= t1 else 1
            if count == 4:
                qsimd.q8_0_group4(wi, g * nb * 512, wd, g * nb * 16, xq, t * cols, xd, xs, t * nb, nb, cols, res)
            else:
                qsimd.q8_0_group1(wi, g * nb * 512, wd, g * nb * 16, xq, t * cols, xd, xs, t * nb, nb, cols, res)
            for j in range(count):
                for r in range(lo, hi):
                    out[t + j, r] = res[16 * j + r - 16 * g]
            t += count


@_jit
def _half(row, at, f16):
    return f16[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@_jit
def _q2_k_rows(raw, x16, xd, bsums, out, r0, r1, t0, t1, f16):
    # raw [rows, nb * 84] uint8 (Q2_K blocks), x16: the Q8_K codes widened to int16
    cols = x16.shape[1]
    nb = cols // 256
    buf = np.empty(cols, np.int16)
    for r in range(r0, r1):
        row = raw[r]
        rb = r * raw.shape[1]
        for b in range(nb):
            qsimd.q2_k_unpack(row, 84 * b, buf, 256 * b)
        for t in range(t0, t1):
            acc = np.float32(0.0)
            for b in range(nb):
                isum = qsimd.dot_i16_256(buf, 256 * b, x16, t * cols + 256 * b)
                summs = qsimd.dot_hi_nibble16(raw, rb + 84 * b, bsums, (t * nb + b) * 16)
                dall = xd[t, b] * _half(row, 84 * b + 80, f16)
                dmin = xd[t, b] * _half(row, 84 * b + 82, f16)
                acc += dall * np.float32(isum) - dmin * np.float32(summs)
            out[t, r] = acc


@_jit
def _q4_k_rows(raw, x16, xd, bsums, out, r0, r1, t0, t1, f16):
    # raw [rows, nb * 144] uint8 (Q4_K blocks)
    cols = x16.shape[1]
    nb = cols // 256
    buf = np.empty(cols, np.int16)
    mn = np.empty(nb * 8, np.int32)
    for r in range(r0, r1):
        row = raw[r]
        for b in range(nb):
            qsimd.q4_k_unpack(row, 144 * b, buf, 256 * b, mn, 8 * b)
        for t in range(t0, t1):
            acc = np.float32(0.0)
            for b in range(nb):
                isum = qsimd.dot_i16_256(buf, 256 * b, x16, t * cols + 256 * b)
                summs = 0
                for j in range(8):
                    summs += mn[8 * b + j] * (bsums[t, 16 * b + 2 * j] + bsums[t, 16 * b + 2 * j + 1])
                dall = xd[t, b] * _half(row, 144 * b, f16)
                dmin = xd[t, b] * _half(row, 144 * b + 2, f16)
                acc += dall * np.float32(isum) - dmin * np.float32(summs)
            out[t, r] = acc


@_jit
def _iq2_xxs_rows(raw, xq, x16, xd, out, r0, r1, t0, t1, f16, grid):
    # raw [rows, nb * 66] uint8 (IQ2_XXS blocks), grid: qsimd.iq2_xxs_unpack's table
    cols = x16.shape[1]
    nb = cols // 256
    if t1 - t0 <= IQ2_FUSED_TOKENS:  # few tokens: no decoded copy (the same integers)
        for r in range(r0, r1):
            row = raw[r]
            for t in range(t0, t1):
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = qsimd.iq2_xxs_dot(row, 66 * b, grid, xq, t * cols + 256 * b)
                    acc += (_half(row, 66 * b, f16) * xd[t, b]) * np.float32(bsum)
                out[t, r] = np.float32(0.125) * acc
        return
    buf = np.empty(cols, np.int16)
    for r in range(r0, r1):
        row = raw[r]
        for b in range(nb):
            qsimd.iq2_xxs_unpack(row, 66 * b, grid, buf, 256 * b)
        for t in range(t0, t1):
            acc = np.float32(0.0)
            for b in range(nb):
                bsum = qsimd.dot_i16_256(buf, 256 * b, x16, t * cols + 256 * b)
                acc += (_half(row, 66 * b, f16) * xd[t, b]) * np.float32(bsum)
            out[t, r] = np.float32(0.125) * acc


@_jit
def matrix_rows(kind, w, aux, xq, x16, xd, xs, out, r0, r1, t0, t1, f16, grid):
    """out[t, r] for rows r0..r1 and tokens t0..t1 of a quantised matrix of GGML type `kind`.

    w uint8: Q8_0 codes + 128 in qsimd's interleaved layout [row groups of 16, ...] (then aux =
    the f32 block scales [groups, nb * 16]; row ranges must start at a multiple of 16), or the
    raw blocks [rows, ...] of the other types (aux unused). Activations (quantize_q8_0 /
    quantize_q8_k's): xq int8, x16 int16 (Q8_K only), xd f32 scales, xs int32 sums (Q8_0: per
    block of 32; Q8_K: bsums per 16). f16: the f16 -> f32 table; grid: the IQ2_XXS grid.
    """
    if kind == Q8_0:
        _q8_0_rows(w, aux, xq, xd, xs, out, r0, r1, t0, t1)
    elif kind == Q2_K:
        _q2_k_rows(w, x16, xd, xs, out, r0, r1, t0, t1, f16)
    elif kind == Q4_K:
        _q4_k_rows(w, x16, xd, xs, out, r0, r1, t0, t1, f16)
    else:
        _iq2_xxs_rows(w, xq, x16, xd, out, r0, r1, t0, t1, f16, grid)


@_jit
def expert_rows(kind, w, aux, used, starts, xq, x16, xd, xs, out, r0, r1, f16, grid):
    """matrix_rows over routed experts: w / aux [n_experts, rows, ...]; expert used[i] takes
    the activation rows starts[i]..starts[i+1] (the call's (token, slot) pairs grouped by expert)."""
    for i in range(used.shape[0]):
        e = used[i]
        matrix_rows(kind, w[e], aux[e], xq, x16, xd, xs, out, r0, r1, starts[i], starts[i + 1], f16, grid)


@_jit
def dense_rows(w, x, out, r0, r1):
    """w [rows, cols] f32, or f16 as uint16 bits -> out[:, r0:r1] (qsimd.dot_f32_lanes's order)."""
    n, cols = x.shape
    for r in range(r0, r1):
        for t in range(n):
            out[t, r] = qsimd.dot_f32_lanes(w, r * cols, x, t * cols, cols)
