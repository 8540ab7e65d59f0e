"""numba kernels of the fast CPU kernel set for MXFP4 (ggml type 39: per 32 weights one E8M0 scale
byte e and 16 bytes of E2M1 codes), the native format of DeepSeek V4's routed experts.

Against Q8_0-style activations (q8kernels.quantize_q8_0: int8 codes, one f32 scale xd per 32
inputs; every |code| <= 127, so a code's negation is an int8 too). Per output (token t, row r),
from +0, in block order, one rounding per step, no fused multiply-add:
    acc += (dw * xd) * float(isum)                                         per block of 32
    dw   = 2^(e - 128)                    (ggml's E8M0 "half" scale: the codes' values doubled)
    isum = sum_i kv[q_i] * x_i            kv = 0 1 2 3 4 6 8 12 and their negatives (codes 8-15)
The integer sum is exact (|isum| <= 32 * 12 * 127), so its order is free; dw * xd is a power of
two times a float and rounds only where it leaves float32's normal range. The weights are the
file's, bit for bit (dw * kv[q] is quant._dequant_mxfp4's value): only the activations' 8-bit
rounding separates a product from the exact float32 one, as for the other fast kernels.

The same shape as qkernels.py: an LLVM IR intrinsic (building blocks from qir.py) multiplies
one row (or, with up to PAIRED_TOKENS tokens, two rows), every block, by 1 to 8 consecutive
tokens, each block pair decoded in registers once for the tokens; the magnitudes meet the
activations with the codes' signs put on the activations (u8 magnitudes times s8 codes: the
4-way dot, `vpdpbusd` on AVX-512 VNNI). The magnitudes come from a byte permute with AVX-512
VBMI, from compares and selects elsewhere (the same integers). From LANES_MIN tokens of one
matrix, where the host has AVX-512 VNNI, one or two rows meet up to 64 tokens 16 to a vector
instead (mxfp4_rows16_1/_2, as qkernels' rows16): the same integers and float steps, the same
bits. A row's result never depends on
the tokens it is grouped with, nor on the rows (paired or not) or threads around it: decode =
one-token prefill, chunk invariance and resume hold as for the other types.

Its own module, not qkernels.py: numba caches machine code per source file, so this kernel's
compile does not invalidate theirs.
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
    VNNI,
    const,
    count_cases,
    dot4,
    load,
    prefetch_span,
    ptr,
    shuffle,
    splat,
    store,
    unit_sums,
    vec,
)

# qir.py's SHA-256 (see qkernels.QIR_DIGEST): numba's cache of this file is kept while this file
# is unchanged, so a change to the IR it inlines must change this line.
QIR_DIGEST = "4d53f368174020334758d25edb4c1ddebf09185adacf1f497c8eb298ef648234"

BLOCK_BYTES = 17  # the scale byte, then 16 bytes of codes: weight i < 16 the low nibble of byte
#                   1 + i, weight 16 + i its high nibble
TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)  # the token counts a row_dots call takes (an IR body for each)
MAGNITUDES = (0, 1, 2, 3, 4, 6, 8, 12)  # kv of codes 0-7 (codes 8-15: the same, negated)
_ZERO16 = ir.Constant(vec(I32, 16), [0] * 16)


def _pair_codes(builder, base0, base1):
    """The codes of two blocks (base1 None: one block, then zeros) as <64 x i8> in weight order:
    block 0's 32 weights, then block 1's."""
    q0 = load(builder, builder.gep(base0, [ir.Constant(I64, 1)]), I8, 16)
    q1 = const(I8, [0] * 16) if base1 is None else load(builder, builder.gep(base1, [ir.Constant(I64, 1)]), I8, 16)
    v = shuffle(builder, q0, q1, range(32))
    lo = builder.and_(v, const(I8, [15] * 32))
    hi = builder.lshr(v, const(I8, [4] * 32))
    return shuffle(builder, lo, hi, [*range(0, 16), *range(32, 48), *range(16, 32), *range(48, 64)])


def _nibbles_shifted(builder, v):
    """<64 x i8> v's bytes moved 4 bits down within their 16-bit words: byte k's low four bits are
    then byte k's high nibble (the bits above are the next byte's: unused by the readers)."""
    words = builder.bitcast(v, vec(I16, 32))
    return builder.bitcast(builder.lshr(words, const(I16, [4] * 32)), vec(I8, 64))


def _quad_codes(builder, base):
    """Four consecutive blocks (68 bytes at base) from two overlapping 64-byte loads, [0, 64) and
    [4, 68): nothing outside the four blocks is read. Returns the two pairs' codes as <64 x i8> in
    weight order (each code in the low four bits of its byte; the bits above are another code's)
    and the load [0, 64), which holds the four scale bytes (at 0, 17, 34, 51). A shift of the
    loads' 16-bit words brings the high nibbles down, so a pair's codes are one two-source byte
    shuffle of a load and its shifted twin (one instruction with VBMI), where taking the pairs
    apart block by block costs about twice the instructions."""
    head = load(builder, base, I8, 64)
    tail = load(builder, builder.gep(base, [ir.Constant(I64, 4)]), I8, 64)
    pairs = []
    for src, at in ((head, 0), (tail, 2 * BLOCK_BYTES - 4)):  # the pair's first block at src[at]
        order = []
        for k in range(64):
            b, i = divmod(k, 32)
            code_byte = at + b * BLOCK_BYTES + 1 + i % 16
            order.append(code_byte if i < 16 else 64 + code_byte)
        pairs.append(shuffle(builder, src, _nibbles_shifted(builder, src), order))
    return pairs, head


def _magnitudes(builder, codes, vbmi: bool):
    """<64 x i8> |kv| of each code (unsigned, <= 12)."""
    if vbmi:  # one byte permute through the 64-byte table (it reads the low six bits of each index)
        lookup = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 64), [vec(I8, 64)] * 2),
                                                "llvm.x86.avx512.permvar.qi.512")
        return builder.call(lookup, [const(I8, [MAGNITUDES[i & 7] for i in range(64)]), codes])
    m = builder.and_(codes, const(I8, [7] * 64))
    out = m  # codes 0-4 are their own magnitudes
    for code in (5, 6, 7):
        out = builder.select(builder.icmp_unsigned("==", m, const(I8, [code] * 64)),
                             const(I8, [MAGNITUDES[code]] * 64), out)
    return out


def _half_scales(builder, e8, count: int):
    """<count x f32> 2^(e - 128) of the scale bytes e8 <count x i8>: subnormal 0x00200000 << e
    for e < 2, else the exponent field e - 1 (quant._dequant_mxfp4's bits)."""
    e = builder.zext(e8, vec(I32, count))
    small = builder.icmp_unsigned("<", e, const(I32, [2] * count))
    bits = builder.select(small, builder.shl(const(I32, [0x00200000] * count), e),
                          builder.shl(builder.sub(e, const(I32, [1] * count)), const(I32, [23] * count)))
    return builder.bitcast(bits, vec(F32, count))


def _joined(builder, parts):
    """The vectors `parts` (one type) end to end, then undefined lanes up to a power of two of
    parts: joined two by two, a shuffle each."""
    vs = list(parts)
    while len(vs) > 1:
        if len(vs) % 2:
            vs.append(ir.Constant(vs[0].type, None))
        vs = [shuffle(builder, a, b, range(2 * a.type.count)) for a, b in zip(vs[0::2], vs[1::2], strict=True)]
    return vs[0]


def _widened(builder, v, lanes: int):
    """v with undefined lanes appended up to `lanes` (a power of two)."""
    while v.type.count < lanes:
        v = shuffle(builder, v, ir.Constant(v.type, None), range(2 * v.type.count))
    return v


def _blocks_per_pass(tokens: int) -> int:
    """Blocks whose float terms are made side by side in one pass (two or one groups of four)."""
    return 8 if tokens <= 2 else 4


def _row_dots_body(context, builder, sig, args, tokens: int, vbmi: bool, nrows: int) -> None:
    """`nrows` rows (1 or 2; nb blocks each, the second rs bytes after the first) times `tokens`
    tokens, results to res[8 r + j]. Blocks go in passes of _blocks_per_pass (then single pairs,
    then an odd last block; a pass's blocks decoded four at a time by _quad_codes): each pair of
    each row decoded once, its 4-way dots with every token's codes (a token's codes loaded once
    for the rows), the integer sums of the pass from qir.unit_sums trees, then every (row, token,
    block) float term side by side and each block's added to its (row, token) accumulator lane in
    block order. Two rows share the token loads, the trees and the float steps, which cost a
    lone row with one or two tokens about as much as its integer dots; a row's lanes take the
    same steps either way, so its results are the same bits alone or paired."""
    raw_, ro_, rs_, nb_, xq_, xo_, stride_, xd_, xdo_, res_, _ = args
    n, R = tokens, nrows
    rows = [ptr(context, builder, sig.args[0], raw_, builder.add(ro_, builder.mul(ir.Constant(I64, r), rs_)))
            for r in range(R)]
    acc = cgutils.alloca_once_value(builder, ir.Constant(vec(F32, R * n), [0.0] * (R * n)))

    def blocks(first, count: int) -> None:  # blocks first .. first + count - 1, in pairs
        bases = [[builder.gep(row, [builder.mul(builder.add(first, ir.Constant(I64, k)), ir.Constant(I64, BLOCK_BYTES))])
                  for k in range(count)] for row in rows]
        quads = count % 4 == 0  # whole groups of four blocks: decoded four at a time
        heads: list = []
        pair_codes: list[list] = [[] for _ in rows]
        if quads:
            for r in range(R):
                for k in range(0, count, 4):
                    pairs, head = _quad_codes(builder, bases[r][k])
                    pair_codes[r] += pairs
                    heads.append(head)
        # vector (p R + r) n + j: pair p of row r times token j (<16 x i32>, lanes 0-7 the pair's
        # first block, 8-15 its second)
        lanes: list = []
        for q in range(0, count, 2):
            xs_of: list = [None] * n  # token j's codes of this pair, loaded at the first row's use
            for r in range(R):
                codes = (pair_codes[r][q // 2] if quads
                         else _pair_codes(builder, bases[r][q], bases[r][q + 1] if q + 1 < count else None))
                mags = _magnitudes(builder, codes, vbmi)
                negative = builder.icmp_unsigned("!=", builder.and_(codes, const(I8, [8] * 64)), const(I8, [0] * 64))
                for j in range(n):
                    if xs_of[j] is None:
                        xoff = builder.add(builder.add(xo_, builder.mul(ir.Constant(I64, j), stride_)),
                                           builder.mul(builder.add(first, ir.Constant(I64, q)), ir.Constant(I64, 32)))
                        px = ptr(context, builder, sig.args[4], xq_, xoff)
                        xs_of[j] = (load(builder, px, I8, 64) if q + 1 < count
                                    else shuffle(builder, load(builder, px, I8, 32), const(I8, [0] * 32), range(64)))
                    x = xs_of[j]
                    lanes.append(dot4(builder, _ZERO16, mags, builder.select(negative, builder.sub(const(I8, [0] * 64), x), x)))
        # one tree per 8 vectors (16 blocks' sums: a tree's most), end to end in the same order
        trees = [unit_sums(builder, lanes[k:k + 8], 8) for k in range(0, len(lanes), 8)]
        isums = trees[0] if len(trees) == 1 else _joined(builder, [_widened(builder, t, 16) for t in trees])
        sums = builder.sitofp(isums, vec(F32, isums.type.count))
        xd_rows = []  # token j's scales of the count blocks
        for j in range(n):
            xdoff = builder.add(builder.add(xdo_, builder.mul(ir.Constant(I64, j), nb_)), first)
            xd_rows.append(load(builder, ptr(context, builder, sig.args[7], xd_, xdoff), F32, count))
        if quads:  # the scale bytes out of the quads' first loads (row by row)
            joined = _joined(builder, heads)
            e8 = shuffle(builder, joined, joined, [64 * (k // 4) + (k % 4) * BLOCK_BYTES for k in range(R * count)])
        else:
            e8 = ir.Constant(vec(I8, R * count), None)
            for r in range(R):
                for k in range(count):
                    e8 = builder.insert_element(e8, builder.load(bases[r][k]), ir.Constant(I32, r * count + k))
        dws = _half_scales(builder, e8, R * count)
        # Every (row, token, block) term side by side, lane (r n + j) count + b: the tokens'
        # scale rows joined, the scales and integer sums moved into that order by one shuffle each
        xdv = _joined(builder, xd_rows)
        order = [(r, j, b) for r in range(R) for j in range(n) for b in range(count)]
        dwv = shuffle(builder, dws, dws, [r * count + b for r, _, b in order])
        xdv = shuffle(builder, xdv, xdv, [j * count + b for _, j, b in order])
        sumv = shuffle(builder, sums, sums, [((b // 2 * R + r) * n + j) * 2 + b % 2 for r, j, b in order])
        terms = builder.fmul(builder.fmul(dwv, xdv), sumv)
        total = builder.load(acc)
        for b in range(count):  # in block order, one vector lane per (row, token)
            total = builder.fadd(total, shuffle(builder, terms, terms, [k * count + b for k in range(R * n)]))
        builder.store(total, acc)

    per_pass = _blocks_per_pass(n)
    passes = builder.sdiv(nb_, ir.Constant(I64, per_pass))
    with cgutils.for_range(builder, passes) as loop:
        blocks(builder.mul(loop.index, ir.Constant(I64, per_pass)), per_pass)
    done = builder.mul(passes, ir.Constant(I64, per_pass))
    pairs = builder.sdiv(builder.sub(nb_, done), ir.Constant(I64, 2))
    with cgutils.for_range(builder, pairs) as loop:
        blocks(builder.add(done, builder.mul(loop.index, ir.Constant(I64, 2))), 2)
    odd = builder.icmp_signed("!=", builder.add(done, builder.mul(pairs, ir.Constant(I64, 2))), nb_)
    with builder.if_then(odd):
        blocks(builder.sub(nb_, ir.Constant(I64, 1)), 1)
    total = builder.load(acc)
    for r in range(R):
        for j in range(n):
            builder.store(builder.extract_element(total, ir.Constant(I32, r * n + j)),
                          ptr(context, builder, sig.args[9], res_, ir.Constant(I64, 8 * r + j)))


PAIRED_TOKENS = 4  # up to this many tokens, rows go two at a time (row_dots' nrows = 2)


def row_dots_with(vbmi: bool, nrows: int = 1):
    """The MXFP4 row-dot intrinsic for `nrows` rows (1, or 2 with up to PAIRED_TOKENS tokens),
    with the AVX-512 VBMI byte permute (vbmi) or in portable IR: the module's own uses the host's
    best; the tests build both and compare them.
      row_dots(raw, ro, rs, nb, xq, xo, stride, xd, xdo, res, n): the first row's nb blocks at
      raw[ro:], the second's at raw[ro + rs:]; token j's codes at xq[xo + j * stride] (block b at
      + 32 b), its scales at xd[xdo + j * nb + b]; res[8 r + j] = row r's result for token j (n
      of TOKENS, at most PAIRED_TOKENS for two rows; another n does nothing). Two rows are their
      own intrinsic, not cases of one: sharing one function with the one-row bodies cost those
      3-4 % (measured), whatever the reason in the generated code."""
    counts = TOKENS if nrows == 1 else [n for n in TOKENS if n <= PAIRED_TOKENS]

    @intrinsic
    def row_dots(typingctx, raw, ro, rs, nb, xq, xo, stride, xd, xdo, res, count):
        def codegen(context, builder, sig, args):
            count_cases(builder, args[10], counts,
                        lambda n: _row_dots_body(context, builder, sig, args, n, vbmi, nrows), "fp4_row_dots")
            return context.get_dummy_value()

        return types.void(raw, ro, rs, nb, xq, xo, stride, xd, xdo, res, count), codegen

    return row_dots


VBMI = bool(FEATURES.get("avx512vbmi")) and bool(FEATURES.get("avx512bw"))
mxfp4_row_dots = row_dots_with(VBMI)
mxfp4_row_pair_dots = row_dots_with(VBMI, 2)


# ---- rows times 16 tokens per vector ------------------------------------------------------------
# With many tokens per row (a prefill's busy experts), one vector lane per token, as qkernels'
# rows16 kernels: the activations of 16 tokens interleaved once per product (lanes_interleave:
# quad k of the row's inputs, 16 tokens x 4 codes + 128 as u8, 64 bytes), each row's blocks
# decoded once to signed int8 weights kv[q] in memory (four blocks at a time: two loads, two
# byte permutes, one sum tree for their C and one vector of scales; one block at a time, the
# decoding cost as much as a vector of 16 tokens' products), and each 4-weight quad, broadcast, meets
# the 16 tokens' quad in one 4-way u8 x s8 dot (vpdpbusd): 8 dots per block and 16 tokens, where
# the row dots need a dot and a sign select per block pair and token plus a reduction tree.
#   isum = sum_i (x_i + 128) kv[q_i] - 128 C,  C = sum_i kv[q_i]
# is the row dots' integer (exact either way), and the float steps are theirs in the same order
# (acc += (dw * xd) * float(isum), block by block from +0), so the bits are the same.
#   rows16(raw, ro, rstride, nb, xi, xdi, nv, res, wrow, info): `rows` rows at raw[ro + i *
#   rstride:], nb blocks each; token vector v's quad k at byte ((v * nb * 8) + k) * 64 of xi, its
#   block scales at xdi[(v * nb + b) * 16]; res[i * 16 nv + 16 v + j] = row i's result for
#   token 16 v + j; wrow, info: scratch (rows * nb * 32 int8: row i's block b at 32 (i nb + b);
#   rows * nb * 2 int32: its -128 C at i nb + b, its dw's bits at rows nb + i nb + b).

# From this many tokens of one matrix (and with AVX-512 VNNI) rows go 16 tokens a vector, a
# vector part empty below 16: its cost is about a fixed 36 ns per 256 weights (one core), where
# the row dots cost 6.4-6.6 ns per token at 6 to 8 tokens and 7 at 5 (measured).
LANES_MIN = 6
LANES = VNNI
TOKEN_TILE = 64  # tokens per pass over the rows (4 vectors of 16)


def rows16_with(vbmi: bool, rows: int):
    """The rows16 intrinsic for `rows` rows (1 or 2), its weights decoded with the AVX-512 VBMI
    byte permute (vbmi) or in portable IR (the same integers): the module's own use the host's
    best; the tests build both and compare them."""
    @intrinsic
    def rows16(typingctx, raw, ro, rstride, nb, xi, xdi, nv, res, wrow, info):
        def codegen(context, builder, sig, args):
            _rows16_body(context, builder, sig, args, rows, vbmi)
            return context.get_dummy_value()

        return types.void(raw, ro, rstride, nb, xi, xdi, nv, res, wrow, info), codegen

    return rows16


_SIGNED = [*MAGNITUDES, *(-m for m in MAGNITUDES)]  # kv of codes 0-15


def _signed_weights(builder, codes, vbmi: bool):
    """<64 x i8> kv[q] of codes whose low four bits are the code (the bits above: ignored)."""
    if vbmi:  # one byte permute through the 64-byte table (it reads the low six bits of each index)
        lookup = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 64), [vec(I8, 64)] * 2),
                                                "llvm.x86.avx512.permvar.qi.512")
        return builder.call(lookup, [const(I8, [_SIGNED[i & 15] for i in range(64)]), codes])
    mags = _magnitudes(builder, codes, False)
    negative = builder.icmp_unsigned("!=", builder.and_(codes, const(I8, [8] * 64)), const(I8, [0] * 64))
    return builder.select(negative, builder.sub(const(I8, [0] * 64), mags), mags)


def _rows16_decode(builder, base, pw, pcorr, pdw, count: int, vbmi: bool) -> None:
    """`count` blocks (4, from two overlapping loads (_quad_codes), or 1) at `base` -> their 32
    signed weights kv[q] each at pw, -128 C (128 times their sum, negated) at pcorr and
    dw = 2^(e - 128) (as bits) at pdw, block after block."""
    ones = const(I8, [1] * 64)
    if count == 4:
        pairs, head = _quad_codes(builder, base)
        e8 = shuffle(builder, head, head, [k * BLOCK_BYTES for k in range(4)])
    else:
        pairs = [_pair_codes(builder, base, None)]  # lanes 32-63: zeros, so weights 0
        e8 = builder.insert_element(ir.Constant(vec(I8, 1), None), builder.load(base), ir.Constant(I32, 0))
    sums = []
    width = 32 * min(count, 2)  # a pair's bytes (one block: its 32)
    for k, codes in enumerate(pairs):
        w = _signed_weights(builder, codes, vbmi)
        store(builder, shuffle(builder, w, w, range(width)), builder.gep(pw, [ir.Constant(I64, 64 * k)]), I8, width)
        sums.append(dot4(builder, _ZERO16, ones, w))
    c = unit_sums(builder, sums, 8 if count == 4 else 16)  # block k's sum (its 8 lanes; one block: 16) in lane k
    store(builder, builder.mul(c, const(I32, [-128] * count)), pcorr, I32, count)
    store(builder, builder.bitcast(_half_scales(builder, e8, count), vec(I32, count)), pdw, I32, count)


def _rows16_body(context, builder, sig, args, rows: int, vbmi: bool) -> None:
    raw_, ro_, rstride_, nb_, xi_, xdi_, nv_, res_, wrow_, info_ = args

    def i64(v):
        return ir.Constant(I64, v)

    pw = builder.bitcast(ptr(context, builder, sig.args[8], wrow_, i64(0)), I8.as_pointer())
    pcorr = builder.bitcast(ptr(context, builder, sig.args[9], info_, i64(0)), I32.as_pointer())
    pdw = builder.gep(pcorr, [builder.mul(nb_, i64(rows))])
    # First the rows decoded (block b of row i at place i * nb + b), four blocks at a time, then
    # the products, reading each quad back from memory, so that its broadcast folds into the dot
    # instruction (as in qkernels' rows16).
    quads = builder.sdiv(nb_, i64(4))
    for i in range(rows):
        row = ptr(context, builder, sig.args[0], raw_, builder.add(ro_, builder.mul(i64(i), rstride_)))

        def decode(b, count: int, row=row, i=i) -> None:
            at = builder.add(builder.mul(i64(i), nb_), b)
            _rows16_decode(builder, builder.gep(row, [builder.mul(b, i64(BLOCK_BYTES))]),
                           builder.gep(pw, [builder.mul(at, i64(32))]), builder.gep(pcorr, [at]),
                           builder.gep(pdw, [at]), count, vbmi)

        with cgutils.for_range(builder, quads) as loop:
            decode(builder.mul(loop.index, i64(4)), 4)
        with cgutils.for_range_slice(builder, builder.mul(quads, i64(4)), nb_, i64(1)) as (b, _):
            decode(b, 1)
    pxi = builder.bitcast(ptr(context, builder, sig.args[4], xi_, i64(0)), I8.as_pointer())
    pres = ptr(context, builder, sig.args[7], res_, i64(0))
    praw = ptr(context, builder, sig.args[0], raw_, i64(0))

    def products(n: int) -> None:  # n token vectors: the accumulators stay in registers
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec(F32, 16), [0.0] * 16)) for _ in range(n)]
                for _ in range(rows)]
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            for i in range(rows):  # the next pass's rows, block b, asked for now (qkernels' rows16: why)
                ahead = builder.add(ro_, builder.add(builder.mul(i64(rows + i), rstride_), builder.mul(b, i64(BLOCK_BYTES))))
                prefetch_span(builder, praw, ahead, BLOCK_BYTES)  # 17-byte steps: every line
            ats = [builder.add(builder.mul(i64(i), nb_), b) for i in range(rows)]
            isums = [[splat(builder, builder.load(builder.gep(pcorr, [at])), I32, 16)] * n for at in ats]
            pxs = [builder.gep(pxi, [builder.mul(builder.add(builder.mul(i64(v), nb_), b), i64(512))]) for v in range(n)]
            for q in range(8):
                ws = []
                for at in ats:
                    pq = builder.bitcast(builder.gep(pw, [builder.add(builder.mul(at, i64(32)), i64(4 * q))]),
                                         I32.as_pointer())
                    ws.append(builder.bitcast(splat(builder, builder.load(pq, align=1), I32, 16), vec(I8, 64)))
                for v in range(n):
                    xv = load(builder, builder.gep(pxs[v], [i64(64 * q)]), I8, 64)
                    for i in range(rows):
                        isums[i][v] = dot4(builder, isums[i][v], xv, ws[i])
            for v in range(n):
                xdv = load(builder, ptr(context, builder, sig.args[5], xdi_,
                                        builder.mul(builder.add(builder.mul(i64(v), nb_), b), i64(16))), F32, 16)
                for i in range(rows):
                    dw = builder.bitcast(builder.load(builder.gep(pdw, [ats[i]])), F32)
                    term = builder.fmul(builder.fmul(splat(builder, dw, F32, 16), xdv),
                                        builder.sitofp(isums[i][v], vec(F32, 16)))
                    builder.store(builder.fadd(builder.load(accs[i][v]), term), accs[i][v])
        for i in range(rows):
            for v in range(n):
                store(builder, builder.load(accs[i][v]),
                      builder.gep(pres, [builder.add(builder.mul(i64(i), builder.mul(nv_, i64(16))), i64(16 * v))]), F32, 16)

    count_cases(builder, nv_, (1, 2, 3, 4), products, "fp4_rows16")


mxfp4_rows16_1, mxfp4_rows16_2 = rows16_with(VBMI, 1), rows16_with(VBMI, 2)

_jit = njit(nogil=True, cache=True)


@_jit
def _single_rows(raw, xq, xd, out, r0, r1, t0, t1):
    cols = xq.shape[1]
    nb = cols // 32
    res = np.empty(8, np.float32)
    for r in range(r0, r1):
        t = t0
        while t < t1:
            cnt = min(8, t1 - t)
            mxfp4_row_dots(raw, r * raw.shape[1], 0, nb, xq, t * cols, cols, xd, t * nb, res, cnt)
            for j in range(cnt):
                out[t + j, r] = res[j]
            t += cnt


@_jit
def _paired_rows(raw, xq, xd, out, r0, r1, t0, t1):
    # Row i of the range's first half goes with row i of its second half, so each half is read
    # front to back as one stream. Pairing adjacent rows instead breaks both streams at every
    # row, which the hardware prefetch follows poorly: the gate and up experts then took half as
    # long again, streamed from memory (measured on the Flash-shape file).
    cols = xq.shape[1]
    nb = cols // 32
    half = (r1 - r0) // 2
    rs = half * raw.shape[1]
    res = np.empty(16, np.float32)
    cnt = t1 - t0
    for r in range(r0, r0 + half):
        mxfp4_row_pair_dots(raw, r * raw.shape[1], rs, nb, xq, t0 * cols, cols, xd, t0 * nb, res, cnt)
        for j in range(cnt):
            out[t0 + j, r] = res[j]
            out[t0 + j, r + half] = res[8 + j]
    if (r1 - r0) % 2:
        _single_rows(raw, xq, xd, out, r1 - 1, r1, t0, t1)


@_jit
def lanes_interleave(xq32, xd, t0, t1, xi, xdi):
    """Tokens t0..t1 (at most 64) of xq32 (the int8 codes viewed as uint32 quads, [n, cols // 4])
    and xd [n, nb] -> xi uint32 [nv, cols // 4, 16] (quad k of token 16 v + j, each code + 128)
    and xdi f32 [nv, nb, 16]; lanes past t1 are zeros (code + 128 = 128, scale 0). qkernels'
    lanes_interleave is the Q8_K form (scales per 256, and the bsums); each module keeps its own,
    as numba caches the machine code of a file by that file alone."""
    nv, nq, nb = xi.shape[0], xi.shape[1], xdi.shape[1]
    for v in range(nv):
        for j in range(16):
            t = t0 + 16 * v + j
            if t < t1:
                for b in range(nb):
                    xdi[v, b, j] = xd[t, b]
                for k in range(nq):
                    xi[v, k, j] = xq32[t, k] ^ np.uint32(0x80808080)
            else:
                for b in range(nb):
                    xdi[v, b, j] = 0.0
                for k in range(nq):
                    xi[v, k, j] = np.uint32(0x80808080)


@_jit
def _lanes_rows(raw, xq, xd, out, r0, r1, t0, t1):
    nq = xq.shape[1] // 4
    nb = nq // 8
    xq32 = xq.view(np.uint32)
    res = np.empty(2 * TOKEN_TILE, np.float32)
    wrow = np.empty(2 * nb * 32, np.int8)
    info = np.empty(2 * nb * 2, np.int32)
    rs = raw.shape[1]
    for ts in range(t0, t1, TOKEN_TILE):
        n = min(TOKEN_TILE, t1 - ts)
        nv = (n + 15) // 16
        xi = np.empty((nv, nq, 16), np.uint32)
        xdi = np.empty((nv, nb, 16), np.float32)
        lanes_interleave(xq32, xd, ts, ts + n, xi, xdi)
        for r in range(r0, r1, 2):  # two rows per pass: each activation load meets both
            if r + 1 < r1:
                mxfp4_rows16_2(raw, r * rs, rs, nb, xi, xdi, nv, res, wrow, info)
                for j in range(n):
                    out[ts + j, r] = res[j]
                    out[ts + j, r + 1] = res[16 * nv + j]
            else:
                mxfp4_rows16_1(raw, r * rs, rs, nb, xi, xdi, nv, res, wrow, info)
                for j in range(n):
                    out[ts + j, r] = res[j]


@_jit
def mxfp4_rows(raw, xq, xd, out, r0, r1, t0, t1):
    """out[t, r] for rows r0..r1 of raw ([rows, nb * 17] MXFP4 blocks) and tokens t0..t1: from
    LANES_MIN tokens (with AVX-512 VNNI) 16 tokens to a vector, up to PAIRED_TOKENS tokens two
    rows per pass, else up to eight tokens per pass over a row."""
    if LANES and t1 - t0 >= LANES_MIN:
        _lanes_rows(raw, xq, xd, out, r0, r1, t0, t1)
    elif t1 - t0 <= PAIRED_TOKENS:
        _paired_rows(raw, xq, xd, out, r0, r1, t0, t1)
    else:
        _single_rows(raw, xq, xd, out, r0, r1, t0, t1)


@_jit
def expert_rows(kind, w, aux, used, starts, xq, xd, xs, out, r0, r1, grid):
    """qkernels.expert_rows' signature for MXFP4 experts: expert used[i] takes the activation rows
    starts[i]..starts[i+1]; w [n_experts, rows, nb * 17] the raw blocks (kind, aux, xs, grid
    unused)."""
    for i in range(used.shape[0]):
        mxfp4_rows(w[used[i]], xq, xd, out, r0, r1, starts[i], starts[i + 1])


_jit_split = njit(nogil=True, cache=True, parallel=True)


@_jit_split
def expert_rows_split(kind, ws, auxs, outs, used, starts, xq, xd, xs, cuts, grid):
    """expert_rows of each matrix ws[m] (into outs[m]), rows cuts[p]..cuts[p + 1] on thread p
    (qkernels.expert_rows_split's contract)."""
    for p in prange(cuts.shape[0] - 1):
        for m in range(len(ws)):
            expert_rows(kind, ws[m], auxs[m], used, starts, xq, xd, xs, outs[m], cuts[p], cuts[p + 1], grid)
