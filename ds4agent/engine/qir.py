"""LLVM IR building blocks of the fast CPU kernels (qkernels.py, q8kernels.py): vectors, loads and
shuffles, the 4-byte dot product, the 16-bit multiply-add, and the block decoders the K-quant and
IQ2_XXS kernels share (Q4_K's packed scales and mins, IQ2_XXS's grid magnitudes and signs).

Plain Python that emits IR while numba compiles a kernel: nothing here is jitted. numba's on-disk
cache is keyed by the source file of each jitted function, not by the IR it inlines, so each
kernel module carries QIR_DIGEST, this file's SHA-256 (tests/engine/test_qmatrix.py checks it):
a change here must change that line there, which invalidates the kernel modules' caches.

Where the host has them, target-specific instructions give the same integers as generic IR does
elsewhere: `vpdpbusd` (AVX-512 VNNI) for the 4-way dots, `vpmaddwd` for the multiply-adds, and
with AVX-512 VBMI the word and byte permutes and the multishift for IQ2_XXS's grid rows.
"""

from __future__ import annotations

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from ds4agent.engine import quant

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def ptr(context, builder, aty, arr, off):
    """Address of element `off` of the array value `arr` (of numba type `aty`)."""
    return builder.gep(context.make_array(aty)(context, builder, arr).data, [off])


def load(builder, p, t: ir.Type, n: int):
    """n elements of type t from p as one vector (unaligned)."""
    return builder.load(builder.bitcast(p, vec(t, n).as_pointer()), align=1)


def store(builder, v, p, t: ir.Type, n: int) -> None:
    builder.store(v, builder.bitcast(p, vec(t, n).as_pointer()), align=1)


def reduce(builder, v, n: int):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [vec(I32, n)]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [v])


def prefetch(builder, p) -> None:
    """Ask for the cache line holding p (prefetcht0 on x86, prfm on ARM): a hint that changes
    no result, and harmless at any address (a prefetch never faults)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(p, I8.as_pointer()), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def prefetch_span(builder, base, start, nbytes: int) -> None:
    """prefetch of bytes start, start + 64, ... below start + nbytes from `base` (a byte pointer):
    every line of spans laid end to end."""
    for off in range(0, nbytes, 64):
        prefetch(builder, builder.gep(base, [builder.add(start, ir.Constant(I64, off))]))


def const(t: ir.Type, values) -> ir.Constant:
    values = list(values)
    return ir.Constant(vec(t, len(values)), values)


def shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, const(I32, idx))


def q4_k_scales_mins(builder, bases):
    """The 8 six-bit scales and 8 mins of one or two Q4_K blocks (at `bases`), unpacked from their
    12 bytes at base + 4 as ggml packs them, both blocks on one vector: <8 k x i16> each, block
    i's at lanes 8 i .. 8 i + 7. A block's unpacking alone took a tenth of a decoded token's Q4_K
    time; two blocks (the rows of a pair) share it 9-12 % faster, and four at once, with wider
    two-source shuffles, measured no faster than one."""
    k = len(bases)
    assert k in (1, 2)
    # Each block's 12 scale bytes and the next 4 (its first codes, unused) as 16-bit lanes,
    # block i's byte j at lane 16 i + j.
    parts = [builder.zext(load(builder, builder.gep(base, [ir.Constant(I64, 4)]), I8, 16), vec(I16, 16))
             for base in bases]
    sb = parts[0] if k == 1 else shuffle(builder, parts[0], parts[1], range(32))

    def pick(idx):
        return shuffle(builder, sb, sb, [16 * i + j for i in range(k) for j in idx])

    def mask(v, m):
        return builder.and_(v, const(I16, [m] * 8 * k))

    def shr(v, n):
        return builder.lshr(v, const(I16, [n] * 8 * k))

    def shl(v, n):
        return builder.shl(v, const(I16, [n] * 8 * k))

    lo = pick([0, 1, 2, 3, 4, 5, 6, 7])  # s[j] and s[j+4], j < 4
    hi = pick([8, 9, 10, 11, 8, 9, 10, 11])  # s[j+4], j >= 4
    top = pick([0, 1, 2, 3, 0, 1, 2, 3])  # s[j-4], j >= 4
    top_m = pick([4, 5, 6, 7, 4, 5, 6, 7])  # s[j], j >= 4
    sc_hi = builder.or_(mask(hi, 15), shl(shr(top, 6), 4))
    mn_hi = builder.or_(shr(hi, 4), shl(shr(top_m, 6), 4))
    lo6 = mask(lo, 63)
    n = 8 * k  # lanes of one of the vectors above: block i's mins are lo6's lanes 8 i + 4.. and mn_hi's
    mns = shuffle(builder, lo6, mn_hi, [i for b in range(k) for i in (*range(8 * b + 4, 8 * b + 8),
                                                                       *range(n + 8 * b + 4, n + 8 * b + 8))])
    scs = shuffle(builder, lo6, sc_hi, [i for b in range(k) for i in (*range(8 * b, 8 * b + 4),
                                                                       *range(n + 8 * b + 4, n + 8 * b + 8))])
    return scs, mns


# The IQ2_XXS grid's magnitudes are 8, 25 and 43 only, so a grid row is eight 2-bit codes
# (c = 0, 1, 2 for 8, 25, 43), 16 bits a row: the whole grid is
# 512 bytes, eight vector registers of 32 rows, and where the host has AVX-512 VBMI the 32 rows
# of a block are looked up by four two-table word permutes at once (vpermi2w) and spread to their
# bytes by one multishift and one byte permute per 64 weights, instead of 32 scalar loads and the inserts that gather
# them into vectors (about half of a decoded block's instructions). The magnitudes are the same
# integers either way (tests/engine/test_qmatrix.py holds both paths to the same bits).
def _iq2_grid_codes() -> list[int] | None:
    grid, _ = quant.iq2xxs_tables()
    code = {8.0: 0, 25.0: 1, 43.0: 2}
    if not set(np.unique(grid).tolist()) <= set(code):
        return None
    return [sum(code[float(v)] << (2 * j) for j, v in enumerate(row)) for row in grid]


FEATURES = ll.get_host_cpu_features()
IQ2_CODES = _iq2_grid_codes() if FEATURES.get("avx512vbmi") and FEATURES.get("avx512bw") else None


def _iq2_magnitudes_vbmi(builder, words):
    """The 32 grid rows of a block (row indices: the bytes of its even words) as <256 x i8>
    magnitudes, through the 2-bit code table (see IQ2_CODES)."""
    assert IQ2_CODES is not None
    v16, i1_32 = vec(I16, 32), vec(ir.IntType(1), 32)
    permute = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, v16]),
                                             "llvm.x86.avx512.vpermi2var.hi.512")
    rows = builder.zext(builder.bitcast(shuffle(builder, words, words, range(0, 16, 2)), vec(I8, 32)), v16)
    tables = [const(I16, IQ2_CODES[32 * m:32 * m + 32]) for m in range(8)]
    # rows 64q .. 64q + 63 from tables 2q and 2q + 1 (index bits 0-5), then bits 6 and 7 choose q
    looked = [builder.call(permute, [tables[2 * q], rows, tables[2 * q + 1]]) for q in range(4)]

    def bit(b):
        return builder.icmp_unsigned("!=", builder.and_(rows, const(I16, [b] * 32)), const(I16, [0] * 32))

    b6, b7 = bit(64), bit(128)
    assert b6.type == i1_32
    codes = builder.select(b7, builder.select(b6, looked[3], looked[2]), builder.select(b6, looked[1], looked[0]))
    shift = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 64), [vec(I8, 64)] * 2),
                                           "llvm.x86.avx512.pmultishift.qb.512")
    bytes_of = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 64), [vec(I8, 64)] * 2),
                                              "llvm.x86.avx512.permvar.qi.512")
    control = const(I8, [2 * (k % 8) for k in range(64)])
    # byte i of the magnitude table: the magnitude of code i & 3 (a byte permute reads the low six
    # bits of its index, so the other codes the multishift brings along need no mask)
    magnitude = const(I8, [(8, 25, 43, 0)[i & 3] for i in range(64)])
    quarters = []
    for h in range(4):  # rows 8h .. 8h + 7: each row's code word in its own 64-bit lane
        lanes = builder.zext(shuffle(builder, codes, codes, range(8 * h, 8 * h + 8)), vec(I64, 8))
        c = builder.call(shift, [control, builder.bitcast(lanes, vec(I8, 64))])
        quarters.append(builder.call(bytes_of, [magnitude, c]))
    low = shuffle(builder, quarters[0], quarters[1], range(128))
    high = shuffle(builder, quarters[2], quarters[3], range(128))
    return shuffle(builder, low, high, range(256))


# Byte c of the sign table: the signs of a group's 8 weights for 7-bit sign code c (bit j set:
# weight j negative), the eighth bit making the count of negative signs even.
_IQ2_SIGNS = [c | ((bin(c).count("1") & 1) << 7) for c in range(128)]


def _iq2_signs_vbmi(builder, words):
    """<256 x i1>, weight k negative, from the block's words (<16 x i32>): the 32 7-bit sign codes
    (bits 7i .. 7i + 6 of odd word 2g + 1) brought to bytes by one multishift of the block's
    qwords and looked up in the 128-byte sign table by one two-table byte permute (it reads its
    index's low seven bits), where shifting, counting and combining them took about ten
    instructions (IQ2_XXS rows 6-8 % faster with one to four tokens)."""
    v8 = vec(I8, 64)
    shift = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8] * 2),
                                           "llvm.x86.avx512.pmultishift.qb.512")
    # byte 8g + i (i < 4) of the result: bits 32 + 7i .. 39 + 7i of qword g, sign code i of group g
    control = const(I8, [32 + 7 * (k % 8) if k % 8 < 4 else 0 for k in range(64)])
    codes = builder.call(shift, [control, builder.bitcast(words, v8)])
    lookup = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8] * 3),
                                            "llvm.x86.avx512.vpermi2var.qi.512")
    signs = builder.call(lookup, [const(I8, _IQ2_SIGNS[:64]), codes, const(I8, _IQ2_SIGNS[64:])])
    # weight k = 32 g + 8 i + j is bit j of byte 4 g + i once the 32 sign bytes are packed: the
    # packed bytes, read as 256 bits, are the lane mask itself
    packed = shuffle(builder, signs, signs, [8 * (k // 4) + k % 4 for k in range(32)])
    return builder.bitcast(packed, vec(ir.IntType(1), 256))


def iq2_magnitudes_signs(context, builder, grid_type, grid, base, vbmi: bool):
    """An IQ2_XXS block at `base` -> (magnitudes <256 x i8> unsigned, negative <256 x i1>).

    With VBMI both come from tables in registers (_iq2_magnitudes_vbmi, _iq2_signs_vbmi). Without,
    the 32 grid-row loads are scalar, indexed by bytes loaded straight from the block (moving
    indices out of a vector register costs more); the signs are computed for all 256 weights at
    once: 7-bit code j of b_g, plus a parity bit that makes the count of negative signs even."""
    words = load(builder, builder.gep(base, [ir.Constant(I64, 2)]), I32, 16)
    if vbmi:
        return _iq2_magnitudes_vbmi(builder, words), _iq2_signs_vbmi(builder, words)
    table = context.make_array(grid_type)(context, builder, grid).data
    rows64 = ir.Constant(vec(I64, 32), None)
    for k in range(32):
        row = builder.zext(builder.load(builder.gep(base, [ir.Constant(I64, 2 + 8 * (k // 4) + k % 4)])), I64)
        rows64 = builder.insert_element(rows64, builder.load(builder.gep(table, [row])), ir.Constant(I32, k))
    mags = builder.bitcast(rows64, vec(I8, 256))
    b = shuffle(builder, words, words, range(1, 16, 2))
    b32 = shuffle(builder, b, b, [k // 4 for k in range(32)])
    codes = builder.and_(builder.lshr(b32, const(I32, [7 * (k % 4) for k in range(32)])), const(I32, [127] * 32))
    codes = builder.trunc(codes, vec(I8, 32))
    popcount = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I8, 32), [vec(I8, 32)]),
                                              "llvm.ctpop.v32i8")
    parity = builder.and_(builder.call(popcount, [codes]), const(I8, [1] * 32))
    sign_bits = builder.or_(codes, builder.shl(parity, const(I8, [7] * 32)))
    # Bit j of byte k // 8 is weight k's sign: the 32 bytes, read as 256 bits, are the lane mask
    # itself (one mask register per 64 weights where the target has them).
    negative = builder.bitcast(sign_bits, vec(ir.IntType(1), 256))
    return mags, negative


F32, F16 = ir.FloatType(), ir.HalfType()


# ---- the 4-byte dot-product instruction ------------------------------------------------------
VNNI = bool(FEATURES.get("avx512vnni")) and bool(FEATURES.get("avx512bw"))


def dot4(builder, acc, w64, x4):
    """acc <16 x i32> + per lane l: sum over i < 4 of u8 w64[4l+i] * s8 x4[4l+i] (<64 x i8> each)."""
    if VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec(I32, 16), [vec(I32, 16)] * 3), "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, builder.bitcast(w64, vec(I32, 16)), builder.bitcast(x4, vec(I32, 16))])
    prod = builder.mul(builder.zext(w64, vec(I32, 64)), builder.sext(x4, vec(I32, 64)))
    pairs = builder.add(shuffle(builder, prod, prod, range(0, 64, 2)), shuffle(builder, prod, prod, range(1, 64, 2)))
    quads = builder.add(shuffle(builder, pairs, pairs, range(0, 32, 2)), shuffle(builder, pairs, pairs, range(1, 32, 2)))
    return builder.add(acc, quads)


def unit_sums(builder, vecs, unit: int):
    """<P x i32> whose lane u is the sum of the u-th run of `unit` lanes of vecs (<16 x i32>
    each, 16 // unit runs apiece, in order; P: their count rounded up to a power of two, at most
    16; lanes past them zero). Summed in a tree: each level adds the halves of two vectors' runs
    into one vector, then the runs of the last vector are halved in place (about three
    instructions per run of 16, where reducing each alone costs eight). Integer sums: exact."""
    units = len(vecs) * (16 // unit)
    P = 1
    while P < units:
        P *= 2
    assert P <= 16
    zero = ir.Constant(vec(I32, 16), [0] * 16)
    vs = list(vecs) + [zero] * (-(-P * unit // 16) - len(vecs))
    m = unit  # lanes per run in each vector
    while len(vs) > 1:  # pairs of vectors -> one, each run's m lanes halved
        first = [k * m + i for k in range(32 // m) for i in range(m // 2)]
        second = [k * m + m // 2 + i for k in range(32 // m) for i in range(m // 2)]
        vs = [builder.add(shuffle(builder, a, b, first), shuffle(builder, a, b, second))
              for a, b in zip(vs[0::2], vs[1::2], strict=True)]
        m //= 2
    v = vs[0]
    while m > 1:  # one vector of P runs x m lanes -> P x m / 2
        first = [k * m + i for k in range(P) for i in range(m // 2)]
        second = [k * m + m // 2 + i for k in range(P) for i in range(m // 2)]
        v = builder.add(shuffle(builder, v, v, first), shuffle(builder, v, v, second))
        m //= 2
    return v


def count_cases(builder, count, counts, emit, name: str) -> None:
    """One IR body per value of `counts`, chosen by a switch on the integer value `count`
    (another value does nothing): emit(n) writes the body for n, at the builder's position."""
    done = builder.append_basic_block(f"{name}_done")
    switch = builder.switch(count, done)
    for n in counts:
        case = builder.append_basic_block(f"{name}_{n}")
        switch.add_case(ir.Constant(count.type, n), case)
        builder.position_at_end(case)
        emit(n)
        builder.branch(done)
    builder.position_at_end(done)


def splat(builder, value, t, n: int):
    v = builder.insert_element(ir.Constant(vec(t, n), None), value, ir.Constant(I32, 0))
    return shuffle(builder, v, v, [0] * n)


def half_at(builder, base, off: int):
    """The f16 at base + off (bytes), widened to f32 (exact)."""
    p = builder.bitcast(builder.gep(base, [ir.Constant(I64, off)]), F16.as_pointer())
    return builder.fpext(builder.load(p, align=1), F32)


def madd16(builder, a, b):
    """<16 x i32>: lane l = a[2l] * b[2l] + a[2l + 1] * b[2l + 1] (<32 x i16> each): one
    vpmaddwd with AVX-512 BW, generic IR elsewhere (the same integers)."""
    if VNNI:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(I32, 16), [vec(I16, 32)] * 2),
                                            "llvm.x86.avx512.pmaddw.d.512")
        return builder.call(fn, [a, b])
    prod = builder.mul(builder.sext(a, vec(I32, 32)), builder.sext(b, vec(I32, 32)))
    return builder.add(shuffle(builder, prod, prod, range(0, 32, 2)), shuffle(builder, prod, prod, range(1, 32, 2)))
