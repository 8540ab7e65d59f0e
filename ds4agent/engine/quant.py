"""GGUF quant blocks -> MLX: Q8_0 as MLX affine 8-bit, and MLX dequantisers for the expert types.

Block layouts (model.md §7; ne0 = the contiguous input dimension, blocks run along it):

    Q8_0     32 weights / 34 bytes : f16 d, i8 q[32]                        w = d*q
    Q2_K    256 weights / 84 bytes : u8 scales[16], u8 qs[64], f16 d, f16 dmin
             sub-block j (16 weights): w = (d*(scales[j]&15))*q - dmin*(scales[j]>>4), q 2-bit
    Q4_K    256 weights / 144 bytes: f16 d, f16 dmin, u8 scales[12] (8 x 6-bit scale + 6-bit min),
             u8 qs[128]; sub-block j (32 weights): w = (d*sc[j])*q - dmin*mn[j], q 4-bit
    IQ2_XXS 256 weights / 66 bytes : f16 d, then 8 groups of 32 weights, each two u32 (a, b):
             bytes of a = four indices into a 256 x 8 grid of magnitudes {8, 25, 43};
             b = four 7-bit sign codes (bit 7 = parity) + a 4-bit scale in bits 28..31;
             w = d*(0.5 + scale)*0.25 * grid * sign
    MXFP4    32 weights / 17 bytes : u8 e (E8M0), u8 qs[16]; weight j < 16 is the low nibble of
             qs[j], weight j + 16 its high nibble, each an E2M1 code c:
             w = e2m1(c) * 2^(e - 127) (ggml computes kvalue(c) = 2*e2m1(c) times 2^(e - 128))

Why the MLX dequantisers are bit-identical to `gguf.quants` (numpy, float32) even on Metal or
with fused multiply-add: every product above is exact in float32 (an f16 mantissa of 11 bits
times a small integer of at most 8 bits needs at most 19 bits < 24), so the only rounding step is
the final subtraction in the K-quants (one rounding whatever the evaluation order), and IQ2_XXS
and Q8_0 round nowhere at all. Products of exact values also cannot overflow f32 (f16 max 65504). MXFP4 rounds nowhere
either: a power of two times a code of at most 4 significant bits (it overflows to inf only for
e >= 254, as in ggml; `mxfp4_to_mlx` refuses e = 255, which MLX reads as NaN).
"""

from __future__ import annotations

import threading
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ds4agent.engine.errors import EngineError
from ds4agent.engine.gguf import GGML_TYPES
from ds4agent.engine.hostread import to_host

# GGML type ids (model.md §7)
Q8_0 = 8
Q2_K = 10
Q4_K = 12
IQ2_XXS = 16

MXFP4 = 39

EXPERT_TYPES = (Q2_K, Q4_K, IQ2_XXS, Q8_0)  # raw blocks multiplied by experts.portable.QuantExperts
ROUTED_TYPES = (*EXPERT_TYPES, MXFP4)  # every blocked type a routed-expert tensor may have


class QuantError(EngineError):
    """Raw quantised bytes do not fit the declared type/shape."""


def type_name(qtype: int) -> str:
    return GGML_TYPES[qtype].name if qtype in GGML_TYPES else f"GGML type {qtype}"


def block_info(qtype: int) -> tuple[int, int, str]:
    """(weights per block, bytes per block, name) of a GGML type id (the table is gguf.py's)."""
    t = GGML_TYPES[qtype]
    return t.block, t.nbytes, t.name


def row_bytes(qtype: int, n: int) -> int:
    """Bytes of one row of `n` weights (n along ne0) stored as `qtype` blocks."""
    block, size, name = block_info(qtype)
    if n % block:
        raise QuantError(f"a {name} row needs a multiple of {block} weights, got {n}")
    return n // block * size


# ---------------------------------------------------------------------------------------------
# Q8_0 -> MLX affine 8-bit


def q8_0_to_affine(raw: np.ndarray, shape) -> tuple[mx.array, mx.array, mx.array]:
    """Q8_0 bytes of an array-order `shape` (..., out, in) -> (wq, scales, biases) for
    `mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=32, bits=8)`.

    MLX affine: w = scale*u + bias with u an unsigned 8-bit code. Q8_0: w = d*q, q signed.
    With u = q + 128 (= the byte XOR 0x80), scale = d, bias = -128*d: scale*u + bias =
    d*u - 128*d = d*q exactly (both terms exact in f32 and so is their difference, which is the
    representable d*q; only the sign of a zero may differ: -0 becomes +0, the same value in every
    product). Scales/biases are f32: -128*d overflows f16 for |d| > 511.75, and the
    engine's activations are f32 anyway.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise QuantError(f"Q8_0 tensor needs at least 2 dimensions, got {shape}")
    n_in = shape[-1]
    rb = row_bytes(Q8_0, n_in)
    n_rows = int(np.prod(shape[:-1]))
    buf = np.asarray(raw)
    if buf.dtype != np.uint8 or buf.size != n_rows * rb:
        raise QuantError(
            f"Q8_0 data for shape {list(shape)} must be {n_rows * rb} bytes, got {buf.size} ({buf.dtype})"
        )
    blocks = buf.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(*shape[:-1], n_in // 32)
    # One host copy of the codes (flipped in place), then MLX's own copy: at most two transient
    # copies of ONE tensor at a time, none kept (the caller evaluates and releases the mapping).
    codes = np.ascontiguousarray(blocks[:, 2:])
    codes ^= np.uint8(0x80)
    # MLX packs 8-bit codes four to a uint32, element i of a word in bits 8i..8i+7 (little endian),
    # so the byte sequence viewed as little-endian uint32 is exactly its packing.
    wq = codes.reshape(*shape[:-1], n_in).view("<u4")
    return mx.array(wq), mx.array(d), mx.array(d * np.float32(-128.0))


def load_q8_0(gf, name: str, *, shape=None) -> tuple[mx.array, mx.array, mx.array]:
    """A Q8_0 tensor of an open GGUFFile as MLX affine 8-bit, group 32: (wq uint32, scales f32,
    biases f32), validated by type and (row-major) shape first."""
    ti = gf.check(name, shape=shape, types=("Q8_0",))
    return q8_0_to_affine(gf.raw(name), ti.shape)


# ---------------------------------------------------------------------------------------------
# MLX dequantisers: blocks [R, nb, size] uint8 -> float32 [R, nb * weights per block], behind
# `dequantize` (the GPU expert path, references and tests; the CPU expert path decodes blocks in
# its own kernels, experts/cpu.py). Op shapes are chosen for MLX's CPU kernels too: contiguous
# operands, broadcasting a [.., 1] scale along the last axis.


def _f16(b: mx.array, offset: int) -> mx.array:
    """The f16 stored at byte `offset` of every block of b [R, nb, size], as f32 [R, nb, 1]."""
    return mx.view(b[..., offset : offset + 2], mx.float16).astype(mx.float32)


def _dequant_q8_0(b: mx.array) -> mx.array:
    r, nb = b.shape[0], b.shape[1]
    return (_f16(b, 0) * mx.view(b[..., 2:34], mx.int8).astype(mx.float32)).reshape(r, nb * 32)


_Q2_SHIFTS = mx.array(np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1))


def _dequant_q2_k(b: mx.array) -> mx.array:
    r, nb = b.shape[0], b.shape[1]
    scales = b[..., :16]
    dl = (_f16(b, 80) * (scales & 0xF).astype(mx.float32)).reshape(r, nb * 16, 1)
    ml = (_f16(b, 82) * (scales >> 4).astype(mx.float32)).reshape(r, nb * 16, 1)
    # qs[64]: two halves of 32 bytes; in each, the 2-bit fields at shift 0,2,4,6 give 4 x 32
    # consecutive weights. Sub-block j of 16 = (half*4 + shift)*2 + (byte >= 16).
    qs = b[..., 16:80].reshape(r, nb, 2, 1, 32)
    q = ((qs >> _Q2_SHIFTS) & 3).reshape(r, nb * 16, 16).astype(mx.float32)
    return (dl * q - ml).reshape(r, nb * 256)


_Q4_SHIFTS = mx.array(np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1))


def _q4_k_scale_min(b: mx.array) -> tuple[mx.array, mx.array]:
    """Blocks [R, nb, 144] -> 8 six-bit scales and 8 six-bit mins (both [R, nb, 8] uint8).

    Packed in bytes 4..15 as three little-endian words a, b, c (byte i of a word = lane i):
    a: low 6 bits = scale 0..3, top 2 bits = high bits of scale 4..7;
    b: low 6 bits = min 0..3, top 2 bits = high bits of min 4..7;
    c: low nibble = low 4 bits of scale 4..7, high nibble = low 4 bits of min 4..7.
    Unpacked four lanes per uint32 op (the masks keep every shift inside its byte).
    """
    w = mx.view(b, mx.uint32)  # [R, nb, 36]; a 144-byte block keeps words aligned
    a, bb, c = w[..., 1:2], w[..., 2:3], w[..., 3:4]
    sc = mx.concatenate([a & 0x3F3F3F3F, (c & 0x0F0F0F0F) | ((a >> 2) & 0x30303030)], axis=-1)
    mn = mx.concatenate([bb & 0x3F3F3F3F, ((c >> 4) & 0x0F0F0F0F) | ((bb >> 2) & 0x30303030)], axis=-1)
    return mx.view(sc, mx.uint8), mx.view(mn, mx.uint8)


def _dequant_q4_k(b: mx.array) -> mx.array:
    r, nb = b.shape[0], b.shape[1]
    sc, mn = _q4_k_scale_min(b)
    dl = (_f16(b, 0) * sc.astype(mx.float32)).reshape(r, nb * 8, 1)
    ml = (_f16(b, 2) * mn.astype(mx.float32)).reshape(r, nb * 8, 1)
    # qs[128]: four chunks of 32 bytes; low nibbles are sub-block 2c, high nibbles 2c+1.
    qs = b[..., 16:144].reshape(r, nb, 4, 1, 32)
    q = ((qs >> _Q4_SHIFTS) & 15).reshape(r, nb * 8, 32).astype(mx.float32)
    return (dl * q - ml).reshape(r, nb * 256)


@lru_cache(maxsize=1)
def iq2xxs_tables() -> tuple[np.ndarray, np.ndarray]:
    """(grid [256, 8] f32 magnitudes, ksigns [128] u8) of IQ2_XXS.

    The grid is the format's codebook (data, not code): it is taken from the `gguf` package,
    a runtime dependency, which is also our reference for correctness. ksigns maps a 7-bit sign
    code to 8 sign bits: the eighth bit makes the number of negative signs even (parity).
    """
    from gguf.quants import IQ2_XXS as _ref

    _ref.init_grid()
    grid = np.asarray(_ref.grid, dtype=np.float32).reshape(256, 8)
    codes = np.arange(128, dtype=np.uint32)
    parity = np.array([bin(int(c)).count("1") & 1 for c in codes], dtype=np.uint32)
    ksigns = (codes | (parity << 7)).astype(np.uint8)
    return grid, ksigns


@lru_cache(maxsize=1)
def iq2xxs_signed_codes() -> tuple[np.ndarray, mx.array]:
    """The signed grid as int8 [256 * 128, 8]: grid row g with the signs of 7-bit code c at row
    g*128 + c (numpy, and the same table as an MLX array).

    One lookup of 8 signed magnitudes per (grid index, sign code) pair replaces two lookups and a
    multiply; int8 holds them exactly (|value| <= 43) in a quarter of the bytes of f32.
    """
    grid, ksigns = iq2xxs_tables()
    bits = (ksigns[:, None] >> np.arange(8, dtype=np.uint8)[None, :]) & 1  # [128, 8]
    signs = np.where(bits == 0, 1, -1).astype(np.int8)
    table = (grid.astype(np.int8)[:, None, :] * signs[None, :, :]).reshape(256 * 128, 8)
    return table, mx.array(table)


_IQ2_SIGN_SHIFTS = mx.array(np.array([0, 7, 14, 21], dtype=np.uint32))


_COMPILED_CALL = threading.Lock()  # held while a compiled function traces or builds its graph


@mx.compile
def _iq2xxs_index_scale(words: mx.array, d: mx.array) -> tuple[mx.array, mx.array]:
    """words [R, G, 2] uint32 (per group of 32 weights: a = four grid indices, b = four sign codes
    and the scale), d [R, nb, 1] f32 (G = nb*8) -> (index [R, G, 4]: row of the signed table for
    each run of 8 weights, grid*128 + sign code; db [R, G, 1]: the group's scale, exact).
    Compiled: each is one pass instead of one per op (the index is the per-weight cost)."""
    grid = mx.view(words[..., 0:1], mx.uint8).astype(mx.uint32)  # [R, G, 4]: the bytes of a
    b = words[..., 1:2]
    index = ((grid << 7) | ((b >> _IQ2_SIGN_SHIFTS) & 127)).astype(mx.int64)
    r, nb = d.shape[0], d.shape[1]
    db = d * (0.5 + (b >> 28).astype(mx.float32)).reshape(r, nb, 8) * 0.25
    return index, db.reshape(r, nb * 8, 1)


def _dequant_iq2_xxs(b: mx.array, on_device: bool = False) -> mx.array:
    r, nb = b.shape[0], b.shape[1]
    # The 16 words after each block's f16 are not 4-byte aligned: copy them out, as 32 uint16
    # of the 33 in a block (a 66-byte block is 2-byte aligned; half the elements of a byte copy).
    body = mx.view(b.reshape(r, nb * 66), mx.uint16).reshape(r, nb, 33)[..., 1:33]
    words = mx.view(mx.contiguous(body), mx.uint32).reshape(r, nb * 8, 2)
    with _COMPILED_CALL:  # dequantize may run on any thread, and MLX's compile cache is shared
        index, db = _iq2xxs_index_scale(words, _f16(b, 0))
    table, mx_table = iq2xxs_signed_codes()
    if on_device:  # MLX's gather, on the device (no host round trip)
        codes = mx_table[index].reshape(r, nb * 8, 32)
        return (db * codes.astype(mx.float32)).reshape(r, nb * 256)
    # On the CPU (CPU kernel set) the lookup is numpy's `take` (about 7x faster here than MLX's CPU gather, which
    # pays per index) and the codes are widened to f32 as they are copied into MLX (one pass
    # instead of a copy and an astype). The same table, the same values.
    mx.eval(index, db)
    codes_np = np.take(table.view(np.uint64).reshape(-1), to_host(index, view=True)).view(np.int8)
    return (db * mx.array(codes_np.reshape(r, nb * 8, 32), dtype=mx.float32)).reshape(r, nb * 256)


# ggml's doubled E2M1 values by code (code 8 is +0 there, as here: -0 would differ in its bits)
_MXFP4_KVALUES = mx.array(np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32))


def _dequant_mxfp4(b: mx.array) -> mx.array:
    r, nb = b.shape[0], b.shape[1]
    e = b[..., 0:1].astype(mx.uint32)
    # ggml's e8m0 "half" scale 2^(e - 128): subnormal for e < 2 (e = 0 gives 2^-128, not zero)
    bits = mx.where(e < 2, mx.array(0x00200000, mx.uint32) << e, (e - 1) << 23)
    d = mx.view(bits, mx.float32)
    qs = b[..., 1:17]
    codes = mx.concatenate([qs & 15, qs >> 4], axis=-1)
    return (d * _MXFP4_KVALUES[codes]).reshape(r, nb * 32)


_DEQUANT = {Q8_0: _dequant_q8_0, Q2_K: _dequant_q2_k, Q4_K: _dequant_q4_k, IQ2_XXS: _dequant_iq2_xxs,
            MXFP4: _dequant_mxfp4}


# ---------------------------------------------------------------------------------------------
# MXFP4 -> MLX mxfp4: the same codes and scale bytes, re-laid


# Rows re-laid per step: bounds the host temporaries of `mxfp4_to_mlx` (a Flash expert tensor
# is 1.1 GiB; a step is at most 34 MiB of its blocks).
_RELAY_ROWS = 1 << 14


def mxfp4_to_mlx(raw, shape) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 blocks of a tensor with array-order `shape` (..., out, in) -> (wq uint32
    [..., out, in/8], scales uint8 [..., out, in/32]) for MLX's `mode="mxfp4"`, group 32.

    Lossless: MLX's mxfp4 uses the same E2M1 codes and the same E8M0 scale byte (2^(e-127)
    times the code's value, ggml's 2^(e-128) times the doubled value); only the nibble order
    differs. ggml puts weight j < 16 in the low nibble of qs[j] and j + 16 in its high nibble;
    MLX packs weight 2k in the low and 2k+1 in the high nibble of byte k (eight codes per
    little-endian uint32). The one value with two readings, e = 255 (ggml: 2^127; MLX and the
    OCP MX spec: NaN), is refused rather than changed. Re-laid in row chunks into one new
    array per output, so the host holds the result plus one chunk's temporaries.
    """
    shape = tuple(int(s) for s in shape)
    n_in = shape[-1]
    rb = row_bytes(MXFP4, n_in)
    n_rows = int(np.prod(shape[:-1]))
    buf = np.asarray(raw)
    if buf.dtype != np.uint8 or buf.size != n_rows * rb:
        raise QuantError(f"MXFP4 data for shape {list(shape)} must be {n_rows * rb} bytes, got {buf.size} ({buf.dtype})")
    blocks = buf.reshape(n_rows, n_in // 32, 17)
    codes = np.empty((n_rows, n_in // 32, 16), np.uint8)
    scales = np.empty((n_rows, n_in // 32), np.uint8)
    for r0 in range(0, n_rows, _RELAY_ROWS):
        part = np.asarray(blocks[r0 : r0 + _RELAY_ROWS])
        e = part[..., 0]
        if (e == 255).any():
            raise QuantError("MXFP4 block with scale byte 255 (NaN in MX, 2^127 in ggml): the file is corrupt")
        scales[r0 : r0 + len(part)] = e
        even, odd = part[..., 1:17:2], part[..., 2:17:2]  # qs[2k], qs[2k+1]
        out = codes[r0 : r0 + len(part)]
        out[..., :8] = (even & 15) | (odd << 4)  # weights 2k, 2k+1 (low nibbles)
        out[..., 8:] = (even >> 4) | (odd & 0xF0)  # weights 16+2k, 16+2k+1 (high nibbles)
    return codes.reshape(*shape[:-1], n_in // 2).view("<u4"), scales.reshape(*shape[:-1], n_in // 32)


def dequantize(raw: mx.array | np.ndarray, qtype: int, shape, *, on_device: bool | None = None) -> mx.array:
    """Raw blocks of a tensor with array-order `shape` (last dim = ne0) -> float32 `shape`.

    `raw` may have any shape whose byte count matches (e.g. [experts, out, row_bytes]).
    on_device: whether the dequantiser must be MLX ops only (it then reads nothing back and may
    run inside a compiled function: a GPU, or the GPU kernel set on the CPU device); else the
    IQ2_XXS codebook lookup is numpy's, which needs the index on the host. Default: whether MLX
    computes on a GPU.
    """
    if on_device is None:
        on_device = mx.default_device() != mx.cpu
    if qtype not in _DEQUANT:
        raise QuantError(f"no dequantiser for {type_name(qtype)}")
    shape = tuple(int(s) for s in shape)
    block, size, name = block_info(qtype)
    n = int(np.prod(shape))
    raw = raw if isinstance(raw, mx.array) else mx.array(np.asarray(raw))
    if raw.dtype != mx.uint8 or raw.size * block != n * size or shape[-1] % block:
        raise QuantError(f"{name} data of {raw.size} bytes ({raw.dtype}) does not hold shape {list(shape)}")
    r = n // shape[-1]
    blocks = raw.reshape(r, shape[-1] // block, size)
    out = _dequant_iq2_xxs(blocks, on_device) if qtype == IQ2_XXS else _DEQUANT[qtype](blocks)
    return out.reshape(shape)
