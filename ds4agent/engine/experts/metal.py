"""Metal kernels for routed experts in IQ2_XXS, Q2_K and Q4_K (macOS, `mx.fast.metal_kernel`).

Selected by `experts.base.quant_experts()` only where `mx.metal.is_available()`; elsewhere this module
is never imported for use (tests/weights/test_metal.py runs it wherever a Metal device exists).

Two kernels per type, both built on one device function that dequantises a "chunk" of 32
consecutive weights of a row (the unit all three layouts share: a Q4_K sub-block, two Q2_K
sub-blocks, one IQ2_XXS group):
  * `matvec`: one simdgroup (32 threads) per (output row, pair); lane l handles chunks l, l+32, ...
    of the row, dequantising in registers, and `simd_sum` reduces. Used for decode and small
    batches: it reads each selected weight byte once and never writes a dequantised weight.
  * `dequant`: one thread per chunk writes float32 weights of the selected experts; larger
    prefill chunks then multiply with `mx.gather_mm` (a dequantised expert serves many rows).

Exactness: the chunk dequantisation performs the same float32 operations as quant.py (every
product exact, one rounding in the K-quant subtraction, whatever FMA contraction the compiler
picks), so `dequant` equals gguf's numpy dequantisation bit for bit; `matvec` differs from
dequantise-then-matmul only in summation order (f32 tolerance).
"""

from __future__ import annotations

from functools import cache, lru_cache

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.portable import QuantExperts, check_call
from ds4agent.engine.hostread import to_host

_HEADER = r"""
inline float ds4_f16(const device uint8_t* p) {
    return float(as_type<half>(ushort(ushort(p[0]) | (ushort(p[1]) << 8))));
}
inline uint ds4_u32(const device uint8_t* p) {
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}

// Q4_K block (144 bytes): f16 d, f16 dmin, 12 packed scale bytes, 128 bytes of nibbles.
// Chunk j (0..7) = sub-block j: nibbles in bytes 16 + 32*(j/2) .. +31, low nibble for even j.
inline void ds4_chunk_q4_k(const device uint8_t* blk, uint j, thread float* w,
                           const device float* grid, const device uint8_t* ksigns) {
    float d = ds4_f16(blk);
    float dmin = ds4_f16(blk + 2);
    const device uint8_t* s = blk + 4;
    uint sc, mn;
    if (j < 4) {
        sc = s[j] & 63u;
        mn = s[4 + j] & 63u;
    } else {
        sc = (s[8 + j - 4] & 15u) | ((s[j - 4] >> 6) << 4);
        mn = (s[8 + j - 4] >> 4) | ((s[4 + j - 4] >> 6) << 4);
    }
    float dl = d * float(sc);
    float ml = dmin * float(mn);
    const device uint8_t* q = blk + 16 + (j >> 1) * 32;
    uint sh = (j & 1u) * 4u;
    for (uint t = 0; t < 32; t++) {
        w[t] = dl * float((q[t] >> sh) & 15u) - ml;
    }
}

// Q2_K block (84 bytes): 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit
// codes, f16 d, f16 dmin. Weight e = 128*h + 32*s + t has code (qs[32*h + t] >> 2s) & 3 and
// sub-block e/16; chunk j = 4h + s.
inline void ds4_chunk_q2_k(const device uint8_t* blk, uint j, thread float* w,
                           const device float* grid, const device uint8_t* ksigns) {
    float d = ds4_f16(blk + 80);
    float dmin = ds4_f16(blk + 82);
    const device uint8_t* q = blk + 16 + (j >> 2) * 32;
    uint sh = (j & 3u) * 2u;
    for (uint half_ = 0; half_ < 2; half_++) {
        uint sb = blk[2 * j + half_];
        float dl = d * float(sb & 15u);
        float ml = dmin * float(sb >> 4);
        for (uint t = 0; t < 16; t++) {
            uint i = 16 * half_ + t;
            w[i] = dl * float((q[i] >> sh) & 3u) - ml;
        }
    }
}

// IQ2_XXS block (66 bytes): f16 d, then 8 groups of (u32 a, u32 b). Group j = chunk j:
// byte l of a indexes a grid row of 8 magnitudes; bits 7l..7l+6 of b are a sign code (via
// ksigns to 8 sign bits); bits 28..31 of b are the group scale.
inline void ds4_chunk_iq2_xxs(const device uint8_t* blk, uint j, thread float* w,
                              const device float* grid, const device uint8_t* ksigns) {
    float d = ds4_f16(blk);
    const device uint8_t* g = blk + 2 + 8 * j;
    uint b = ds4_u32(g + 4);
    float db = d * (0.5f + float(b >> 28)) * 0.25f;
    for (uint l = 0; l < 4; l++) {
        const device float* row = grid + 8 * uint(g[l]);
        uint sg = ksigns[(b >> (7 * l)) & 127u];
        for (uint k = 0; k < 8; k++) {
            float mag = db * row[k];
            w[8 * l + k] = ((sg >> k) & 1u) ? -mag : mag;
        }
    }
}
"""

# Chunk c of a row: block c/8, chunk c%8 within the block (256 weights = 8 chunks of 32).
_MATVEC = r"""
    uint lane = thread_position_in_threadgroup.x;
    uint row = threadgroup_position_in_grid.x;
    uint p = threadgroup_position_in_grid.y;
    const device uint8_t* wrow = w + ((ulong)eids[p] * D_OUT + row) * ROW_BYTES;
    const device float* xr = x + (ulong)p * D_IN;
    float acc = 0.0f;
    float wv[32];
    for (uint c = lane; c < D_IN / 32; c += 32) {
        CHUNK(wrow + (c >> 3) * BLOCK_BYTES, c & 7u, wv, grid, ksigns);
        const device float* xc = xr + 32 * c;
        for (uint t = 0; t < 32; t++) {
            acc += wv[t] * xc[t];
        }
    }
    acc = metal::simd_sum(acc);
    if (lane == 0) {
        out[(ulong)p * D_OUT + row] = acc;
    }
"""

_DEQUANT = r"""
    uint c = thread_position_in_grid.x;       // chunk within the expert
    uint u = thread_position_in_grid.y;       // which selected expert
    if (c >= D_OUT * (D_IN / 32)) return;
    uint row = c / (D_IN / 32);
    uint cc = c % (D_IN / 32);
    const device uint8_t* wrow = w + ((ulong)eids[u] * D_OUT + row) * ROW_BYTES;
    float wv[32];
    CHUNK(wrow + (cc >> 3) * BLOCK_BYTES, cc & 7u, wv, grid, ksigns);
    device float* o = out + ((ulong)u * D_OUT + row) * D_IN + 32 * cc;
    for (uint t = 0; t < 32; t++) {
        o[t] = wv[t];
    }
"""

_CHUNK_FN = {quant.Q4_K: "ds4_chunk_q4_k", quant.Q2_K: "ds4_chunk_q2_k", quant.IQ2_XXS: "ds4_chunk_iq2_xxs"}
METAL_TYPES = tuple(_CHUNK_FN)


@cache
def _kernel(qtype: int, kind: str):
    body = (_MATVEC if kind == "matvec" else _DEQUANT).replace("CHUNK", _CHUNK_FN[qtype])
    return mx.fast.metal_kernel(
        name=f"ds4_{kind}_{quant.type_name(qtype).lower()}",
        input_names=["w", "x", "eids", "grid", "ksigns"] if kind == "matvec" else ["w", "eids", "grid", "ksigns"],
        output_names=["out"],
        source=body,
        header=_HEADER,
    )


@lru_cache(maxsize=1)
def _tables() -> tuple[mx.array, mx.array]:
    grid, ksigns = quant.iq2xxs_tables()
    return mx.array(grid.reshape(-1)), mx.array(ksigns)


# Rows per call up to which the mat-vec kernel runs (it re-decodes an expert's blocks for every
# (row, slot) pair; above this, dequantising each selected expert once and multiplying wins).
# Decided from the call's shape alone, so the ids are never read back: with k slots, n rows give
# at most n*k pairs over at least k distinct experts, i.e. at most n pairs per expert, which is
# what the earlier per-call rule (at most 4 pairs per distinct expert) allowed at n <= 4.
MATVEC_MAX_ROWS = 4


@cache
def self_check(qtype: int) -> str | None:
    """Run both kernels once on fixed random blocks against the portable dequantiser (bit-exact)
    and a dense product (f32 tolerance). None if they agree, else a one-line reason. Cached per
    type: `quant_experts` falls back to the portable backend instead of running a kernel that a
    driver or compiler version miscompiles."""
    try:
        rng = np.random.default_rng(12345)
        e, d_out, d_in = 2, 4, 512
        block, size, name = quant.block_info(qtype)
        raw = rng.integers(0, 256, size=(e * d_out * d_in // block, size), dtype=np.uint8)
        for off in {quant.Q2_K: (80, 82), quant.Q4_K: (0, 2), quant.IQ2_XXS: (0,)}[qtype]:
            raw[:, off : off + 2] = np.full((len(raw), 1), np.float16(0.01)).view(np.uint8)
        raw = raw.reshape(e, d_out, d_in // block * size)
        ex = MetalExperts(raw, qtype, (e, d_out, d_in))
        want = to_host(quant.dequantize(mx.array(raw), qtype, (e, d_out, d_in)))
        got = to_host(ex.dequantize([0, 1]))
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return f"the {name} Metal dequantiser disagrees with the portable one"
        x = rng.standard_normal((1, d_in)).astype(np.float32)
        y = to_host(ex.matvec(mx.array(np.repeat(x, 2, 0)), mx.array([0, 1])))
        ref = np.einsum("eoi,i->eo", want.astype(np.float64), x[0].astype(np.float64))
        if not np.abs(y - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()):
            return f"the {name} Metal mat-vec disagrees with the dense product"
    except Exception as err:  # compile or dispatch failure: report, never crash the engine
        return f"the {quant.type_name(qtype)} Metal kernels failed: {err}"
    return None


class MetalExperts(QuantExperts):
    """Routed experts as raw blocks resident in MLX (GPU) memory, multiplied by Metal kernels."""

    def __init__(self, raw, qtype: int, shape, **kw):
        if qtype not in METAL_TYPES:
            raise EngineError(f"no Metal kernel for {quant.type_name(qtype)} experts")
        if not mx.metal.is_available():
            raise EngineError("the Metal expert backend needs a Metal GPU (mx.metal.is_available() is false)")
        super().__init__(raw, qtype, shape, **kw)
        self._template = [
            ("D_IN", self.d_in), ("D_OUT", self.d_out),
            ("ROW_BYTES", quant.row_bytes(self.qtype, self.d_in)),
            ("BLOCK_BYTES", quant.block_info(self.qtype)[1]),
        ]

    @classmethod
    def keeps_resident(cls) -> bool:
        # The kernels index the whole tensor by expert id: it must live in an MLX buffer, on
        # either kernel set.
        return True

    def describe(self) -> tuple[str, str]:
        return quant.type_name(self.qtype), "Metal kernels"

    def dequantize(self, experts) -> mx.array:
        """float32 [len(experts), d_out, d_in]; `experts` a list/numpy array or device ids."""
        if isinstance(experts, mx.array):
            eids = experts.reshape(-1).astype(mx.uint32)
        else:
            eids = mx.array(np.asarray(experts, dtype=np.uint32).reshape(-1))
        n_chunks = self.d_out * (self.d_in // 32)
        grid, ksigns = _tables()
        (out,) = _kernel(self.qtype, "dequant")(
            inputs=[self.raw, eids, grid, ksigns],
            template=self._template,
            grid=(-(-n_chunks // 256) * 256, int(eids.size), 1),
            threadgroup=(256, 1, 1),
            output_shapes=[(int(eids.size), self.d_out, self.d_in)],
            output_dtypes=[mx.float32],
        )
        return out

    def matvec(self, x: mx.array, eids: mx.array) -> mx.array:
        """x [P, d_in] float32, eids [P] -> [P, d_out]: row p = W[eids[p]] @ x[p]."""
        grid, ksigns = _tables()
        p = int(x.shape[0])
        (out,) = _kernel(self.qtype, "matvec")(
            inputs=[self.raw, x.astype(mx.float32), eids.astype(mx.uint32), grid, ksigns],
            template=self._template,
            grid=(32 * self.d_out, p, 1),
            threadgroup=(32, 1, 1),
            output_shapes=[(p, self.d_out)],
            output_dtypes=[mx.float32],
        )
        return out

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        """Decode and small batches: the mat-vec kernel on the router's device ids (nothing is
        read back, no range check: the router cannot give an out-of-range id, see
        weights._expert_table). Larger calls: dequantise (Metal kernel) + gather_mm."""
        n, k = check_call(self, x, expert_ids)
        if n > MATVEC_MAX_ROWS:
            return super().gather_matmul(x, expert_ids)
        xs = x[:, None, :] if x.ndim == 2 else x
        xs = mx.broadcast_to(xs, (n, k, self.d_in)).reshape(n * k, self.d_in)
        return self.matvec(xs, expert_ids.reshape(-1)).reshape(n, k, self.d_out)
