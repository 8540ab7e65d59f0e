"""numba kernels of the fast CPU kernel set: the K-quant and IQ2_XXS products (qmatrix.py has the
public objects and the contract; q8kernels.py the 8-bit activations and the Q8_0 products).

Imported on first use only (numba and its cached machine code take a moment to load). Every
kernel is compiled `nogil` and works on a range of output rows [r0, r1) and of tokens [t0, t1),
so qmatrix.py splits a product into row ranges over worker threads; a row's result never
depends on the range it falls in, nor on the other tokens (the same float steps, in the same
order; only exact integers are shared). Products per output (token t, row r), against Q8_K
activations (q8kernels.quantize_q8_k); integer sums are exact, so their order is free; the
float steps below are in this order, from +0, one rounding each, no fused multiply-add:
  Q2_K    acc += (xd*d) * float(isum) - (xd*dmin) * float(summs)            per block of 256
          isum = sum_j sc_j * dot16_j, summs = sum_j m_j * bsums_j (16 sub-blocks)
  Q4_K    as Q2_K with 8 sub-blocks of 32: summs = sum_j m_j * (bsums_2j + bsums_2j+1)
  IQ2_XXS acc += (d*xd) * float(sum_g (2 s_g + 1) * dot32_g); result = 0.125 * acc
These are ds4's CPU formulas (its portable C path) for the quantised types.

The kernels are LLVM IR, as numba intrinsics (their building blocks in qir.py). Why IR
and not plain numba loops: numba types every integer operation as int64, so a loop over int8
codes never becomes the 8-bit SIMD products the speed needs (measured: 1-2 GB/s of Q8_0 codes per
core as loops, ~20 as IR). The IR is generic LLVM (vectors, shuffles, `llvm.vector.reduce.add`):
LLVM picks the host's instructions when numba compiles (AVX-512 VNNI's 4-way u8 x s8 dot from a
u8 x s8 reduction, ARM's dot products), and it is correct on every target; the one
target-specific calls are used only where the host has them, with the same integers from generic
IR elsewhere: `vpdpbusd` (AVX-512 VNNI) for the 4-way dots; with AVX-512 BW and VBMI
(VBMI) the word and byte permutes and the multishift for IQ2_XXS's grid rows, a byte permute for
Q2_K's products and 16-bit multiply-adds for the scaled sums of IQ2_XXS and Q4_K. Every vector
operation is on integers, so results are exact whatever instructions are chosen. Intrinsics take arrays and
flat element offsets into C-contiguous arrays (no bounds checks: the kernels keep every access
inside the arrays they pass).

Why the intrinsics live here, beside the kernels: numba's on-disk cache is keyed by the source
file of each jitted function, not by the intrinsics it inlines (a change to either invalidates
this file's cache; a change to qir.py changes QIR_DIGEST here).

One row straight from its blocks times n = 1 to 8 tokens (every
block decoded in registers once for the n tokens; the float steps in registers too):
    iq2_xxs_row_dots, q2_k_row_dots, q4_k_row_dots
        (raw, ro, nb, grid, xq, xo, stride, xd, xdo, bsums, bo, bstride, res, n)
    (row_dots_with(kind, vbmi) builds them with AVX-512 BW/VBMI instructions where the host
    has them, or in portable IR: the same integers either way)
and, from LANES_MIN tokens where the host has AVX-512 VNNI, one or two rows times up to 64
tokens, 16 to a vector (the activations interleaved once per product by lanes_interleave):
    iq2_xxs_rows16_1/_2, q2_k_rows16_1/_2, q4_k_rows16_1/_2
        (raw, ro, rstride, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
    the same integers and float steps as the row dots, so the same bits.
The float kernels (the F16/F32 lane-order product, the attention core, the routed SwiGLU) are
in fkernels.py.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ds4agent.engine.qir import (
    F32,
    FEATURES,
    I8,
    I16,
    I32,
    I64,
    IQ2_CODES,
    VNNI,
    const,
    count_cases,
    dot4,
    half_at,
    iq2_magnitudes_signs,
    load,
    madd16,
    prefetch_span,
    ptr,
    q4_k_scales_mins,
    reduce,
    shuffle,
    splat,
    store,
    unit_sums,
    vec,
)

# qir.py's SHA-256: the IR this file's kernels inline comes from there, and numba's cache of this
# file is kept while this file is unchanged (see qir.py; a test checks the digest).
QIR_DIGEST = "4d53f368174020334758d25edb4c1ddebf09185adacf1f497c8eb298ef648234"


# ---- rows straight from their blocks, several tokens per block decode ---------------------------
# `*_row_dots` multiplies one weight row (every block) by n consecutive tokens: each block's
# weights are decoded in registers once (IQ2_XXS's grid loads, the K-quants' scale unpacking) and
# meet the n tokens' int8 codes, and the per-block float steps run in registers, in the order of
# the module docstring. Token j's integers and float steps are the same whatever the group size,
# so a result is the same however the tokens are grouped (decode = one-token prefill, chunk
# invariance). `*_pair_dots` does the same for two rows at once (up to PAIRED_TOKENS tokens),
# each row's lanes taking the same steps as alone.
#   row_dots(raw, ro, rs, nb, grid, xq, xo, stride, xd, xdo, bsums, bo, bstride, res, n):
#     the row's blocks at raw[ro:], nb of them (a pair's second row at raw[ro + rs:]; rs unused
#     by one row); token j's codes at xq[xo + j * stride] (block b at + 256 b), its block
#     scales at xd[xdo + j * nb + b], its 16-element sums at bsums[bo + j * bstride + 16 b]
#     (K-quants); res[8 r + j] = row r's result for token j (IQ2_XXS: before the final
#     * 0.125). grid: the IQ2_XXS table (unused by the K-quants).

_ZERO16 = ir.Constant(vec(I32, 16), [0] * 16)


def _lane_scales(builder, sc16, first: int, second: int, vbmi: bool):
    """The scales of a 64-weight run whose first 32 weights have scale sc16[first] and the last 32
    sc16[second] (sc16 <8 x i16>), laid out for _scaled_dot: per 16-bit pair (vbmi) or per 4-way
    lane."""
    if vbmi:
        return shuffle(builder, sc16, sc16, [first if lane < 16 else second for lane in range(32)])
    sc = builder.zext(sc16, vec(I32, sc16.type.count))
    return shuffle(builder, sc, sc, [first if lane < 8 else second for lane in range(16)])


def _scaled_dot(builder, w64, x64, scales, vbmi: bool):
    """<16 x i32>: lane l = scale * sum over i < 4 of u8 w64[4l+i] * s8 x64[4l+i] (scales from
    _lane_scales). With vbmi (the AVX-512 BW instructions) the u8 x s8 pairs are summed to 16 bits first (weights <= 43 here,
    so |pair| <= 2 * 43 * 127: no saturation) and the 16-bit pairs times their scales to 32
    bits: two single instructions, where the 4-way dot and a 32-bit multiply cost three."""
    if not vbmi:
        return builder.mul(dot4(builder, _ZERO16, w64, x64), scales)
    madd_ub = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I16, 32), [vec(I8, 64)] * 2),
                                             "llvm.x86.avx512.pmaddubs.w.512")
    madd_w = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I32, 16), [vec(I16, 32)] * 2),
                                            "llvm.x86.avx512.pmaddw.d.512")
    return builder.call(madd_w, [builder.call(madd_ub, [w64, x64]), scales])


def _iq2_xxs_block(context, builder, grid_type, grid, base, vbmi: bool):
    # The signs go onto the activations, so the products are unsigned magnitudes (<= 43) times
    # signed codes. Groups 2h and 2h + 1 share one 64-weight run, each scaled by its 2 s_g + 1.
    mags, negative = iq2_magnitudes_signs(context, builder, grid_type, grid, base, vbmi and IQ2_CODES is not None)
    words = load(builder, builder.gep(base, [ir.Constant(I64, 2)]), I32, 16)
    b = shuffle(builder, words, words, range(1, 16, 2))
    ls = builder.add(builder.shl(builder.lshr(b, const(I32, [28] * 8)), const(I32, [1] * 8)), const(I32, [1] * 8))
    ls = builder.trunc(ls, vec(I16, 8))
    quarters = [shuffle(builder, mags, mags, range(64 * h, 64 * h + 64)) for h in range(4)]
    scales = [_lane_scales(builder, ls, 2 * h, 2 * h + 1, vbmi) for h in range(4)]
    return quarters, negative, scales


def _iq2_xxs_token(builder, blk, px, vbmi: bool):
    quarters, negative, scales = blk
    x = load(builder, px, I8, 256)
    xs = builder.select(negative, builder.sub(const(I8, [0] * 256), x), x)
    acc = None
    for h in range(4):
        part = _scaled_dot(builder, quarters[h], shuffle(builder, xs, xs, range(64 * h, 64 * h + 64)), scales[h], vbmi)
        acc = part if acc is None else builder.add(acc, part)
    return acc


# Byte i of the Q2_K product table: code (i & 3) times scale (i >> 2), every pair of a 2-bit code
# and a 4-bit scale (<= 45: a byte).
_Q2_K_PRODUCTS = [(i & 3) * (i >> 2) for i in range(64)]


def _q2_k_block(builder, base, vbmi: bool):
    # code * scale (<= 45) is an unsigned byte, so the 4-way u8 x s8 dot applies; the mins are
    # the scale bytes' high nibbles.
    sbytes = load(builder, base, I8, 16)
    scales = builder.and_(sbytes, const(I8, [15] * 16))
    if vbmi:  # each product looked up by one byte permute (x86 has no byte multiply: LLVM's
        # mul widens to 16 bits, multiplies and packs back; measured on one core, the lookup
        # takes a tenth off a block's time)
        scales = builder.shl(scales, const(I8, [2] * 16))
        table = const(I8, _Q2_K_PRODUCTS)
        lookup = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 64), [vec(I8, 64)] * 2),
                                                "llvm.x86.avx512.permvar.qi.512")
    mins = builder.zext(builder.lshr(sbytes, const(I8, [4] * 16)), vec(I32, 16))
    qs = load(builder, builder.gep(base, [ir.Constant(I64, 16)]), I8, 64)
    weights = []
    # Byte l of half h (qs[32h + l]) holds weights 128h + 32s + l at bit shift 2s, l < 32; the
    # weight's sub-block is 8h + 2s + (l >= 16). Per shift s, 64 weights: 32 at input 32s.. (h = 0),
    # 32 at 128 + 32s.. (h = 1).
    for s in range(4):
        codes = builder.and_(builder.lshr(qs, const(I8, [2 * s] * 64)), const(I8, [3] * 64))
        sc = shuffle(builder, scales, scales, [(p // 32) * 8 + 2 * s + (p % 32 >= 16) for p in range(64)])
        weights.append(builder.call(lookup, [table, builder.or_(codes, sc)]) if vbmi else builder.mul(codes, sc))
    return weights, mins


def _q2_k_token(builder, blk, px, bsums):
    weights, mins = blk
    acc = _ZERO16
    for s in range(4):
        lo = load(builder, builder.gep(px, [ir.Constant(I64, 32 * s)]), I8, 32)
        hi = load(builder, builder.gep(px, [ir.Constant(I64, 128 + 32 * s)]), I8, 32)
        acc = dot4(builder, acc, weights[s], shuffle(builder, lo, hi, range(64)))
    return acc, builder.mul(mins, bsums)


def _q4_k_block(builder, base, vbmi: bool, scales_mins, place: int):
    # Chunk c's low and high nibbles (sub-blocks 2c and 2c + 1, inputs 64c..64c+63) meet 64
    # contiguous codes in one scaled dot, the low sub-block's 32 weights scaled by its scale and
    # the high one's by its own. scales_mins: qir.q4_k_scales_mins' pair, this block at `place`.
    sc, mn = scales_mins
    at = 8 * place
    mins = builder.zext(shuffle(builder, mn, mn, [at + k // 2 for k in range(16)]), vec(I32, 16))
    codes, scales = [], []
    for c in range(4):
        # The chunk's 32 bytes twice in one vector (a broadcast load), the second copy's 16-bit
        # words shifted down 4 bits and every byte masked to its low nibble: the low nibbles,
        # then the high ones (a word's shift brings its high byte's low bits into the low
        # byte's top, which the mask drops). Three instructions where a byte shift (no such
        # x86 instruction), a mask and a concatenation took five.
        v = load(builder, builder.gep(base, [ir.Constant(I64, 16 + 32 * c)]), I8, 32)
        words = builder.bitcast(shuffle(builder, v, v, list(range(32)) * 2), vec(I16, 32))
        shifted = builder.lshr(words, const(I16, [0] * 16 + [4] * 16))
        codes.append(builder.and_(builder.bitcast(shifted, vec(I8, 64)), const(I8, [15] * 64)))
        scales.append(_lane_scales(builder, sc, at + 2 * c, at + 2 * c + 1, vbmi))
    return codes, scales, mins


def _q4_k_token(builder, blk, px, bsums, vbmi: bool):
    codes, scales, mins = blk
    acc = None
    for c in range(4):
        x = load(builder, builder.gep(px, [ir.Constant(I64, 64 * c)]), I8, 64)
        part = _scaled_dot(builder, codes[c], x, scales[c], vbmi)
        acc = part if acc is None else builder.add(acc, part)
    return acc, builder.mul(mins, bsums)


_BLOCK_BYTES = {16: 66, 10: 84, 12: 144}  # IQ2_XXS, Q2_K, Q4_K
_SCALE_AT = {16: (0, None), 10: (80, 82), 12: (0, 2)}  # the block's f16 d (and dmin)


ROW_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8)  # the token counts a row_dots call takes (an IR body for each)
PAIRED_TOKENS = 4  # up to this many tokens, rows go two at a time (row_dots_with's nrows = 2)
PREFETCH_AHEAD = 1024  # bytes: a row dots pass with tokens asks for its rows' bytes this far on


def _lane_sums(builder, vecs):
    """<P x i32> whose lane j is the sum of the 16 lanes of vecs[j] (P: len(vecs) rounded up to a
    power of two, at most 16): qir.unit_sums' tree, or LLVM's own reduction of each of one or two
    vectors (faster than the tree there). Integer sums: exact."""
    P = 1
    while P < len(vecs):
        P *= 2
    assert P <= 16
    if P <= 2:  # one or two vectors: LLVM's own reduction of each is faster than the tree
        out = ir.Constant(vec(I32, P), None)
        for j, v in enumerate(vecs):
            out = builder.insert_element(out, reduce(builder, v, 16), ir.Constant(I32, j))
        return out
    return unit_sums(builder, vecs, 16)


def _blocks_per_pass(kind: int, tokens: int, nrows: int = 1) -> int:
    """Blocks whose integer sums share one _lane_sums tree: as many as 16 vectors hold (one per
    row and token for IQ2_XXS, two for the K-quants), at most 8. Few tokens per row (a decoded
    token meets each expert alone) otherwise spend a third of a block's instructions reducing
    vectors."""
    per_block = nrows * tokens * (1 if kind == 16 else 2)
    return max(1, min(8, 16 // per_block))


def _row_dots_body(context, builder, sig, args, kind: int, tokens: int, vbmi: bool, nrows: int) -> None:
    """`nrows` rows (1 or 2, the second rs bytes after the first; every block) times `tokens`
    tokens, results to res[8 r + j]. Blocks go in passes of _blocks_per_pass (the rest one at a
    time): per pass, the integer sums of its blocks, rows and tokens come out of one _lane_sums
    tree and their float terms run side by side, one vector lane per (block, row, token), each
    lane's steps the scalar formula's; the terms are then added to the (row, token)
    accumulators block after block, in the blocks' order, as one block a pass would. Two rows
    share the tokens' loads, the tree and the float steps; a row's lanes take the same steps
    either way, so its bits are the same alone or paired."""
    raw_, ro_, rs_, nb_, grid_, xq_, xo_, stride_, xd_, xdo_, bs_, bo_, bstride_, res_, _ = args
    n, R = tokens, nrows
    rows = [ptr(context, builder, sig.args[0], raw_, builder.add(ro_, builder.mul(ir.Constant(I64, r), rs_)))
            for r in range(R)]
    acc = cgutils.alloca_once_value(builder, ir.Constant(vec(F32, R * n), [0.0] * (R * n)))
    size = _BLOCK_BYTES[kind]
    d_at, dmin_at = _SCALE_AT[kind]

    def spread(values):  # <len(values) * n x f32>: each value repeated over its n token lanes
        out = ir.Constant(vec(F32, len(values) * n), None)
        for g, v in enumerate(values):
            for j in range(n):
                out = builder.insert_element(out, v, ir.Constant(I32, g * n + j))
        return out

    def first(v, k, count):  # lanes k .. k + count of an integer vector, as float
        return builder.sitofp(shuffle(builder, v, v, range(k, k + count)), vec(F32, count))

    def blocks(indices) -> None:
        # lane (g R + r) n + j: block g of the pass, row r, token j
        m = len(indices) * R * n
        ds, dmins, xv = [], [], ir.Constant(vec(F32, m), None)
        isums, summs = [], []
        bases = [[builder.gep(rows[r], [builder.mul(b, ir.Constant(I64, size))]) for r in range(R)] for b in indices]
        q4_scales = []  # Q4_K, per (block, row): (the scales and mins of it and its neighbour, its place there)
        if kind == 12:
            flat = [base for row_bases in bases for base in row_bases]
            for i in range(0, len(flat), 2):
                both = q4_k_scales_mins(builder, flat[i:i + 2])
                q4_scales += [(both, k) for k in range(len(flat[i:i + 2]))]
        for g, b in enumerate(indices):
            xds, pxs, bsvs = [], [], []  # token j's: one load each, shared by the rows
            for j in range(n):
                xoff = builder.add(builder.add(xo_, builder.mul(ir.Constant(I64, j), stride_)),
                                   builder.mul(b, ir.Constant(I64, 256)))
                pxs.append(ptr(context, builder, sig.args[5], xq_, xoff))
                xdoff = builder.add(builder.add(xdo_, builder.mul(ir.Constant(I64, j), nb_)), b)
                xds.append(builder.load(ptr(context, builder, sig.args[8], xd_, xdoff)))
                if kind != 16:
                    boff = builder.add(builder.add(bo_, builder.mul(ir.Constant(I64, j), bstride_)),
                                       builder.mul(b, ir.Constant(I64, 16)))
                    bsvs.append(load(builder, ptr(context, builder, sig.args[10], bs_, boff), I32, 16))
            for r, base in enumerate(bases[g]):
                ds.append(half_at(builder, base, d_at))
                if dmin_at is not None:
                    dmins.append(half_at(builder, base, dmin_at))
                if kind == 16:
                    blk = _iq2_xxs_block(context, builder, sig.args[4], grid_, base, vbmi)
                elif kind == 10:
                    blk = _q2_k_block(builder, base, vbmi)
                else:
                    blk = _q4_k_block(builder, base, vbmi, *q4_scales[g * R + r])
                for j in range(n):
                    xv = builder.insert_element(xv, xds[j], ir.Constant(I32, (g * R + r) * n + j))
                    if kind == 16:
                        isums.append(_iq2_xxs_token(builder, blk, pxs[j], vbmi))
                        continue
                    isum, summ = (_q2_k_token(builder, blk, pxs[j], bsvs[j]) if kind == 10
                                  else _q4_k_token(builder, blk, pxs[j], bsvs[j], vbmi))
                    isums.append(isum)
                    summs.append(summ)
        sums = _lane_sums(builder, isums + summs)
        if kind == 16:  # term = (d * xd) * float(isum)
            terms = builder.fmul(builder.fmul(spread(ds), xv), first(sums, 0, m))
        else:  # term = (xd * d) * float(isum) - (xd * dmin) * float(summs)
            terms = builder.fsub(builder.fmul(builder.fmul(xv, spread(ds)), first(sums, 0, m)),
                                 builder.fmul(builder.fmul(xv, spread(dmins)), first(sums, m, m)))
        total = builder.load(acc)
        for g in range(len(indices)):
            total = builder.fadd(total, shuffle(builder, terms, terms, range(g * R * n, (g + 1) * R * n)))
        builder.store(total, acc)

    per_pass = _blocks_per_pass(kind, n, R)
    passes = builder.sdiv(nb_, ir.Constant(I64, per_pass))
    with cgutils.for_range(builder, passes) as loop:
        first_block = builder.mul(loop.index, ir.Constant(I64, per_pass))
        for r in range(R if n >= 2 else 0):  # (one token streams at the memory's rate as it is)
            at = builder.add(builder.mul(first_block, ir.Constant(I64, size)), ir.Constant(I64, PREFETCH_AHEAD))
            prefetch_span(builder, rows[r], at, per_pass * size)
        blocks([builder.add(first_block, ir.Constant(I64, g)) for g in range(per_pass)])
    if per_pass > 1:
        with cgutils.for_range_slice(builder, builder.mul(passes, ir.Constant(I64, per_pass)), nb_,
                                     ir.Constant(I64, 1)) as (b, _):
            blocks([b])
    total = builder.load(acc)
    for r in range(R):
        for j in range(n):
            builder.store(builder.extract_element(total, ir.Constant(I32, r * n + j)),
                          ptr(context, builder, sig.args[13], res_, ir.Constant(I64, 8 * r + j)))


def row_dots_with(kind: int, vbmi: bool, nrows: int = 1):
    """The row-dot intrinsic of GGML type `kind` (IQ2_XXS 16, Q2_K 10, Q4_K 12) for `nrows` rows
    (1, or 2 with up to PAIRED_TOKENS tokens; their own intrinsics, as in fp4kernels), with AVX-512 BW
    and VBMI instructions (vbmi: Q2_K's products looked up by a byte permute, IQ2_XXS's and
    Q4_K's scaled sums by 16-bit multiply-adds) or in portable IR: the module's own use the
    host's best; the tests build both and compare them."""
    counts = ROW_GROUPS if nrows == 1 else [n for n in ROW_GROUPS if n <= PAIRED_TOKENS]

    @intrinsic
    def row_dots(typingctx, raw, ro, rs, nb, grid, xq, xo, stride, xd, xdo, bsums, bo, bstride, res, count):
        # One IR body per token count, chosen by a switch on `count` (another count does
        # nothing: the caller passes only these).
        def codegen(context, builder, sig, args):
            count_cases(builder, args[14], counts,
                        lambda n: _row_dots_body(context, builder, sig, args, kind, n, vbmi, nrows), "row_dots")
            return context.get_dummy_value()

        return types.void(raw, ro, rs, nb, grid, xq, xo, stride, xd, xdo, bsums, bo, bstride, res, count), codegen

    return row_dots


VBMI = bool(FEATURES.get("avx512vbmi")) and bool(FEATURES.get("avx512bw"))


# ---- rows times 16 tokens per vector (IQ2_XXS, Q2_K, Q4_K) -------------------------------------
# With many tokens per row, one vector lane per token: the activations of 16 tokens are
# interleaved once per product (lanes_interleave: for each block and 4-code quad k, 16 tokens x
# 4 codes + 128 as u8, 64 bytes), each row's block is decoded once to int8 weights in memory, and
# each 4-weight quad, broadcast, meets the 16 tokens' quad in one 4-way u8 x s8 dot (vpdpbusd):
# 4 dots per token and block, where the lane-per-weight row_dots need a multiply-add pair per 64
# weights plus a horizontal sum (and IQ2_XXS's sign selects). The integers are the same as
# row_dots', so the float steps, and the bits, are too:
#   IQ2_XXS: w = the signed grid value; isum = sum_g ls_g sum_i (x_i + 128) w_i - 128 C,
#            C = sum_g ls_g sum_i w_i (groups g of 32, ls_g = 2 s_g + 1)
#   Q2_K:    w = code * scale (<= 45, a byte); isum = sum_i (x_i + 128) w_i - 128 sum_i w_i, and
#            summs = sum_j m_j bsums_j by 16-bit multiply-adds of the interleaved bsums (16
#            tokens x a pair of sub-blocks per vector) with the row's pair of mins.
#   Q4_K:    w = code (< 16); isum as IQ2_XXS's with the 6-bit scales of its 8 groups, and
#            summs = sum_j m_j S_j by the same multiply-adds, S_j = bsums_2j + bsums_2j+1 (the
#            sum of group j's 32 inputs, interleaved as such: half the multiply-adds and loads
#            of Q2_K's form with m_j twice: 9 % off the kernel's time at 64 tokens).
# The partial sums fit 32 bits: at most 8 groups x 63 x 32 x 255 x 15 (Q4_K).
#   rows16(raw, ro, rstride, nb, grid, xi, xdi, bsi, nv, res, wrow, info):
#     `rows` rows at raw[ro + i * rstride:]; token vector v's quads at byte ((v * nb + b) * 64
#     + k) * 64 of xi, its block scales at xdi[(v * nb + b) * 16], its input sums (K-quants)
#     at bsi[((v * nb + b) * P + p) * 32] (P pairs: 8 of 16 inputs' sums for Q2_K, 4 of 32 for
#     Q4_K); res[i * 16 nv + 16 v + j] = row i's result for token 16 v + j (IQ2_XXS: before
#     the final * 0.125); wrow, info: scratch (rows * nb * 256 int8, rows * nb * 32 int32).


def _rows16(kind: int, rows: int):
    @intrinsic
    def rows16(typingctx, raw, ro, rstride, nb, grid, xi, xdi, bsi, nv, res, wrow, info):
        def codegen(context, builder, sig, args):
            _rows16_body(context, builder, sig, args, kind, rows)
            return context.get_dummy_value()

        return types.void(raw, ro, rstride, nb, grid, xi, xdi, bsi, nv, res, wrow, info), codegen

    return rows16


def _rows16_decode(context, builder, sig, grid_, base, pw, kind: int):
    """Block at `base` -> its int8 weights stored at pw (inputs in order) and its info vector
    <32 x i32>: lanes 0-7 the group scales (IQ2_XXS: 2 s_g + 1; Q4_K: the 6-bit scales), 8: 128 C,
    9, 10: d and dmin (the f16 scales widened to f32, as bits), from 16 the K-quants' mins as
    pairs of 16-bit integers, sub-blocks 2p and 2p + 1 (Q2_K: 16-23, sub-blocks of 16 inputs;
    Q4_K: 16-19, of 32)."""
    ones = const(I8, [1] * 64)

    def i64(v):
        return ir.Constant(I64, v)

    def group_c(w, ls):  # C = sum_g ls_g * (sum of group g's weights), groups of 32
        c = _ZERO16
        for h in range(4):
            part = dot4(builder, _ZERO16, ones, shuffle(builder, w, w, range(64 * h, 64 * h + 64)))
            lane_ls = shuffle(builder, ls, ls, [2 * h + (lane >= 8) for lane in range(16)])
            c = builder.add(c, builder.mul(part, lane_ls))
        return c

    zero8 = const(I32, [0] * 8)
    if kind == 16:
        mags, negative = iq2_magnitudes_signs(context, builder, sig.args[4], grid_, base, VBMI and IQ2_CODES is not None)
        w = builder.select(negative, builder.sub(const(I8, [0] * 256), mags), mags)
        store(builder, w, pw, I8, 256)
        words = load(builder, builder.gep(base, [i64(2)]), I32, 16)
        odd = shuffle(builder, words, words, range(1, 16, 2))
        scales8 = builder.add(builder.shl(builder.lshr(odd, const(I32, [28] * 8)), const(I32, [1] * 8)),
                              const(I32, [1] * 8))
        c = group_c(w, scales8)
        pairs, halves = zero8, [half_at(builder, base, 0)]
    elif kind == 10:
        weights, mins = _q2_k_block(builder, base, VBMI)
        c = _ZERO16
        for s in range(4):  # weights[s]: inputs 32s.. then 128 + 32s..
            store(builder, shuffle(builder, weights[s], weights[s], range(32)), builder.gep(pw, [i64(32 * s)]), I8, 32)
            store(builder, shuffle(builder, weights[s], weights[s], range(32, 64)),
                   builder.gep(pw, [i64(128 + 32 * s)]), I8, 32)
            c = dot4(builder, c, ones, weights[s])
        scales8 = zero8
        pairs = builder.bitcast(builder.trunc(mins, vec(I16, 16)), vec(I32, 8))
        halves = [half_at(builder, base, 80), half_at(builder, base, 82)]
    else:
        sc16, mn16 = q4_k_scales_mins(builder, [base])
        codes = []
        for ch in range(4):  # low nibbles: inputs 64 ch.., high: 64 ch + 32..
            v = load(builder, builder.gep(base, [i64(16 + 32 * ch)]), I8, 32)
            codes.append(shuffle(builder, builder.and_(v, const(I8, [15] * 32)), builder.lshr(v, const(I8, [4] * 32)),
                                  range(64)))
        w = shuffle(builder, shuffle(builder, codes[0], codes[1], range(128)),
                     shuffle(builder, codes[2], codes[3], range(128)), range(256))
        store(builder, w, pw, I8, 256)
        scales8 = builder.zext(sc16, vec(I32, 8))
        c = group_c(w, scales8)
        pairs = builder.bitcast(shuffle(builder, mn16, const(I16, [0] * 8), range(16)), vec(I32, 8))
        halves = [half_at(builder, base, 0), half_at(builder, base, 2)]
    corr = builder.mul(reduce(builder, c, 16), ir.Constant(I32, 128))
    info = shuffle(builder, scales8, zero8, list(range(8)) + [8] * 8)
    info = builder.insert_element(info, corr, ir.Constant(I32, 8))
    for k, f in enumerate(halves):
        info = builder.insert_element(info, builder.bitcast(f, I32), ir.Constant(I32, 9 + k))
    return shuffle(builder, info, shuffle(builder, pairs, zero8, range(16)), range(32))


def _rows16_body(context, builder, sig, args, kind: int, rows: int) -> None:
    raw_, ro_, rstride_, nb_, grid_, xi_, xdi_, bsi_, nv_, res_, wrow_, info_ = args
    size = _BLOCK_BYTES[kind]

    def i64(v):
        return ir.Constant(I64, v)

    def lane(v, k):
        return builder.extract_element(v, ir.Constant(I32, k))

    def as_f32(v):
        return builder.bitcast(v, F32)

    pres = ptr(context, builder, sig.args[9], res_, i64(0))
    with cgutils.for_range(builder, builder.mul(nv_, i64(16 * rows))) as loop:
        builder.store(ir.Constant(F32, 0.0), builder.gep(pres, [loop.index]))
    pw = builder.bitcast(ptr(context, builder, sig.args[10], wrow_, i64(0)), I8.as_pointer())
    pinfo = builder.bitcast(ptr(context, builder, sig.args[11], info_, i64(0)), I32.as_pointer())
    # First the rows decoded to wrow (block b of row i at slot b * rows + i, 256 bytes) and info,
    # then the products, reading each quad back from memory: in one pass LLVM would forward the
    # stored vector to the quad loads and broadcast each quad with two shuffles instead of
    # folding a memory broadcast into its dot instruction.
    for i in range(rows):
        row = ptr(context, builder, sig.args[0], raw_, builder.add(ro_, builder.mul(i64(i), rstride_)))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            slot = builder.add(builder.mul(b, i64(rows)), i64(i))
            info = _rows16_decode(context, builder, sig, grid_, builder.gep(row, [builder.mul(b, i64(size))]),
                                  builder.gep(pw, [builder.mul(slot, i64(256))]), kind)
            store(builder, info, builder.gep(pinfo, [builder.mul(slot, i64(32))]), I32, 32)
    pxi = builder.bitcast(ptr(context, builder, sig.args[5], xi_, i64(0)), I8.as_pointer())
    pbs = builder.bitcast(ptr(context, builder, sig.args[7], bsi_, i64(0)), I16.as_pointer())
    praw = ptr(context, builder, sig.args[0], raw_, i64(0))
    with cgutils.for_range(builder, nb_) as loop:
        b = loop.index
        # The next pass's rows (ro + rows * rstride on), block b, asked for now: a pass reads its
        # rows in a burst, then computes, and the hardware's prefetch alone left Q4_K's 9-23 %
        # slower with the rows in DRAM than in L3 at 8-48 tokens (the row dots': 17-35 % at 2-8).
        for i in range(rows):
            at = builder.add(builder.add(ro_, builder.mul(i64(rows + i), rstride_)), builder.mul(b, i64(size)))
            prefetch_span(builder, praw, at, size)
        infos, wbs = [], []
        for i in range(rows):
            slot = builder.add(builder.mul(b, i64(rows)), i64(i))
            infos.append(load(builder, builder.gep(pinfo, [builder.mul(slot, i64(32))]), I32, 32))
            wbs.append(builder.gep(pw, [builder.mul(slot, i64(256))]))
        # One body per count of token vectors (1-4): each quad of activations meets every row's
        # broadcast quad in turn, with 8 partial sums per row and vector in registers.
        done = builder.append_basic_block("vectors_done")
        switch = builder.switch(nv_, done)
        for n in (1, 2, 3, 4):
            case = builder.append_basic_block(f"vectors_{n}")
            switch.add_case(i64(n), case)
            builder.position_at_end(case)
            vbs = [builder.add(builder.mul(i64(v), nb_), b) for v in range(n)]
            pxs = [builder.gep(pxi, [builder.mul(vb, i64(4096))]) for vb in vbs]
            isums = [[builder.sub(_ZERO16, splat(builder, lane(infos[i], 8), I32, 16))] * n for i in range(rows)]
            for g in range(8):
                gsums = [[_ZERO16] * n for i in range(rows)]
                for q in range(8):
                    k = 8 * g + q
                    ws = []
                    for i in range(rows):
                        wq = builder.load(builder.bitcast(builder.gep(wbs[i], [i64(4 * k)]), I32.as_pointer()), align=1)
                        ws.append(builder.bitcast(splat(builder, wq, I32, 16), vec(I8, 64)))
                    for v in range(n):
                        xv = load(builder, builder.gep(pxs[v], [i64(64 * k)]), I8, 64)
                        for i in range(rows):
                            gsums[i][v] = dot4(builder, gsums[i][v], xv, ws[i])
                for i in range(rows):
                    if kind != 10:  # group g's sums times its scale
                        lsg = splat(builder, lane(infos[i], g), I32, 16)
                        isums[i] = [builder.add(isums[i][v], builder.mul(gsums[i][v], lsg)) for v in range(n)]
                    else:  # the scales are in the weights
                        isums[i] = [builder.add(isums[i][v], gsums[i][v]) for v in range(n)]
            summs = [[None] * n for i in range(rows)]
            if kind != 16:
                P = _sum_pairs(kind)
                for v in range(n):
                    for p in range(P):
                        bsv = load(builder, builder.gep(pbs, [builder.add(builder.mul(vbs[v], i64(32 * P)), i64(32 * p))]),
                                    I16, 32)
                        for i in range(rows):
                            mp = builder.bitcast(splat(builder, lane(infos[i], 16 + p), I32, 16), vec(I16, 32))
                            part = madd16(builder, bsv, mp)
                            summs[i][v] = part if summs[i][v] is None else builder.add(summs[i][v], part)
            for i in range(rows):
                dv = splat(builder, as_f32(lane(infos[i], 9)), F32, 16)
                for v in range(n):
                    xdv = load(builder, ptr(context, builder, sig.args[6], xdi_, builder.mul(vbs[v], i64(16))), F32, 16)
                    if kind == 16:  # acc += (d * xd) * float(isum)
                        term = builder.fmul(builder.fmul(dv, xdv), builder.sitofp(isums[i][v], vec(F32, 16)))
                    else:  # acc += (xd * d) * float(isum) - (xd * dmin) * float(summs)
                        dminv = splat(builder, as_f32(lane(infos[i], 10)), F32, 16)
                        term = builder.fsub(builder.fmul(builder.fmul(xdv, dv), builder.sitofp(isums[i][v], vec(F32, 16))),
                                            builder.fmul(builder.fmul(xdv, dminv), builder.sitofp(summs[i][v], vec(F32, 16))))
                    pacc = builder.gep(pres, [builder.add(builder.mul(i64(i), builder.mul(nv_, i64(16))), i64(16 * v))])
                    store(builder, builder.fadd(load(builder, pacc, F32, 16), term), pacc, F32, 16)
            builder.branch(done)
        builder.position_at_end(done)


iq2_xxs_rows16_1, iq2_xxs_rows16_2 = _rows16(16, 1), _rows16(16, 2)
q2_k_rows16_1, q2_k_rows16_2 = _rows16(10, 1), _rows16(10, 2)
q4_k_rows16_1, q4_k_rows16_2 = _rows16(12, 1), _rows16(12, 2)

iq2_xxs_row_dots, q2_k_row_dots, q4_k_row_dots = (row_dots_with(kind, VBMI) for kind in (16, 10, 12))
iq2_xxs_pair_dots, q2_k_pair_dots, q4_k_pair_dots = (row_dots_with(kind, VBMI, 2) for kind in (16, 10, 12))


_jit = njit(nogil=True, cache=True)


# ---- products ---------------------------------------------------------------------------------
# Each kernel walks its rows one at a time: the row's blocks are decoded in registers once per
# group of tokens and meet the activations of tokens t0..t1, so a batch reads each weight once.
# Offsets passed to the intrinsics above are flat element offsets into C-contiguous arrays.

Q2_K, Q4_K, IQ2_XXS = 10, 12, 16  # GGML type ids (quant.py)
# Rows are multiplied straight from their blocks (a copy decoded once to 16-bit weights cost more
# per token at every count measured: 7.7-8.9 ns per IQ2_XXS block and token against 5.4-6.8).


@_jit
def _sum_pairs(kind):
    """Pairs of input sums per block in the rows16 kernels' bsi: Q4_K 4, of its 32-input
    sub-blocks; Q2_K 8, of its bsums (16 inputs each)."""
    return 4 if kind == Q4_K else 8


# From this many tokens of one matrix (and where the host has AVX-512 VNNI and BW) IQ2_XXS, Q2_K
# and Q4_K rows meet their tokens 16 to a vector (the rows16 kernels); fewer take the
# lane-per-weight row_dots. Measured on one core, ns per block and token, row_dots -> rows16:
# IQ2_XXS 8 tokens 4.7-4.8 either way, 9: 6.0 -> 4.4, 16: 4.8 -> 2.5, 64: 4.9 -> 1.8; Q2_K and
# Q4_K 7: 4.1-4.4 -> 5.0-5.1, 8: 4.7-4.8 -> 4.2-4.5, 16: 4.2-4.5 -> 2.2-2.5, 64: 4.2-4.5 -> 1.8-2.1.
LANES_MIN = 8
LANES = VNNI
TOKEN_TILE = 64  # tokens per pass over the rows of the rows16 kernels (4 vectors of 16)


@_jit
def lanes_interleave(xq32, xd, bsums, t0, t1, xi, xdi, bsi):
    """Tokens t0..t1 (at most 64) of xq32 (the int8 codes viewed as uint32 quads, [n, cols // 4]),
    xd [n, nb] and bsums [n, cols // 16] -> xi uint32 [nv, nb, 64, 16] (quad k of block b of
    token 16 v + j, each code + 128), xdi f32 [nv, nb, 16] and bsi int16 [nv, nb, P, 16, 2]
    (the block's input sums 2p, 2p + 1 of token 16 v + j: of 16 inputs, its bsums, for P = 8;
    of 32, bsums summed in pairs, for P = 4); lanes past t1 are zeros (code + 128 = 128,
    scale 0, sums 0)."""
    nv, nb, P = xi.shape[0], xi.shape[1], bsi.shape[2]
    per = 8 // P  # bsums in one sum
    for v in range(nv):
        for b in range(nb):
            for j in range(16):
                t = t0 + 16 * v + j
                if t < t1:
                    xdi[v, b, j] = xd[t, b]
                    for k in range(64):
                        xi[v, b, k, j] = xq32[t, 64 * b + k] ^ np.uint32(0x80808080)
                    for p in range(P):
                        for e in range(2):
                            total = 0
                            for u in range(per * (2 * p + e), per * (2 * p + e + 1)):
                                total += bsums[t, 16 * b + u]
                            bsi[v, b, p, j, e] = np.int16(total)
                else:
                    xdi[v, b, j] = 0.0
                    for k in range(64):
                        xi[v, b, k, j] = np.uint32(0x80808080)
                    for p in range(P):
                        for e in range(2):
                            bsi[v, b, p, j, e] = 0


@_jit
def _lanes_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid):
    nb = xq.shape[1] // 256
    xq32 = xq.view(np.uint32)
    res = np.empty(2 * TOKEN_TILE, np.float32)
    wrow = np.empty(2 * nb * 256, np.int8)
    info = np.empty(2 * nb * 32, np.int32)
    rs = raw.shape[1]
    scale = np.float32(0.125) if kind == IQ2_XXS else np.float32(1.0)
    for ts in range(t0, t1, TOKEN_TILE):
        n = min(TOKEN_TILE, t1 - ts)
        nv = (n + 15) // 16
        xi = np.empty((nv, nb, 64, 16), np.uint32)
        xdi = np.empty((nv, nb, 16), np.float32)
        bsi = np.empty((nv, nb, _sum_pairs(kind), 16, 2), np.int16)
        lanes_interleave(xq32, xd, bsums, ts, ts + n, xi, xdi, bsi)
        for r in range(r0, r1, 2):  # two rows per pass: each activation load meets both
            pair = r + 1 < r1
            if kind == IQ2_XXS:
                if pair:
                    iq2_xxs_rows16_2(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
                else:
                    iq2_xxs_rows16_1(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
            elif kind == Q2_K:
                if pair:
                    q2_k_rows16_2(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
                else:
                    q2_k_rows16_1(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
            elif pair:
                q4_k_rows16_2(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
            else:
                q4_k_rows16_1(raw, r * rs, rs, nb, grid, xi, xdi, bsi, nv, res, wrow, info)
            for j in range(n):  # (times 1.0 for the K-quants: exact)
                out[ts + j, r] = scale * res[j]
                if pair:
                    out[ts + j, r + 1] = scale * res[16 * nv + j]


@_jit
def _fused_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid):
    # Rows straight from their blocks (no decoded copy): from LANES_MIN tokens 16 to a vector
    # (_lanes_rows), up to PAIRED_TOKENS two rows at a time (_paired_rows), else one row and up
    # to eight tokens at a time (the *_row_dots intrinsics: a block decoded in registers once
    # per row and token group).
    if LANES and t1 - t0 >= LANES_MIN:
        _lanes_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid)
        return
    # (IQ2_XXS alone with one token: its grid lookups are the row's own, and pairing measured
    # 3 % slower there, 3-10 % faster with two to four tokens)
    if t1 - t0 <= PAIRED_TOKENS and not (kind == IQ2_XXS and t1 - t0 == 1):
        _paired_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid)
        return
    _single_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid)


@_jit
def _single_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid):
    cols = xq.shape[1]
    nb = cols // 256
    nbs = bsums.shape[1]
    res = np.empty(8, np.float32)
    for r in range(r0, r1):
        ro = r * raw.shape[1]
        t = t0
        while t < t1:
            cnt = min(8, t1 - t)
            xo, xdo, bo = t * cols, t * nb, t * nbs
            if kind == Q4_K:
                q4_k_row_dots(raw, ro, 0, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
            elif kind == Q2_K:
                q2_k_row_dots(raw, ro, 0, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
            else:
                iq2_xxs_row_dots(raw, ro, 0, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
            for j in range(cnt):
                out[t + j, r] = np.float32(0.125) * res[j] if kind == IQ2_XXS else res[j]
            t += cnt


@_jit
def _paired_rows(kind, raw, xq, xd, bsums, out, r0, r1, t0, t1, grid):
    # Row i of the range's first half with row i of its second half: each half read front to
    # back as one stream (fp4kernels._paired_rows: adjacent rows read side by side are a stream
    # in pieces of a row, which the hardware prefetch follows poorly).
    cols = xq.shape[1]
    nb = cols // 256
    nbs = bsums.shape[1]
    half = (r1 - r0) // 2
    rs = half * raw.shape[1]
    res = np.empty(16, np.float32)
    cnt = t1 - t0
    xo, xdo, bo = t0 * cols, t0 * nb, t0 * nbs
    scale = np.float32(0.125) if kind == IQ2_XXS else np.float32(1.0)
    for r in range(r0, r0 + half):
        ro = r * raw.shape[1]
        if kind == Q4_K:
            q4_k_pair_dots(raw, ro, rs, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
        elif kind == Q2_K:
            q2_k_pair_dots(raw, ro, rs, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
        else:
            iq2_xxs_pair_dots(raw, ro, rs, nb, grid, xq, xo, cols, xd, xdo, bsums, bo, nbs, res, cnt)
        for j in range(cnt):
            out[t0 + j, r] = scale * res[j]  # (times 1.0 for the K-quants: exact)
            out[t0 + j, r + half] = scale * res[8 + j]
    if (r1 - r0) % 2:
        _single_rows(kind, raw, xq, xd, bsums, out, r1 - 1, r1, t0, t1, grid)


@_jit
def expert_rows(kind, w, aux, used, starts, xq, xd, xs, out, r0, r1, grid):
    """out[t, r] for rows r0..r1 of routed experts of GGML type `kind` (Q2_K, Q4_K or IQ2_XXS):
    expert used[i] takes the activation rows starts[i]..starts[i+1] (the call's (token, slot)
    pairs grouped by expert). w [n_experts, rows, ...]: the raw blocks (aux unused: the same
    signature as q8kernels'). Activations (q8kernels.quantize_q8_k's): xq int8, xd f32 scales,
    xs int32 bsums per 16. grid: the IQ2_XXS grid."""
    for i in range(used.shape[0]):
        e = used[i]
        t0, t1 = starts[i], starts[i + 1]
        _fused_rows(kind, w[e], xq, xd, xs, out, r0, r1, t0, t1, grid)


# ---- every core ---------------------------------------------------------------------------------
# A product's output rows (or attention's units) are split into contiguous ranges at `cuts`
# (cuts[p]..cuts[p + 1], qmatrix.row_cuts), one per thread of numba's own pool (prange). Its
# hand-off costs about a microsecond, where a Python thread pool's (a queue, a thread woken, the
# GIL passed back and forth) cost 60-100 µs per product: more than many of a decode step's ~700
# products take. A range's results never depend on the split (each row's code and order are the
# same whatever range it falls in).
_jit_split = njit(nogil=True, cache=True, parallel=True)


@_jit_split
def expert_rows_split(kind, ws, auxs, outs, used, starts, xq, xd, xs, cuts, grid):
    """expert_rows of each matrix ws[m] (into outs[m]: the same type and shape, the same inputs),
    rows cuts[p]..cuts[p + 1] on thread p. The one parallel entry for quantised products: a
    plain matrix is one expert (qmatrix.QuantMatrix), because each parallel wrapper costs numba
    about as much compile time as the kernels it calls (LLVM optimises them again inside it)."""
    for p in prange(cuts.shape[0] - 1):
        for m in range(len(ws)):
            expert_rows(kind, ws[m], auxs[m], used, starts, xq, xd, xs, outs[m], cuts[p], cuts[p + 1], grid)
