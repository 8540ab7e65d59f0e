"""numba kernels of the fast CPU kernel set: activations rounded to 8 bits, and Q8_0 products
(qmatrix.py has the public objects and the contract; qkernels.py the K-quant and IQ2_XXS products).

Imported on first use, like qkernels. Activations are rounded as ds4's CPU path rounds them:
  Q8_0 (blocks of 32):  d = amax/127, q = rint(x/d) (half to even), clamped to [-128, 127]
  Q8_K (blocks of 256): m = the element of largest |x| (its sign kept, the first on a tie),
                        iscale = -127/m, q = rint(iscale*x) clamped, d = 1/iscale,
                        bsums[j] = sum of q over elements 16j..16j+15.
The Q8_0 product, per output (token t, row r), from +0, one rounding each, no fused multiply-add:
  acc += (wd_b * xd_b) * float(sum_i wq_i * xq_i)       per block b of 32
(the integer sum exact; ds4's CPU formula).

    q8_0_group1 / q8_0_group4(wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res)
        16 interleaved rows x 1 (or 4) tokens, every block, to res (f32)
    expert_rows_split(kind, ws, auxs, outs, used, starts, xq, xd, xs, cuts, grid)
        qkernels.expert_rows_split's signature and split, for Q8_0 matrices
    quantize_split(kind, x, xq, xd, xs, cuts)
        the activations' rounding (quantize_q8_0 / quantize_q8_k) split over rows the same way

Why one module: numba's on-disk cache is keyed by the source file of each jitted function, not by
the intrinsics it inlines, so the Q8_0 intrinsics and every kernel that inlines them live in one
file (a change to either invalidates that file's cache); the IR building blocks come from qir.py,
whose digest this file carries.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ds4agent.engine.qir import F16, F32, I8, I16, I32, I64, dot4, load, prefetch, ptr, splat, store, vec

# qir.py's SHA-256: the IR this file's kernels inline comes from there, and numba's cache of this
# file is kept while this file is unchanged (see qir.py; a test checks the digest).
QIR_DIGEST = "4d53f368174020334758d25edb4c1ddebf09185adacf1f497c8eb298ef648234"


# ---- Q8_0 rows interleaved for the 4-byte dot-product instruction -------------------------------
# A group of 16 rows is stored block by block as 8 runs of 64 bytes: run q of block b holds, for
# each of the 16 rows, its 4 codes 32b + 4q .. 32b + 4q + 3 (as code + 128, unsigned). One 64-byte
# load then meets one 4-byte piece of the activations (broadcast) and one u8 x s8 4-way dot
# instruction adds 16 rows' partial sums at once: no horizontal sums at all.


def _q8_0_group(tokens: int):
    @intrinsic
    def q8_0_group(typingctx, wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res, ahead):
        # rows of one group x `tokens` consecutive tokens: res[16j + l] = row l, token j:
        # from +0, per block b: acc += (wd[l, b] * xd[j, b]) * float(dot - 128 * xs[j, b]).
        # ahead (>= 0; several tokens only): while block b's products run, the cache line at
        # byte ahead + 64 b of wi from wo is asked for (_q8_0_rows: why). One token's body has
        # no such step: it streams at the memory's rate as it is.
        def codegen(context, builder, sig, args):
            wi_, wo_, wd_, wdo_, xq_, xo_, xd_, xs_, so_, nb_, cols_, res_, ahead_ = args
            pw = ptr(context, builder, sig.args[0], wi_, wo_)
            pwd = ptr(context, builder, sig.args[2], wd_, wdo_)
            px = ptr(context, builder, sig.args[4], xq_, xo_)
            pxd = ptr(context, builder, sig.args[6], xd_, so_)
            pxs = ptr(context, builder, sig.args[7], xs_, so_)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vec(F32, 16), [0.0] * 16)) for _ in range(tokens)]
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                sums = [ir.Constant(vec(I32, 16), [0] * 16)] * tokens
                wblock = builder.gep(pw, [builder.mul(b, ir.Constant(I64, 512))])
                if tokens > 1:
                    with builder.if_then(builder.icmp_signed(">=", ahead_, ir.Constant(I64, 0))):
                        prefetch(builder, builder.gep(pw, [builder.add(ahead_, builder.mul(b, ir.Constant(I64, 64)))]))
                for q in range(8):
                    w64 = load(builder, builder.gep(wblock, [ir.Constant(I64, 64 * q)]), I8, 64)
                    for j in range(tokens):
                        at = builder.add(builder.mul(ir.Constant(I64, j), cols_),
                                         builder.add(builder.mul(b, ir.Constant(I64, 32)), ir.Constant(I64, 4 * q)))
                        x4 = builder.load(builder.bitcast(builder.gep(px, [at]), I32.as_pointer()), align=1)
                        sums[j] = dot4(builder, sums[j], w64, builder.bitcast(splat(builder, x4, I32, 16), vec(I8, 64)))
                wd16 = load(builder, builder.gep(pwd, [builder.mul(b, ir.Constant(I64, 16))]), I16, 16)
                wdv = builder.fpext(builder.bitcast(wd16, vec(F16, 16)), vec(F32, 16))  # exact
                for j in range(tokens):
                    sb = builder.add(builder.mul(ir.Constant(I64, j), nb_), b)
                    corr = builder.mul(builder.load(builder.gep(pxs, [sb])), ir.Constant(I32, 128))
                    isum = builder.sub(sums[j], splat(builder, corr, I32, 16))
                    scale = builder.fmul(wdv, splat(builder, builder.load(builder.gep(pxd, [sb])), F32, 16))
                    term = builder.fmul(scale, builder.sitofp(isum, vec(F32, 16)))
                    builder.store(builder.fadd(builder.load(accs[j]), term), accs[j])
            pres = ptr(context, builder, sig.args[11], res_, ir.Constant(I64, 0))
            for j in range(tokens):
                store(builder, builder.load(accs[j]), builder.gep(pres, [ir.Constant(I64, 16 * j)]), F32, 16)
            return context.get_dummy_value()

        return types.void(wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res, ahead), codegen

    return q8_0_group


q8_0_group1, q8_0_group4 = _q8_0_group(1), _q8_0_group(4)



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


@_jit
def _q8_0_rows(wi, wd, xq, xd, xs, out, r0, r1, t0, t1):
    # wi [groups, nb * 512] uint8: 16 rows interleaved (the Q8_0 layout, codes + 128),
    # wd [groups, nb * 16] uint16 (the f16 scales' bits); xs: the activation blocks' code sums
    # (sum (q + 128) * x - 128 * sum x = sum q * x). Tokens four at a time (the weights read once
    # per four), then one by one. Only a group's first pass reads its weights from DRAM (the
    # rest from cache), which with the hardware's prefetch alone left a 64-token product about
    # 20 % slower with its weights in DRAM than in L3: so each of a group's first 8 four-token
    # passes asks for an eighth of the next group's weights (a line per block) as it goes, the
    # reads spread over the compute.
    rows = out.shape[1]
    cols = xq.shape[1]
    nb = cols // 32
    res = np.empty(64, np.float32)
    for g in range(r0 // 16, (r1 + 15) // 16):
        lo, hi = max(r0, 16 * g), min(r1, 16 * g + 16, rows)
        t = t0
        k = 0  # the pass over this group
        while t < t1:
            count = 4 if t + 4 <= t1 else 1
            ahead = nb * 512 + k * nb * 64 if k < 8 else -1
            k += 1
            if count == 4:
                q8_0_group4(wi, g * nb * 512, wd, g * nb * 16, xq, t * cols, xd, xs, t * nb, nb, cols, res, ahead)
            else:
                q8_0_group1(wi, g * nb * 512, wd, g * nb * 16, xq, t * cols, xd, xs, t * nb, nb, cols, res, ahead)
            for j in range(count):
                for r in range(lo, hi):
                    out[t + j, r] = res[16 * j + r - 16 * g]
            t += count


# ---- every core (as qkernels.expert_rows_split) --------------------------------------------------
_jit_split = njit(nogil=True, cache=True, parallel=True)


@_jit_split
def quantize_split(kind, x, xq, xd, xs, cuts):
    """quantize_q8_0 (kind 0) or quantize_q8_k (kind 1) of rows cuts[p]..cuts[p + 1] on thread p
    (a row's codes never depend on the split)."""
    for p in prange(cuts.shape[0] - 1):
        a, b = cuts[p], cuts[p + 1]
        if kind == 0:
            quantize_q8_0(x[a:b], xq[a:b], xd[a:b], xs[a:b])
        else:
            quantize_q8_k(x[a:b], xq[a:b], xd[a:b], xs[a:b])


@_jit_split
def expert_rows_split(kind, ws, auxs, outs, used, starts, xq, xd, xs, cuts, grid):
    """Rows cuts[p]..cuts[p + 1] of each Q8_0 matrix ws[m] (into outs[m]) on thread p: expert
    used[i] takes the activation rows starts[i]..starts[i+1]. ws / auxs [n_experts, ...]: codes
    + 128 in the interleaved layout [row groups of 16, nb * 512] and the f16 block scales' bits
    (uint16) [groups, nb * 16] (cuts at multiples of 16). Activations (quantize_q8_0's): xq int8,
    xd f32 scales, xs int32 code sums per block of 32. kind and grid: unused (qkernels' signature)."""
    for p in prange(cuts.shape[0] - 1):
        for m in range(len(ws)):
            for i in range(used.shape[0]):
                e = used[i]
                _q8_0_rows(ws[m][e], auxs[m][e], xq, xd, xs, outs[m], cuts[p], cuts[p + 1], starts[i], starts[i + 1])
