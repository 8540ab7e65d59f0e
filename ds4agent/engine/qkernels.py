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
  F16/F32 16 lane sums: lane l adds w_c*x_c for c = l, l+16, ... in order; then lanes summed
          pairwise (l with l+8, then +4, +2, +1).
These are ds4's CPU formulas (its portable C path) for the quantised types.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_jit = njit(nogil=True, cache=True)


# ---- activations ------------------------------------------------------------------------------


@_jit
def quantize_q8_0(x, xq, xd):
    """x [n, cols] f32 (cols % 32 == 0) -> xq [n, cols] int8, xd [n, cols // 32] f32."""
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


@_jit
def quantize_q8_k(x, xq, xd, bsums):
    """x [n, cols] f32 (cols % 256 == 0) -> xq [n, cols] int8, xd [n, cols // 256] f32,
    bsums [n, cols // 16] int32."""
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


# ---- products ---------------------------------------------------------------------------------


@_jit
def q8_0_rows(wq, wd, xq, xd, out, r0, r1):
    """wq [rows, cols] int8, wd [rows, cols // 32] f32 (Q8_0 repacked) -> out[:, r0:r1]."""
    n = xq.shape[0]
    nb = wd.shape[1]
    for r in range(r0, r1):
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 32
                s = 0
                for i in range(32):
                    s += np.int32(wq[r, o + i]) * np.int32(xq[t, o + i])
                acc += (wd[r, b] * xd[t, b]) * np.float32(s)
            out[t, r] = acc


@_jit
def _u32(row, at):
    return (np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
            | (np.uint32(row[at + 2]) << np.uint32(16)) | (np.uint32(row[at + 3]) << np.uint32(24)))


@_jit
def _half(row, at, f16):
    return f16[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@_jit
def q2_k_rows(raw, xq, xd, bsums, out, r0, r1, f16):
    """raw [rows, nb * 84] uint8 (Q2_K blocks) -> out[:, r0:r1]."""
    n = xq.shape[0]
    nb = raw.shape[1] // 84
    for r in range(r0, r1):
        row = raw[r]
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 84
                x0 = b * 256
                summs = 0
                for j in range(16):
                    summs += np.int32(row[o + j] >> 4) * bsums[t, b * 16 + j]
                isum = 0
                for h in range(2):
                    for s in range(4):
                        for second in range(2):
                            sub = h * 8 + s * 2 + second
                            at = o + 16 + h * 32 + second * 16
                            xo = x0 + h * 128 + s * 32 + second * 16
                            d16 = 0
                            for i in range(16):
                                d16 += np.int32((row[at + i] >> (2 * s)) & 3) * np.int32(xq[t, xo + i])
                            isum += np.int32(row[o + sub] & 15) * d16
                dall = xd[t, b] * _half(row, o + 80, f16)
                dmin = xd[t, b] * _half(row, o + 82, f16)
                acc += dall * np.float32(isum) - dmin * np.float32(summs)
            out[t, r] = acc


@_jit
def _q4_scale_min(row, o, j):
    if j < 4:
        return np.int32(row[o + 4 + j] & 63), np.int32(row[o + 8 + j] & 63)
    sc = np.int32(row[o + 8 + j] & 15) | (np.int32(row[o + j] >> 6) << 4)
    mn = np.int32(row[o + 8 + j] >> 4) | (np.int32(row[o + 4 + j] >> 6) << 4)
    return sc, mn


@_jit
def q4_k_rows(raw, xq, xd, bsums, out, r0, r1, f16):
    """raw [rows, nb * 144] uint8 (Q4_K blocks) -> out[:, r0:r1]."""
    n = xq.shape[0]
    nb = raw.shape[1] // 144
    for r in range(r0, r1):
        row = raw[r]
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 144
                x0 = b * 256
                summs = 0
                isum = 0
                for j in range(8):
                    sc, mn = _q4_scale_min(row, o, j)
                    summs += mn * (bsums[t, b * 16 + 2 * j] + bsums[t, b * 16 + 2 * j + 1])
                    at = o + 16 + (j // 2) * 32
                    shift = 4 * (j % 2)
                    d32 = 0
                    for i in range(32):
                        d32 += np.int32((row[at + i] >> shift) & 15) * np.int32(xq[t, x0 + 32 * j + i])
                    isum += sc * d32
                dall = xd[t, b] * _half(row, o, f16)
                dmin = xd[t, b] * _half(row, o + 2, f16)
                acc += dall * np.float32(isum) - dmin * np.float32(summs)
            out[t, r] = acc


@_jit
def iq2_xxs_rows(raw, xq, xd, out, r0, r1, f16, signed):
    """raw [rows, nb * 66] uint8 (IQ2_XXS blocks), signed [256 * 128, 8] int8 (the signed grid,
    quant.iq2xxs_signed_codes) -> out[:, r0:r1]."""
    n = xq.shape[0]
    nb = raw.shape[1] // 66
    for r in range(r0, r1):
        row = raw[r]
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 66
                x0 = b * 256
                bsum = 0
                for g in range(8):
                    a = _u32(row, o + 2 + 8 * g)
                    bb = _u32(row, o + 6 + 8 * g)
                    s32 = 0
                    for j in range(4):
                        at = np.int64((((a >> np.uint32(8 * j)) & np.uint32(255)) << np.uint32(7))
                                      | ((bb >> np.uint32(7 * j)) & np.uint32(127)))
                        xo = x0 + g * 32 + j * 8
                        for p in range(8):
                            s32 += np.int32(signed[at, p]) * np.int32(xq[t, xo + p])
                    bsum += np.int32(2 * (bb >> np.uint32(28)) + 1) * s32
                acc += (_half(row, o, f16) * xd[t, b]) * np.float32(bsum)
            out[t, r] = np.float32(0.125) * acc


@_jit
def dense_rows(w, x, out, r0, r1):
    """w [rows, cols] f32 -> out[:, r0:r1] (16 lane sums, see the module docstring)."""
    n, cols = x.shape
    lanes = np.empty(16, np.float32)
    for r in range(r0, r1):
        for t in range(n):
            lanes[:] = 0.0
            for c in range(cols):
                lanes[c % 16] += w[r, c] * x[t, c]
            for width in (8, 4, 2, 1):
                for lane in range(width):
                    lanes[lane] += lanes[lane + width]
            out[t, r] = lanes[0]
