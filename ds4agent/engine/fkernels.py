"""numba kernels of the fast CPU kernel set on floats: the F16/F32 product, the attention core, the
routed experts' SwiGLU, and three of the host steps between products, the RMS normalisation, the
hyper-connection update (host_mixing.py) and RoPE (host_ops.py); qkernels.py has the quantised
products; qmatrix.py the contract.

Imported on first use, like qkernels. A dense product (`dense_rows`) sums in a fixed lane order,
written in LLVM IR so that the compiler cannot regroup it:
  F16/F32 16 lane sums: lane l adds w_c*x_c for c = l, l+16, ... in order (an f16 weight widened
          exactly); then lanes summed pairwise (l with l+8, then +4, +2, +1).
Every kernel works on a range of rows (or attention units) and `*_split` spreads ranges over
numba's threads as qkernels' expert_rows_split does; a row's result never depends on the range.

numba's on-disk cache is keyed by the source file of each jitted function, not by what it inlines,
so a kernel's intrinsics live in the kernel's file; the IR building blocks come from qir.py, whose
digest this file carries (a change there must change this file, and with it the cache).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ds4agent.engine.qir import F16, F32, I32, I64, load, ptr, shuffle, store, vec

_jit = njit(nogil=True, cache=True)
_jit_split = njit(nogil=True, cache=True, parallel=True)
# qir.py's SHA-256: the IR this file's kernels inline comes from there, and numba's cache of this
# file is kept while this file is unchanged (see qir.py; a test checks the digest).
QIR_DIGEST = "4d53f368174020334758d25edb4c1ddebf09185adacf1f497c8eb298ef648234"


def _lane_steps(builder, pw, half: bool, xs, lanes, full, pws=()):
    """Columns 0..full (a multiple of 16) of w against each x pointer of `xs`, 16 at a time, added
    into the lane accumulators `lanes` (allocas, one per x): one weight load and widening per 16
    columns, whatever the number of x. `pws`: more weight rows (of w's type), each met by every x
    the same way, into lanes[len(xs) * (k + 1):] (row k of pws), each x loaded once for the rows."""
    with cgutils.for_range_slice(builder, ir.Constant(I64, 0), full, ir.Constant(I64, 16)) as (i, _):
        wv = load(builder, builder.gep(pw, [i]), F16 if half else F32, 16)
        if half:
            wv = builder.fpext(wv, vec(F32, 16))
        wvs = [wv]
        for p in pws:
            v = load(builder, builder.gep(p, [i]), F16 if half else F32, 16)
            wvs.append(builder.fpext(v, vec(F32, 16)) if half else v)
        for j, px in enumerate(xs):
            xv = load(builder, builder.gep(px, [i]), F32, 16)
            for k, w in enumerate(wvs):
                acc = lanes[k * len(xs) + j]
                builder.store(builder.fadd(builder.load(acc), builder.fmul(w, xv)), acc)


def _lane_dots(builder, pw, half: bool, xs, count, pws=()):
    """The dot product's 16 lane sums of w against each x pointer of `xs` (one weight load and
    widening per 16 columns, whatever the number of x), each reduced in the fixed pairwise order.
    Per x the float steps are those of one product alone, so a row's result does not depend on how
    many tokens share the call. `pws`: more weight rows, their sums after w's (row-major)."""
    full = builder.and_(count, ir.Constant(I64, -16))
    rows = [pw, *pws]
    lanes = [cgutils.alloca_once(builder, vec(F32, 16)) for _ in rows for _ in xs]
    for acc in lanes:
        builder.store(ir.Constant(vec(F32, 16), [0.0] * 16), acc)
    _lane_steps(builder, pw, half, xs, lanes, full, pws)
    with cgutils.for_range_slice(builder, full, count, ir.Constant(I64, 1)) as (i, _):
        lane = builder.trunc(builder.sub(i, full), I32)
        for k, row in enumerate(rows):
            wi = builder.load(builder.gep(row, [i]))
            if half:
                wi = builder.fpext(wi, F32)
            for j, px in enumerate(xs):
                acc = lanes[k * len(xs) + j]
                # whole-vector loads and stores only, so that LLVM keeps each accumulator in a register
                v = builder.load(acc)
                term = builder.fmul(wi, builder.load(builder.gep(px, [i])))
                builder.store(builder.insert_element(v, builder.fadd(builder.extract_element(v, lane), term), lane), acc)
    sums = []
    for acc in lanes:
        v = builder.load(acc)
        for width in (8, 4, 2, 1):
            v = builder.fadd(shuffle(builder, v, v, range(width)), shuffle(builder, v, v, range(width, 2 * width)))
        sums.append(builder.extract_element(v, ir.Constant(I32, 0)))
    return sums


def _weights_ptr(context, builder, aty, arr, off, half: bool):
    pw = ptr(context, builder, aty, arr, off)
    return builder.bitcast(pw, F16.as_pointer()) if half else pw


def _x_rows(context, builder, aty, arr, xo, stride, count: int):
    """Pointers to `count` rows of the array value arr (numba type aty): xo, xo + stride, ..."""
    return [ptr(context, builder, aty, arr, builder.add(xo, builder.mul(ir.Constant(I64, j), stride)))
            for j in range(count)]


@intrinsic
def dot_f32_lanes(typingctx, w, wo, x, xo, n):
    """sum over i < n of w[wo+i] * x[xo+i] in float32: w f32, or f16 given as uint16 bits
    (widened exactly); 16 lane sums (lane l adds the products i = l, l+16, ... in order, each
    product and sum rounded once: no fused multiply-add), then lanes l and l+8 added, then
    l and l+4, l+2, l+1. The order is fixed by this IR, not by the compiler."""
    half = w.dtype == types.uint16

    def codegen(context, builder, sig, args):
        pw = _weights_ptr(context, builder, sig.args[0], args[0], args[1], half)
        px = ptr(context, builder, sig.args[2], args[2], args[3])
        return _lane_dots(builder, pw, half, [px], args[4])[0]

    return types.float32(w, wo, x, xo, n), codegen


def _dot_group(count: int):
    @intrinsic
    def dot_group(typingctx, w, wo, x, xo, stride, n, res):
        half = w.dtype == types.uint16

        def codegen(context, builder, sig, args):
            pw = _weights_ptr(context, builder, sig.args[0], args[0], args[1], half)
            xs = _x_rows(context, builder, sig.args[2], args[2], args[3], args[4], count)
            sums = _lane_dots(builder, pw, half, xs, args[5])
            for j, v in enumerate(sums):
                builder.store(v, ptr(context, builder, sig.args[6], args[6], ir.Constant(I64, j)))
            return context.get_dummy_value()

        return types.void(w, wo, x, xo, stride, n, res), codegen

    return dot_group


DOT_TOKENS = 4  # the x rows dot_f32_lanes_group meets with one pass over the weights
# Heads of one query taken together by the attention: they see the same rows, so each key row is
# read (from L2) once for the block and meets every head's query from L1. One head at a time, the
# rows streamed from L2 for every head (64 times per query at the Flash shape), and L2's bandwidth
# set the speed. A whole block's scores come from one pass over two rows (dot_f32_lanes_heads2:
# sixteen independent sums to overlap, each head's query loaded once for both rows; measured, the
# scores take 0.7x the time of passes of four heads over one row).
HEAD_BLOCK = 8
# res[j] = dot_f32_lanes(w, wo, x, xo + j * stride, n) for j < DOT_TOKENS (or HEAD_BLOCK), bit for
# bit, with each 16 weights loaded (and widened) once for all of them: a prefill's dense products
# read their f16 rows a quarter as often.
dot_f32_lanes_group = _dot_group(DOT_TOKENS)
dot_f32_lanes_heads = _dot_group(HEAD_BLOCK)


@intrinsic
def dot_f32_lanes_heads2(typingctx, w, wo, wo2, x, xo, stride, n, res):
    """dot_f32_lanes_heads of two rows of w (f32) at once, res[0:HEAD_BLOCK] for the row at wo and
    res[HEAD_BLOCK:] for the row at wo2, bit for bit: each head's 16 columns loaded once for both
    rows, and sixteen independent sums to overlap (a third off the scores' time)."""
    if w.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        pw, pw2 = (ptr(context, builder, sig.args[0], args[0], args[k]) for k in (1, 2))
        xs = _x_rows(context, builder, sig.args[3], args[3], args[4], args[5], HEAD_BLOCK)
        for k, v in enumerate(_lane_dots(builder, pw, False, xs, args[6], (pw2,))):
            builder.store(v, ptr(context, builder, sig.args[7], args[7], ir.Constant(I64, k)))
        return context.get_dummy_value()

    return types.void(w, wo, wo2, x, xo, stride, n, res), codegen


def _lanes_tile(rows: int):
    """The column-tile intrinsic of `rows` consecutive weight rows (see dot_f32_lanes_tile)."""

    @intrinsic
    def tile(typingctx, w, wo, x, xo, stride, n, acc, ao):
        half = w.dtype == types.uint16

        def codegen(context, builder, sig, args):
            pws = [_weights_ptr(context, builder, sig.args[0], args[0],
                                builder.add(args[1], builder.mul(ir.Constant(I64, k), args[4])), half)
                   for k in range(rows)]
            xs = _x_rows(context, builder, sig.args[2], args[2], args[3], args[4], DOT_TOKENS)
            pacc = [ptr(context, builder, sig.args[6], args[6], builder.add(args[7], ir.Constant(I64, 16 * j)))
                    for j in range(rows * DOT_TOKENS)]
            lanes = [cgutils.alloca_once(builder, vec(F32, 16)) for _ in pacc]
            for a, pa in zip(lanes, pacc, strict=True):
                builder.store(load(builder, pa, F32, 16), a)
            _lane_steps(builder, pws[0], half, xs, lanes, args[5], pws[1:])
            for a, pa in zip(lanes, pacc, strict=True):
                store(builder, builder.load(a), pa, F32, 16)
            return context.get_dummy_value()

        return types.void(w, wo, x, xo, stride, n, acc, ao), codegen

    return tile


# dot_f32_lanes_tile(w, wo, x, xo, stride, n, acc, ao): columns wo.. wo + n (n a multiple of 16) of
# dot_f32_lanes_group's DOT_TOKENS products, continuing their 16 lane sums in acc[ao + 16 j ..]
# (token j): the lanes' adds are the same, in the same order, as one pass over every column, so a
# long row can be taken in column tiles whose activations stay in L1. The lanes are reduced by
# lanes_sum. dot_f32_lanes_tile2: the same for the rows at wo and wo + stride (rows as long as the
# x rows), their lane sums at acc[ao:] and acc[ao + 16 DOT_TOKENS:], bit for bit, each 16 columns
# of a token's activations loaded once for both rows.
dot_f32_lanes_tile, dot_f32_lanes_tile2 = _lanes_tile(1), _lanes_tile(2)


@intrinsic
def lanes_sum(typingctx, acc, ao):
    """The 16 lane sums at acc[ao:] reduced in dot_f32_lanes' pairwise order."""

    def codegen(context, builder, sig, args):
        v = load(builder, ptr(context, builder, sig.args[0], args[0], args[1]), F32, 16)
        for width in (8, 4, 2, 1):
            v = builder.fadd(shuffle(builder, v, v, range(width)), shuffle(builder, v, v, range(width, 2 * width)))
        return builder.extract_element(v, ir.Constant(I32, 0))

    return types.float32(acc, ao), codegen


# Columns per pass of a long row: DOT_TOKENS tokens' activations (4 x 512 f32, 8 KiB) stay in
# L1 while a block's rows go by. Without tiles a 4096-column row streams 64 KiB of activations
# from L2 for every row, and L2's bandwidth, not the arithmetic, sets the speed.
COLUMN_TILE = 512


@_jit
def dense_rows(w, x, out, r0, r1):
    """w [rows, cols] f32, or f16 as uint16 bits -> out[:, r0:r1] (dot_f32_lanes's order)."""
    n, cols = x.shape
    res = np.empty(DOT_TOKENS, np.float32)
    # Rows in blocks of about 64 KiB of weights, each block met by every group of DOT_TOKENS
    # tokens in turn: the block stays in L2 and the group's activations in L1 (row by row, all
    # tokens' activations would stream from L2 for every row: measured, two thirds of the speed).
    block = max(1, 65536 // (cols * w.itemsize))
    full = n - n % DOT_TOKENS
    tiled = cols % 16 == 0 and cols > COLUMN_TILE
    acc = np.empty(block * DOT_TOKENS * 16, np.float32)
    for b0 in range(r0, r1, block):
        b1 = min(b0 + block, r1)
        for t in range(0, full, DOT_TOKENS):
            if tiled:
                acc[:] = 0.0
                for k0 in range(0, cols, COLUMN_TILE):
                    k = min(COLUMN_TILE, cols - k0)
                    for r in range(b0, b1 - 1, 2):  # two rows a pass: the activations loaded once for both
                        dot_f32_lanes_tile2(w, r * cols + k0, x, t * cols + k0, cols, k, acc, (r - b0) * DOT_TOKENS * 16)
                    if (b1 - b0) % 2:
                        r = b1 - 1
                        dot_f32_lanes_tile(w, r * cols + k0, x, t * cols + k0, cols, k, acc, (r - b0) * DOT_TOKENS * 16)
                for r in range(b0, b1):
                    for j in range(DOT_TOKENS):
                        out[t + j, r] = lanes_sum(acc, ((r - b0) * DOT_TOKENS + j) * 16)
                continue
            for r in range(b0, b1):
                dot_f32_lanes_group(w, r * cols, x, t * cols, cols, cols, res)
                for j in range(DOT_TOKENS):
                    out[t + j, r] = res[j]
        for t in range(full, n):
            for r in range(b0, b1):
                out[t, r] = dot_f32_lanes(w, r * cols, x, t * cols, cols)



def _weighted_rows(heads: int, vecs: int):
    """pv(keys, slots, so, count, e, eo, estride, d0, out, oo, ostride), keys [R, D] f32: for heads
    i < `heads` and the 16 * `vecs` columns from d0, out[oo + i * ostride + c] = the sum over
    j < count with r = slots[so + j] >= 0, in j's order, of e[eo + i * estride + j] * keys[r, d0 + c],
    from +0, each product and sum rounded once (no fused multiply-add). The accumulators stay in
    registers over all the rows and each 16 columns of a row are loaded once for the heads: row by
    row over every column, each head's accumulator row went through L1 for every key row (a
    load and a store per 16 products), and that, not the arithmetic, set the speed."""

    @intrinsic
    def pv(typingctx, keys, slots, so, count, e, eo, estride, d0, out, oo, ostride):
        if any(a.layout != "C" for a in (keys, slots, e, out)):
            return None  # flat offsets: C-contiguous arrays only (numba refuses the call)

        def codegen(context, builder, sig, args):
            keys_, slots_, so_, count_, e_, eo_, estride_, d0_, out_, oo_, ostride_ = args
            karr = context.make_array(sig.args[0])(context, builder, keys_)
            row_len = builder.extract_value(karr.shape, 1)
            first = builder.gep(karr.data, [d0_])
            ps = ptr(context, builder, sig.args[1], slots_, so_)
            zero = ir.Constant(vec(F32, 16), [0.0] * 16)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(vecs)] for _ in range(heads)]
            pes = [ptr(context, builder, sig.args[4], e_, builder.add(eo_, builder.mul(ir.Constant(I64, i), estride_)))
                   for i in range(heads)]
            with cgutils.for_range(builder, count_) as loop:
                j = loop.index
                r = builder.sext(builder.load(builder.gep(ps, [j])), I64)
                with cgutils.if_likely(builder, builder.icmp_signed(">=", r, ir.Constant(I64, 0))):
                    row = builder.gep(first, [builder.mul(r, row_len)])
                    kv = [load(builder, builder.gep(row, [ir.Constant(I64, 16 * k)]), F32, 16) for k in range(vecs)]
                    for i in range(heads):
                        w = builder.insert_element(ir.Constant(vec(F32, 16), None), builder.load(builder.gep(pes[i], [j])),
                                                   ir.Constant(I32, 0))
                        w = shuffle(builder, w, w, [0] * 16)
                        for k in range(vecs):
                            builder.store(builder.fadd(builder.load(accs[i][k]), builder.fmul(w, kv[k])), accs[i][k])
            for i in range(heads):
                po = ptr(context, builder, sig.args[8], out_, builder.add(oo_, builder.mul(ir.Constant(I64, i), ostride_)))
                for k in range(vecs):
                    store(builder, builder.load(accs[i][k]), builder.gep(po, [ir.Constant(I64, 16 * k)]), F32, 16)
            return context.get_dummy_value()

        return types.void(keys, slots, so, count, e, eo, estride, d0, out, oo, ostride), codegen

    return pv


# Heads x 16-column vectors per pass over the rows: 16 accumulators and 4 rows' vectors in
# AVX-512's 32 registers. Fewer heads (a block's last) and 16-column tiles (D % 64) take the others.
_pv_4x4, _pv_1x4, _pv_4x1, _pv_1x1 = (_weighted_rows(h, v) for h, v in ((4, 4), (1, 4), (4, 1), (1, 1)))


@_jit
def weighted_rows_sum(keys, slots, so, count, e, heads, out):
    """out[i, :D] = sum over j < count with r = slots[so + j] >= 0, in j's order, of
    e[i, j] * keys[r] for heads i < `heads` (keys [R, D] f32; e [>= heads, >= count],
    out [>= heads, >= D] f32): per element from +0, each product and sum rounded once. Columns
    64 at a time, then 16, then one by one; each column's sum is its own, so the tiling leaves
    the bits as a plain loop over the rows gives them."""
    D = keys.shape[1]
    wide, vecs = D - D % 64, D - D % 16
    est, ost = e.shape[1], out.shape[1]
    grouped = heads - heads % 4
    for d0 in range(0, wide, 64):
        for i0 in range(0, grouped, 4):
            _pv_4x4(keys, slots, so, count, e, i0 * est, est, d0, out, i0 * ost + d0, ost)
        for i in range(grouped, heads):
            _pv_1x4(keys, slots, so, count, e, i * est, est, d0, out, i * ost + d0, ost)
    for d0 in range(wide, vecs, 16):
        for i0 in range(0, grouped, 4):
            _pv_4x1(keys, slots, so, count, e, i0 * est, est, d0, out, i0 * ost + d0, ost)
        for i in range(grouped, heads):
            _pv_1x1(keys, slots, so, count, e, i * est, est, d0, out, i * ost + d0, ost)
    for d in range(vecs, D):
        for i in range(heads):
            out[i, d] = 0.0
        for j in range(count):
            r = slots[so + j]
            if r >= 0:
                for i in range(heads):
                    out[i, d] = np.float32(out[i, d] + np.float32(e[i, j] * keys[r, d]))



@_jit
def _take_scores(res, at, scale, sc, j, m):
    """A head block's dots res[at:at + HEAD_BLOCK] of slot j: scores, scaled, to sc[:, j], and
    the heads' running maxima m."""
    for i in range(HEAD_BLOCK):
        s = np.float32(res[at + i] * scale)
        sc[i, j] = s
        if s > m[i]:
            m[i] = s


@_jit
def attend_units(q, keys, slots, sinks, scale, out, u0, u1):
    """Attention of (query, head) units u0..u1 (u = t * H + h) over the key rows each query sees.

    q [n, H, D] f32; keys [R, D] f32 (keys and values are the same rows); slots [n, S] int32: the
    rows of `keys` query t sees, -1 where a slot is empty; sinks [H]; out [n, H, D]. Per unit:
    scores s_j = dot_f32_lanes(key_j, q) * scale; m = max(sink, s_j); e_j = exp(s_j - m) in f32;
    out = (sum_j e_j * key_j, in slot order) / (exp(sink - m) + sum_j e_j, in slot order). A unit's
    result depends on its query and rows alone, never on the other units of the call (the heads
    of a block share only the reading of the rows: each head's steps are its own, in this order)."""
    n, H, D = q.shape
    S = slots.shape[1]
    sc = np.empty((HEAD_BLOCK, S), np.float32)
    acc = np.zeros((HEAD_BLOCK, D), np.float32)
    m = np.empty(HEAD_BLOCK, np.float32)
    denom = np.empty(HEAD_BLOCK, np.float32)
    res = np.empty(DOT_TOKENS, np.float32)
    res_pair = np.empty(2 * HEAD_BLOCK, np.float32)
    u = u0
    while u < u1:
        t, h0 = u // H, u % H
        hb = min(HEAD_BLOCK, H - h0, u1 - u)
        grouped = hb - hb % DOT_TOKENS
        for i in range(hb):
            m[i] = sinks[h0 + i]
        if hb == HEAD_BLOCK:  # the whole block in one pass over two rows at a time
            pending = -1  # a seen slot waiting for its pair
            for j in range(S):
                if slots[t, j] < 0:
                    continue
                if pending < 0:
                    pending = j
                    continue
                dot_f32_lanes_heads2(keys, slots[t, pending] * D, slots[t, j] * D, q, (t * H + h0) * D, D, D,
                                     res_pair)
                _take_scores(res_pair, 0, scale, sc, pending, m)
                _take_scores(res_pair, HEAD_BLOCK, scale, sc, j, m)
                pending = -1
            if pending >= 0:
                dot_f32_lanes_heads(keys, slots[t, pending] * D, q, (t * H + h0) * D, D, D, res_pair)
                _take_scores(res_pair, 0, scale, sc, pending, m)
        else:  # a short block (a range's or the heads' last): DOT_TOKENS heads a pass, then one by one
            for j in range(S):
                r = slots[t, j]
                if r < 0:
                    continue
                for i0 in range(0, grouped, DOT_TOKENS):
                    dot_f32_lanes_group(keys, r * D, q, (t * H + h0 + i0) * D, D, D, res)
                    for i in range(DOT_TOKENS):
                        s = np.float32(res[i] * scale)
                        sc[i0 + i, j] = s
                        if s > m[i0 + i]:
                            m[i0 + i] = s
                for i in range(grouped, hb):
                    s = np.float32(dot_f32_lanes(keys, r * D, q, (t * H + h0 + i) * D, D) * scale)
                    sc[i, j] = s
                    if s > m[i]:
                        m[i] = s
        for i in range(hb):
            denom[i] = np.float32(np.exp(np.float32(sinks[h0 + i] - m[i])))
        for j in range(S):
            if slots[t, j] >= 0:
                for i in range(hb):
                    e = np.float32(np.exp(np.float32(sc[i, j] - m[i])))
                    sc[i, j] = e  # the score's weight, in its place
                    denom[i] = np.float32(denom[i] + e)
        weighted_rows_sum(keys, slots[t], 0, S, sc, hb, acc)
        for i in range(hb):
            for d in range(D):
                out[t, h0 + i, d] = np.float32(acc[i, d] / denom[i])
        u += hb


@_jit_split
def dense_rows_split(w, x, out, cuts):
    for p in prange(cuts.shape[0] - 1):
        dense_rows(w, x, out, cuts[p], cuts[p + 1])



@_jit_split
def attend_units_split(q, keys, slots, sinks, scale, out, cuts):
    for p in prange(cuts.shape[0] - 1):
        attend_units(q, keys, slots, sinks, scale, out, cuts[p], cuts[p + 1])



@_jit
def _index_term(acc, d, w):
    return np.float32(acc + np.float32((d if d > np.float32(0.0) else np.float32(0.0)) * w))


@_jit
def index_scores(q, w, keys, out, c0, c1):
    """The indexer's scores of every query over index rows c0..c1: out[t, c] = the sum over heads h,
    in head order from +0, of max(dot(q[t, h], keys[c]), 0) * w[t, h], each step rounded once to
    float32 (the dots dot_f32_lanes's). q [n, Hi, Di], w [n, Hi], keys [C, Di], out [n, C] f32.
    A (query, row) score depends on that query and row alone. Rows go in blocks of 64 (32 KiB of
    keys at Di = 128, kept in L1 for every query), two rows a pass for a block of eight heads
    (dot_f32_lanes_heads2, as the attention's scores)."""
    n, Hi, Di = q.shape
    res = np.empty(2 * HEAD_BLOCK, np.float32)
    blocked = Hi - Hi % HEAD_BLOCK
    for b0 in range(c0, c1, 64):
        b1 = min(b0 + 64, c1)
        for t in range(n):
            for c in range(b0, b1, 2):
                pair = c + 1 < b1
                a = np.float32(0.0)
                b = np.float32(0.0)
                for h0 in range(0, blocked, HEAD_BLOCK):
                    if pair:
                        dot_f32_lanes_heads2(keys, c * Di, (c + 1) * Di, q, (t * Hi + h0) * Di, Di, Di, res)
                    else:
                        dot_f32_lanes_heads(keys, c * Di, q, (t * Hi + h0) * Di, Di, Di, res)
                    for i in range(HEAD_BLOCK):
                        a = _index_term(a, res[i], w[t, h0 + i])
                        if pair:
                            b = _index_term(b, res[HEAD_BLOCK + i], w[t, h0 + i])
                for h in range(blocked, Hi):
                    a = _index_term(a, dot_f32_lanes(keys, c * Di, q, (t * Hi + h) * Di, Di), w[t, h])
                    if pair:
                        b = _index_term(b, dot_f32_lanes(keys, (c + 1) * Di, q, (t * Hi + h) * Di, Di), w[t, h])
                out[t, c] = a
                if pair:
                    out[t, c + 1] = b


@_jit_split
def index_scores_split(q, w, keys, out, cuts):
    for p in prange(cuts.shape[0] - 1):
        index_scores(q, w, keys, out, cuts[p], cuts[p + 1])


@_jit_split
def swiglu_weighted(g, u, w, clamp, out):
    """out[t, j] = silu(min(g, c)) * clip(u, -c, c) * w[t, j] over g, u [n, k, F] float32 (the
    routed experts' SwiGLU and slot weight, ops.swiglu's formula in ds4's form, as the shared
    expert's host_ops.swiglu): silu(z) = z * sigmoid(z), sigmoid(z) = 1 / (1 + e^-z) for z >= 0
    and e^z / (1 + e^z) below, each step rounded to float32, in this order. The (t, j) rows are
    spread over numba's threads (a row's values never depend on the split)."""
    n, k, F = g.shape
    c = np.float32(clamp)
    one = np.float32(1.0)
    for row in prange(n * k):
        t, j = row // k, row % k
        wt = w[t, j]
        for f in range(F):
            z = min(g[t, j, f], c)
            v = min(max(u[t, j, f], -c), c)
            if z >= 0:
                s = one / (one + np.exp(-z))
            else:
                e = np.exp(z)
                s = e / (one + e)
            out[t, j, f] = ((z * s) * v) * wt


@_jit
def rms_rows(x, eps, out):
    """out[t] = x[t] * (1 / sqrt(mean(x[t]²) + eps)) over x [n, cols] float32: the squares summed
    in float64 (each exact there) in eight interleaved partial sums, the mean rounded to
    float32, then eps added, the square root, the reciprocal and the product in float32 (a
    float64 square root rounded to float32 is the float32 square root)."""
    n, cols = x.shape
    e = np.float32(eps)
    one = np.float32(1.0)
    full = cols - cols % 8
    for t in range(n):
        s = np.zeros(8, np.float64)
        for i in range(0, full, 8):
            for k in range(8):
                v = np.float64(x[t, i + k])
                s[k] += v * v
        total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
        for i in range(full, cols):
            v = np.float64(x[t, i])
            total += v * v
        ms = np.float32(total / cols)
        r = one / np.float32(np.sqrt(np.float64(ms + e)))
        for i in range(cols):
            out[t, i] = x[t, i] * r


@_jit
def hc_post_rows(R, y, post, C, out):
    """out[t, j] = post[t, j] * y[t] + sum over i of C[t, i, j] * R[t, i], from the first term,
    the streams' terms added in stream order, each product and sum rounded to float32 (R, out
    [n, hc, E], y [n, E], post [n, hc], C [n, hc, hc])."""
    n, hc, E = R.shape
    for t in range(n):
        for j in range(hc):
            p = post[t, j]
            for e in range(E):
                out[t, j, e] = p * y[t, e]
            for i in range(hc):  # stream by stream, each a pass over E (vectorised)
                c = C[t, i, j]
                for e in range(E):
                    out[t, j, e] = out[t, j, e] + c * R[t, i, e]


@_jit
def sinkhorn_steps(c, iters, eps):
    """c [n, hc, hc] float32 (a row softmax + eps), normalised in place: columns, then iters - 1
    times rows and columns, each entry divided by its row's or column's sum + eps; every sum
    from its first entry in index order, each step rounded to float32 (numpy's sums of so few
    values: the same bits as the array formulation, at a microsecond where its ~80 small
    array operations took ~90)."""
    n, hc = c.shape[0], c.shape[1]
    e = np.float32(eps)
    sums = np.empty(hc, np.float32)
    for t in range(n):
        for step in range(2 * iters - 1):
            if step % 2 == 0:  # columns
                for j in range(hc):
                    sums[j] = c[t, 0, j]
                for i in range(1, hc):
                    for j in range(hc):
                        sums[j] = sums[j] + c[t, i, j]
                for i in range(hc):
                    for j in range(hc):
                        c[t, i, j] = c[t, i, j] / (sums[j] + e)
            else:  # rows
                for i in range(hc):
                    total = c[t, i, 0]
                    for j in range(1, hc):
                        total = total + c[t, i, j]
                    total = total + e
                    for j in range(hc):
                        c[t, i, j] = c[t, i, j] / total


@_jit_split
def rms_rows_split(x, eps, out, cuts):
    """rms_rows of rows cuts[p]..cuts[p + 1] on thread p."""
    for p in prange(cuts.shape[0] - 1):
        a, b = cuts[p], cuts[p + 1]
        rms_rows(x[a:b], eps, out[a:b])


@_jit_split
def hc_post_rows_split(R, y, post, C, out, cuts):
    """hc_post_rows of tokens cuts[p]..cuts[p + 1] on thread p."""
    for p in prange(cuts.shape[0] - 1):
        a, b = cuts[p], cuts[p + 1]
        hc_post_rows(R[a:b], y[a:b], post[a:b], C[a:b], out[a:b])


@_jit
def rope_tail_rows(x, cos, sin, inverse):
    """x [n, m, d] float32, rotated in place: the last 2 * half values of each row as adjacent
    pairs by position t's cos/sin [n, half] (the sine negated when inverse): x0*c - x1*s and
    x0*s + x1*c, each product and difference rounded to float32 (ops.rope_tail's steps)."""
    n, m, d = x.shape
    half = cos.shape[1]
    o = d - 2 * half
    for t in range(n):
        for h in range(m):
            for i in range(half):
                c = cos[t, i]
                s = -sin[t, i] if inverse else sin[t, i]
                x0 = x[t, h, o + 2 * i]
                x1 = x[t, h, o + 2 * i + 1]
                x[t, h, o + 2 * i] = x0 * c - x1 * s
                x[t, h, o + 2 * i + 1] = x0 * s + x1 * c
