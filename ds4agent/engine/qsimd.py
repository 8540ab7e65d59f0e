"""Vector building blocks of the fast CPU kernels, written as LLVM IR (numba intrinsics).

Why IR and not plain numba loops: numba types every integer operation as int64, so a loop over
int8 codes never becomes the 8-bit SIMD products the speed needs (measured: 1-2 GB/s of Q8_0
codes per core as loops, ~20 as the IR below). The IR here is generic LLVM (vectors, shuffles,
`llvm.vector.reduce.add`), nothing target-specific: LLVM picks the instructions of the host when
numba compiles (on x86 with AVX-512 VNNI a u8 x s8 reduction becomes `vpdpbusd`; on ARM the dot
product instructions), and the same IR is correct on every target. Every operation is on integers,
so the results are exact whatever instructions are chosen.

Each function is an intrinsic: called from an @njit kernel with arrays and element offsets (no
bounds checks: the kernels keep every access inside the arrays they pass).

    dot_us16/32/64/256(a, ao, b, bo)  sum over i < N of u8 a[ao+i] * s8 b[bo+i]   -> int32
    dot_ss32(a, ao, b, bo)            sum over i < 32 of s8 a[ao+i] * s8 b[bo+i]  -> int32
    sum_s8_32(a, ao)                  sum over i < 32 of s8 a[ao+i]               -> int32
    dot_hi_nibble16(a, ao, s, so)     sum over i < 16 of (u8 a[ao+i] >> 4) * i32 s[so+i] -> int32
    dot_i16_256(a, ao, b, bo)         sum over i < 256 of i16 a[ao+i] * i16 b[bo+i] -> int32
    widen_s8(a, ao, b, bo, n)         b[bo:bo+n] = int16(a[ao:ao+n]) (n a multiple of 64)

Q8_0 with rows interleaved (see the section at the end):
    q8_0_group1 / q8_0_group4(wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res)
                                      16 rows x 1 (or 4) tokens, every block, to res (f32)

Block decoders: one weight block at raw[o] -> 256 int16 weights (scale folded in, still integer)
in input order at buf[bo:], so a token's block product is one `dot_i16_256`:
    q2_k_unpack(raw, o, buf, bo)      2-bit code * 4-bit scale (<= 45)
    q4_k_unpack(raw, o, buf, bo, mins, mo)  4-bit code * 6-bit scale (<= 945); the 8 six-bit
                                      mins to mins[mo:mo+8] (int32)
    iq2_xxs_unpack(raw, o, grid, buf, bo)  signed grid value * (2 * 4-bit scale + 1)
                                      (|v| <= 43 * 31); grid: the 256 grid rows as uint64
"""

from __future__ import annotations

import llvmlite.binding as ll
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _ptr(context, builder, aty, arr, off):
    """Address of element `off` of the array value `arr` (of numba type `aty`)."""
    return builder.gep(context.make_array(aty)(context, builder, arr).data, [off])


def _load(builder, p, t: ir.Type, n: int):
    """n elements of type t from p as one vector (unaligned)."""
    return builder.load(builder.bitcast(p, _vec(t, n).as_pointer()), align=1)


def _store(builder, v, p, t: ir.Type, n: int) -> None:
    builder.store(v, builder.bitcast(p, _vec(t, n).as_pointer()), align=1)


def _reduce(builder, v, n: int):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_vec(_I32, n)]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [v])


def _const(t: ir.Type, values) -> ir.Constant:
    values = list(values)
    return ir.Constant(_vec(t, len(values)), values)


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, _const(_I32, idx))


def _dot_us(n: int):
    @intrinsic
    def dot(typingctx, a, ao, b, bo):
        def codegen(context, builder, sig, args):
            va = _load(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), _I8, n)
            vb = _load(builder, _ptr(context, builder, sig.args[2], args[2], args[3]), _I8, n)
            prod = builder.mul(builder.zext(va, _vec(_I32, n)), builder.sext(vb, _vec(_I32, n)))
            return _reduce(builder, prod, n)

        return types.int32(a, ao, b, bo), codegen

    return dot


dot_us16, dot_us32, dot_us64, dot_us256 = _dot_us(16), _dot_us(32), _dot_us(64), _dot_us(256)


@intrinsic
def dot_ss32(typingctx, a, ao, b, bo):
    def codegen(context, builder, sig, args):
        va = _load(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), _I8, 32)
        vb = _load(builder, _ptr(context, builder, sig.args[2], args[2], args[3]), _I8, 32)
        prod = builder.mul(builder.sext(va, _vec(_I32, 32)), builder.sext(vb, _vec(_I32, 32)))
        # pairs first (the shape of a 16-bit multiply-add instruction), then the reduction
        pairs = builder.add(_shuffle(builder, prod, prod, range(0, 32, 2)), _shuffle(builder, prod, prod, range(1, 32, 2)))
        return _reduce(builder, pairs, 16)

    return types.int32(a, ao, b, bo), codegen


@intrinsic
def sum_s8_32(typingctx, a, ao):
    def codegen(context, builder, sig, args):
        va = _load(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), _I8, 32)
        return _reduce(builder, builder.sext(va, _vec(_I32, 32)), 32)

    return types.int32(a, ao), codegen


@intrinsic
def dot_hi_nibble16(typingctx, a, ao, s, so):
    def codegen(context, builder, sig, args):
        va = _load(builder, _ptr(context, builder, sig.args[0], args[0], args[1]), _I8, 16)
        hi = builder.zext(builder.lshr(va, _const(_I8, [4] * 16)), _vec(_I32, 16))
        vs = _load(builder, _ptr(context, builder, sig.args[2], args[2], args[3]), _I32, 16)
        return _reduce(builder, builder.mul(hi, vs), 16)

    return types.int32(a, ao, s, so), codegen


def _pairs(builder, a, b, n: int):
    """a, b <n x i16> -> <n/2 x i32>: lane k = a[2k]*b[2k] + a[2k+1]*b[2k+1] (exact; the shape
    of a 16-bit multiply-add instruction)."""
    prod = builder.mul(builder.sext(a, _vec(_I32, n)), builder.sext(b, _vec(_I32, n)))
    return builder.add(_shuffle(builder, prod, prod, range(0, n, 2)), _shuffle(builder, prod, prod, range(1, n, 2)))


@intrinsic
def dot_i16_256(typingctx, a, ao, b, bo):
    def codegen(context, builder, sig, args):
        pa = _ptr(context, builder, sig.args[0], args[0], args[1])
        pb = _ptr(context, builder, sig.args[2], args[2], args[3])
        acc = None
        for c in range(8):
            off = [ir.Constant(_I64, 32 * c)]
            part = _pairs(builder, _load(builder, builder.gep(pa, off), _I16, 32),
                          _load(builder, builder.gep(pb, off), _I16, 32), 32)
            acc = part if acc is None else builder.add(acc, part)
        return _reduce(builder, acc, 16)

    return types.int32(a, ao, b, bo), codegen


@intrinsic
def widen_s8(typingctx, a, ao, b, bo, n):
    def codegen(context, builder, sig, args):
        pa = _ptr(context, builder, sig.args[0], args[0], args[1])
        pb = _ptr(context, builder, sig.args[2], args[2], args[3])
        with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), args[4], ir.Constant(_I64, 64)) as (i, _):
            v = builder.sext(_load(builder, builder.gep(pa, [i]), _I8, 64), _vec(_I16, 64))
            _store(builder, v, builder.gep(pb, [i]), _I16, 64)
        return context.get_dummy_value()

    return types.void(a, ao, b, bo, n), codegen


@intrinsic
def q2_k_unpack(typingctx, raw, o, buf, bo):
    # Q2_K block: scales[16] (low nibble: scale of sub-block j of 16 weights), qs[64], d, dmin.
    # Byte l of half h (qs[32h + l]) holds weights 128h + 32s + l at bit shift 2s, l < 32; the
    # weight's sub-block is 8h + 2s + (l >= 16). For each shift s the 64 code bytes give 64
    # weights: 32 at input 32s.. (h = 0), 32 at 128 + 32s.. (h = 1).
    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], args[1])
        scales = builder.and_(_load(builder, base, _I8, 16), _const(_I8, [15] * 16))
        qs = _load(builder, builder.gep(base, [ir.Constant(_I64, 16)]), _I8, 64)
        out = _ptr(context, builder, sig.args[2], args[2], args[3])
        for s in range(4):
            codes = builder.and_(builder.lshr(qs, _const(_I8, [2 * s] * 64)), _const(_I8, [3] * 64))
            sc = _shuffle(builder, scales, scales, [(p // 32) * 8 + 2 * s + (p % 32 >= 16) for p in range(64)])
            prod = builder.zext(builder.mul(codes, sc), _vec(_I16, 64))  # <= 3 * 15: exact in a byte
            for h in range(2):
                half = _shuffle(builder, prod, prod, range(32 * h, 32 * h + 32))
                _store(builder, half, builder.gep(out, [ir.Constant(_I64, 128 * h + 32 * s)]), _I16, 32)
        return context.get_dummy_value()

    return types.void(raw, o, buf, bo), codegen


@intrinsic
def q4_k_unpack(typingctx, raw, o, buf, bo, mins, mo):
    # Q4_K block: d, dmin, 12 bytes of 6-bit scales and mins (ggml's packing: for j < 4,
    # scale j = s[j] & 63 and min j = s[j+4] & 63; for j >= 4, scale j = (s[j+4] & 15) |
    # (s[j-4] >> 6) << 4 and min j = (s[j+4] >> 4) | (s[j] >> 6) << 4), then qs[128]: chunk c
    # (qs[32c..]) holds sub-block 2c (inputs 64c..) in its low nibbles, 2c + 1 in its high ones.
    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], args[1])
        sb = builder.zext(_load(builder, builder.gep(base, [ir.Constant(_I64, 4)]), _I8, 12), _vec(_I16, 12))

        def pick(idx):
            return _shuffle(builder, sb, sb, idx)

        def mask(v, m):
            return builder.and_(v, _const(_I16, [m] * 8))

        def shr(v, k):
            return builder.lshr(v, _const(_I16, [k] * 8))

        def shl(v, k):
            return builder.shl(v, _const(_I16, [k] * 8))

        lo = pick([0, 1, 2, 3, 4, 5, 6, 7])  # s[j] and s[j+4], j < 4
        hi = pick([8, 9, 10, 11, 8, 9, 10, 11])  # s[j+4], j >= 4
        top = pick([0, 1, 2, 3, 0, 1, 2, 3])  # s[j-4], j >= 4
        top_m = pick([4, 5, 6, 7, 4, 5, 6, 7])  # s[j], j >= 4
        sc_hi = builder.or_(mask(hi, 15), shl(shr(top, 6), 4))
        mn_hi = builder.or_(shr(hi, 4), shl(shr(top_m, 6), 4))
        lo6 = mask(lo, 63)
        scales = _shuffle(builder, lo6, sc_hi, [0, 1, 2, 3, 12, 13, 14, 15])
        mns = _shuffle(builder, lo6, mn_hi, [4, 5, 6, 7, 12, 13, 14, 15])
        _store(builder, builder.zext(mns, _vec(_I32, 8)),
               _ptr(context, builder, sig.args[4], args[4], args[5]), _I32, 8)
        out = _ptr(context, builder, sig.args[2], args[2], args[3])
        for c in range(4):
            v = builder.zext(_load(builder, builder.gep(base, [ir.Constant(_I64, 16 + 32 * c)]), _I8, 32),
                             _vec(_I16, 32))
            for part in range(2):
                codes = builder.and_(v, _const(_I16, [15] * 32)) if part == 0 else builder.lshr(v, _const(_I16, [4] * 32))
                sc = _shuffle(builder, scales, scales, [2 * c + part] * 32)
                _store(builder, builder.mul(codes, sc), builder.gep(out, [ir.Constant(_I64, 64 * c + 32 * part)]),
                       _I16, 32)
        return context.get_dummy_value()

    return types.void(raw, o, buf, bo, mins, mo), codegen


def _iq2_magnitudes_signs(context, builder, grid_type, grid, base):
    """An IQ2_XXS block at `base` -> (magnitudes <256 x i8> unsigned, negative <256 x i1>).

    The 32 grid-row loads are scalar, indexed by bytes loaded straight from the block (moving
    indices out of a vector register costs more); the signs are computed for all 256 weights at
    once: 7-bit code j of b_g, plus a parity bit that makes the count of negative signs even."""
    table = context.make_array(grid_type)(context, builder, grid).data
    mags = ir.Constant(_vec(_I64, 32), None)
    for k in range(32):
        row = builder.zext(builder.load(builder.gep(base, [ir.Constant(_I64, 2 + 8 * (k // 4) + k % 4)])), _I64)
        mags = builder.insert_element(mags, builder.load(builder.gep(table, [row])), ir.Constant(_I32, k))
    words = _load(builder, builder.gep(base, [ir.Constant(_I64, 2)]), _I32, 16)
    b = _shuffle(builder, words, words, range(1, 16, 2))
    b32 = _shuffle(builder, b, b, [k // 4 for k in range(32)])
    codes = builder.and_(builder.lshr(b32, _const(_I32, [7 * (k % 4) for k in range(32)])), _const(_I32, [127] * 32))
    codes = builder.trunc(codes, _vec(_I8, 32))
    popcount = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(_I8, 32), [_vec(_I8, 32)]),
                                              "llvm.ctpop.v32i8")
    parity = builder.and_(builder.call(popcount, [codes]), _const(_I8, [1] * 32))
    sign_bits = builder.or_(codes, builder.shl(parity, _const(_I8, [7] * 32)))
    spread = _shuffle(builder, sign_bits, sign_bits, [k // 8 for k in range(256)])
    negative = builder.icmp_unsigned("!=", builder.and_(spread, _const(_I8, [1 << (k % 8) for k in range(256)])),
                                     _const(_I8, [0] * 256))
    return builder.bitcast(mags, _vec(_I8, 256)), negative


@intrinsic
def iq2_xxs_unpack(typingctx, raw, o, grid, buf, bo):
    # IQ2_XXS block: f16 d, then 8 groups of 32 weights, each two little-endian u32: a (four
    # grid-row bytes), b (four 7-bit sign codes at bits 0, 7, 14, 21; a 4-bit scale at 28).
    # Run k = 4g + j of 8 weights: magnitudes = grid row (byte j of a_g), signs = sign code j of
    # b_g plus a parity bit that makes the count of negative signs even.
    # grid [256] uint64: the 8 u8 magnitudes of each row (2 KiB: stays in L1).
    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], args[1])
        mags, negative = _iq2_magnitudes_signs(context, builder, sig.args[2], args[2], base)
        signed = builder.select(negative, builder.sub(_const(_I8, [0] * 256), mags), mags)
        words = _load(builder, builder.gep(base, [ir.Constant(_I64, 2)]), _I32, 16)
        b = _shuffle(builder, words, words, range(1, 16, 2))
        ls = builder.add(builder.shl(builder.lshr(b, _const(_I32, [28] * 8)), _const(_I32, [1] * 8)), _const(_I32, [1] * 8))
        ls = builder.trunc(ls, _vec(_I16, 8))
        scale = _shuffle(builder, ls, ls, [k // 32 for k in range(256)])
        values = builder.mul(builder.sext(signed, _vec(_I16, 256)), scale)
        _store(builder, values, _ptr(context, builder, sig.args[3], args[3], args[4]), _I16, 256)
        return context.get_dummy_value()

    return types.void(raw, o, grid, buf, bo), codegen


_F32, _F16 = ir.FloatType(), ir.HalfType()


@intrinsic
def dot_f32_lanes(typingctx, w, wo, x, xo, n):
    """sum over i < n of w[wo+i] * x[xo+i] in float32: w f32, or f16 given as uint16 bits
    (widened exactly); 16 lane sums (lane l adds the products i = l, l+16, ... in order, each
    product and sum rounded once: no fused multiply-add), then lanes l and l+8 added, then
    l and l+4, l+2, l+1. The order is fixed by this IR, not by the compiler."""
    half = w.dtype == types.uint16

    def codegen(context, builder, sig, args):
        pw = _ptr(context, builder, sig.args[0], args[0], args[1])
        px = _ptr(context, builder, sig.args[2], args[2], args[3])
        if half:
            pw = builder.bitcast(pw, _F16.as_pointer())
        count = args[4]
        full = builder.and_(count, ir.Constant(_I64, -16))
        lanes = cgutils.alloca_once(builder, _vec(_F32, 16))
        builder.store(ir.Constant(_vec(_F32, 16), [0.0] * 16), lanes)
        with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), full, ir.Constant(_I64, 16)) as (i, _):
            wv = _load(builder, builder.gep(pw, [i]), _F16 if half else _F32, 16)
            if half:
                wv = builder.fpext(wv, _vec(_F32, 16))
            xv = _load(builder, builder.gep(px, [i]), _F32, 16)
            builder.store(builder.fadd(builder.load(lanes), builder.fmul(wv, xv)), lanes)
        scalar = builder.bitcast(lanes, _F32.as_pointer())
        with cgutils.for_range_slice(builder, full, count, ir.Constant(_I64, 1)) as (i, _):
            wi = builder.load(builder.gep(pw, [i]))
            if half:
                wi = builder.fpext(wi, _F32)
            slot = builder.gep(scalar, [builder.sub(i, full)])
            builder.store(builder.fadd(builder.load(slot), builder.fmul(wi, builder.load(builder.gep(px, [i])))), slot)
        v = builder.load(lanes)
        for width in (8, 4, 2, 1):
            v = builder.fadd(_shuffle(builder, v, v, range(width)), _shuffle(builder, v, v, range(width, 2 * width)))
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return types.float32(w, wo, x, xo, n), codegen


# ---- Q8_0 rows interleaved for the 4-byte dot-product instruction -------------------------------
# A group of 16 rows is stored block by block as 8 runs of 64 bytes: run q of block b holds, for
# each of the 16 rows, its 4 codes 32b + 4q .. 32b + 4q + 3 (as code + 128, unsigned). One 64-byte
# load then meets one 4-byte piece of the activations (broadcast) and one u8 x s8 4-way dot
# instruction adds 16 rows' partial sums at once: no horizontal sums at all.

_VNNI = bool(ll.get_host_cpu_features().get("avx512vnni")) and bool(ll.get_host_cpu_features().get("avx512bw"))


def _dot4(builder, acc, w64, x4):
    """acc <16 x i32> + per lane l: sum over i < 4 of u8 w64[4l+i] * s8 x4[4l+i] (<64 x i8> each)."""
    if _VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_vec(_I32, 16), [_vec(_I32, 16)] * 3), "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, builder.bitcast(w64, _vec(_I32, 16)), builder.bitcast(x4, _vec(_I32, 16))])
    prod = builder.mul(builder.zext(w64, _vec(_I32, 64)), builder.sext(x4, _vec(_I32, 64)))
    pairs = builder.add(_shuffle(builder, prod, prod, range(0, 64, 2)), _shuffle(builder, prod, prod, range(1, 64, 2)))
    quads = builder.add(_shuffle(builder, pairs, pairs, range(0, 32, 2)), _shuffle(builder, pairs, pairs, range(1, 32, 2)))
    return builder.add(acc, quads)


def _splat(builder, value, t, n: int):
    v = builder.insert_element(ir.Constant(_vec(t, n), None), value, ir.Constant(_I32, 0))
    return _shuffle(builder, v, v, [0] * n)


def _q8_0_group(tokens: int):
    @intrinsic
    def q8_0_group(typingctx, wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res):
        # rows of one group x `tokens` consecutive tokens: res[16j + l] = row l, token j:
        # from +0, per block b: acc += (wd[l, b] * xd[j, b]) * float(dot - 128 * xs[j, b])
        def codegen(context, builder, sig, args):
            wi_, wo_, wd_, wdo_, xq_, xo_, xd_, xs_, so_, nb_, cols_, res_ = args
            pw = _ptr(context, builder, sig.args[0], wi_, wo_)
            pwd = _ptr(context, builder, sig.args[2], wd_, wdo_)
            px = _ptr(context, builder, sig.args[4], xq_, xo_)
            pxd = _ptr(context, builder, sig.args[6], xd_, so_)
            pxs = _ptr(context, builder, sig.args[7], xs_, so_)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_vec(_F32, 16), [0.0] * 16)) for _ in range(tokens)]
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                sums = [ir.Constant(_vec(_I32, 16), [0] * 16)] * tokens
                wblock = builder.gep(pw, [builder.mul(b, ir.Constant(_I64, 512))])
                for q in range(8):
                    w64 = _load(builder, builder.gep(wblock, [ir.Constant(_I64, 64 * q)]), _I8, 64)
                    for j in range(tokens):
                        at = builder.add(builder.mul(ir.Constant(_I64, j), cols_),
                                         builder.add(builder.mul(b, ir.Constant(_I64, 32)), ir.Constant(_I64, 4 * q)))
                        x4 = builder.load(builder.bitcast(builder.gep(px, [at]), _I32.as_pointer()), align=1)
                        sums[j] = _dot4(builder, sums[j], w64, builder.bitcast(_splat(builder, x4, _I32, 16), _vec(_I8, 64)))
                wdv = _load(builder, builder.gep(pwd, [builder.mul(b, ir.Constant(_I64, 16))]), _F32, 16)
                for j in range(tokens):
                    sb = builder.add(builder.mul(ir.Constant(_I64, j), nb_), b)
                    corr = builder.mul(builder.load(builder.gep(pxs, [sb])), ir.Constant(_I32, 128))
                    isum = builder.sub(sums[j], _splat(builder, corr, _I32, 16))
                    scale = builder.fmul(wdv, _splat(builder, builder.load(builder.gep(pxd, [sb])), _F32, 16))
                    term = builder.fmul(scale, builder.sitofp(isum, _vec(_F32, 16)))
                    builder.store(builder.fadd(builder.load(accs[j]), term), accs[j])
            pres = _ptr(context, builder, sig.args[11], res_, ir.Constant(_I64, 0))
            for j in range(tokens):
                _store(builder, builder.load(accs[j]), builder.gep(pres, [ir.Constant(_I64, 16 * j)]), _F32, 16)
            return context.get_dummy_value()

        return types.void(wi, wo, wd, wdo, xq, xo, xd, xs, so, nb, cols, res), codegen

    return q8_0_group


q8_0_group1, q8_0_group4 = _q8_0_group(1), _q8_0_group(4)


@intrinsic
def iq2_xxs_dot(typingctx, raw, o, grid, xq, xo):
    """One IQ2_XXS block at raw[o] times the int8 codes xq[xo:xo+256] without a decoded copy:
    sum over groups g of (2 s_g + 1) * sum_i |grid value_i| * (x_i with the weight's sign), the
    same exact integer as iq2_xxs_unpack + dot_i16_256 (used for decode, where a decoded block
    would serve one token only). The signs go onto the activations, so the products are unsigned
    magnitudes (<= 43) times signed codes: the 4-way u8 x s8 dot instruction where the CPU has it."""
    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], args[1])
        mags, negative = _iq2_magnitudes_signs(context, builder, sig.args[2], args[2], base)
        x = _load(builder, _ptr(context, builder, sig.args[3], args[3], args[4]), _I8, 256)
        xs = builder.select(negative, builder.sub(_const(_I8, [0] * 256), x), x)
        words = _load(builder, builder.gep(base, [ir.Constant(_I64, 2)]), _I32, 16)
        b = _shuffle(builder, words, words, range(1, 16, 2))
        ls = builder.add(builder.shl(builder.lshr(b, _const(_I32, [28] * 8)), _const(_I32, [1] * 8)), _const(_I32, [1] * 8))
        if _VNNI:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_vec(_I32, 16), [_vec(_I32, 16)] * 3), "llvm.x86.avx512.vpdpbusd.512")
            acc = None
            for h in range(4):  # groups 2h and 2h + 1: lanes 0..7 and 8..15
                m = builder.bitcast(_shuffle(builder, mags, mags, range(64 * h, 64 * h + 64)), _vec(_I32, 16))
                v = builder.bitcast(_shuffle(builder, xs, xs, range(64 * h, 64 * h + 64)), _vec(_I32, 16))
                part = builder.call(fn, [ir.Constant(_vec(_I32, 16), [0] * 16), m, v])
                scale = _shuffle(builder, ls, ls, [2 * h + (lane >= 8) for lane in range(16)])
                part = builder.mul(part, scale)
                acc = part if acc is None else builder.add(acc, part)
            return _reduce(builder, acc, 16)
        total = ir.Constant(_I32, 0)
        for g in range(8):
            m = builder.zext(_shuffle(builder, mags, mags, range(32 * g, 32 * g + 32)), _vec(_I32, 32))
            v = builder.sext(_shuffle(builder, xs, xs, range(32 * g, 32 * g + 32)), _vec(_I32, 32))
            dot = _reduce(builder, builder.mul(m, v), 32)
            total = builder.add(total, builder.mul(dot, builder.extract_element(ls, ir.Constant(_I32, g))))
        return total

    return types.int32(raw, o, grid, xq, xo), codegen
