// Raw GGUF expert blocks -> float weights, 32 at a time: the part of the expert kernels shared by
// the Metal and the CUDA sources (each prepends its prelude, which defines DS4_FN, DS4_GLOBAL,
// DS4_PRIVATE and ds4_half_bits). Written in the subset docs/gpu-kernel-subset.md allows, which
// the emulation tests (tests/gpu/) check before they compile it as C++ on the CPU.
//
// A "chunk" is 32 consecutive weights of a row: the unit all three layouts share (a Q4_K
// sub-block, two Q2_K sub-blocks, one IQ2_XXS group). Chunk c of a row lies in block c / 8, as
// chunk c % 8 of it (256 weights = 8 chunks). Block layouts: engine/quant.py.
//
// Exactness: every product below is exact in float32 (an f16 mantissa times an integer of at
// most 8 bits) and the K-quants round once, in the final subtraction, whatever FMA contraction
// the compiler picks, so a decoded chunk equals quant.py's dequantisation bit for bit.

// GGML type ids (engine/quant.py): the QTYPE template argument of every expert kernel.
#define DS4_Q2_K 10
#define DS4_Q4_K 12
#define DS4_IQ2_XXS 16

DS4_FN float ds4_f16_at(const DS4_GLOBAL uint8_t* p) {
    return ds4_half_bits(uint32_t(p[0]) | (uint32_t(p[1]) << 8));
}

DS4_FN uint32_t ds4_u32_at(const DS4_GLOBAL uint8_t* p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// Q4_K block (144 bytes): f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes
// of nibbles. Chunk j = sub-block j: its nibbles are bytes 16 + 32*(j/2) .. +31, the low nibble
// for even j, the high one for odd j.
DS4_FN void ds4_chunk_q4_k(const DS4_GLOBAL uint8_t* blk, uint32_t j, DS4_PRIVATE float* w) {
    float d = ds4_f16_at(blk);
    float dmin = ds4_f16_at(blk + 2);
    const DS4_GLOBAL uint8_t* s = blk + 4;
    uint32_t sc;
    uint32_t mn;
    if (j < 4) {
        sc = s[j] & 63u;
        mn = s[4 + j] & 63u;
    } else {
        sc = (s[j + 4] & 15u) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    float dl = d * float(sc);
    float ml = dmin * float(mn);
    const DS4_GLOBAL uint8_t* q = blk + 16 + (j >> 1) * 32;
    uint32_t sh = (j & 1u) * 4u;
    for (uint32_t t = 0; t < 32; t++) {
        w[t] = dl * float((q[t] >> sh) & 15u) - ml;
    }
}

// Q2_K block (84 bytes): 16 scale bytes (low nibble scale, high nibble min, one per 16 weights),
// 64 bytes of 2-bit codes, f16 d, f16 dmin. Weight e = 128*h + 32*s + t has the code
// (qs[32*h + t] >> 2*s) & 3 and sub-block e / 16; chunk j = 4*h + s.
DS4_FN void ds4_chunk_q2_k(const DS4_GLOBAL uint8_t* blk, uint32_t j, DS4_PRIVATE float* w) {
    float d = ds4_f16_at(blk + 80);
    float dmin = ds4_f16_at(blk + 82);
    const DS4_GLOBAL uint8_t* q = blk + 16 + (j >> 2) * 32;
    uint32_t sh = (j & 3u) * 2u;
    for (uint32_t h = 0; h < 2; h++) {
        uint32_t sb = blk[2 * j + h];
        float dl = d * float(sb & 15u);
        float ml = dmin * float(sb >> 4);
        for (uint32_t t = 0; t < 16; t++) {
            uint32_t i = 16 * h + t;
            w[i] = dl * float((q[i] >> sh) & 3u) - ml;
        }
    }
}

// IQ2_XXS block (66 bytes): f16 d, then 8 groups of two u32 (a, b). Group j = chunk j: byte l
// of a picks a row of 8 magnitudes of the grid (an input: the codebook is data, from gguf);
// bits 7l .. 7l+6 of b are a sign code whose eighth sign is its parity (an even number of
// minus signs); bits 28..31 of b are the group's scale.
DS4_FN void ds4_chunk_iq2_xxs(const DS4_GLOBAL uint8_t* blk, uint32_t j, DS4_PRIVATE float* w,
                              const DS4_GLOBAL float* grid) {
    float d = ds4_f16_at(blk);
    const DS4_GLOBAL uint8_t* g = blk + 2 + 8 * j;
    uint32_t b = ds4_u32_at(g + 4);
    float db = d * (0.5f + float(b >> 28)) * 0.25f;
    for (uint32_t l = 0; l < 4; l++) {
        const DS4_GLOBAL float* row = grid + 8 * uint32_t(g[l]);
        uint32_t code = (b >> (7 * l)) & 127u;
        uint32_t parity = code ^ (code >> 4);
        parity = parity ^ (parity >> 2);
        parity = (parity ^ (parity >> 1)) & 1u;
        uint32_t signs = code | (parity << 7);
        for (uint32_t k = 0; k < 8; k++) {
            float mag = db * row[k];
            w[8 * l + k] = ((signs >> k) & 1u) ? -mag : mag;
        }
    }
}

// Chunk j (0..7) of one block of type qtype (a template argument: the branch folds away).
DS4_FN void ds4_chunk(int qtype, const DS4_GLOBAL uint8_t* blk, uint32_t j, DS4_PRIVATE float* w,
                      const DS4_GLOBAL float* grid) {
    if (qtype == DS4_Q4_K) {
        ds4_chunk_q4_k(blk, j, w);
    } else if (qtype == DS4_Q2_K) {
        ds4_chunk_q2_k(blk, j, w);
    } else {
        ds4_chunk_iq2_xxs(blk, j, w, grid);
    }
}

// One lane's share of a row's dot product with x: chunks lane, lane + 32, ... of the row (a
// simdgroup or warp of 32 lanes covers the row; the caller sums the 32 partial sums). Each
// weight byte of the row is read by one lane, once, and no weight is written anywhere.
DS4_FN float ds4_row_partial(int qtype, int d_in, int block_bytes, const DS4_GLOBAL uint8_t* wrow,
                             const DS4_GLOBAL float* x, const DS4_GLOBAL float* grid, uint32_t lane) {
    float acc = 0.0f;
    float wv[32];
    for (uint32_t c = lane; c < uint32_t(d_in / 32); c += 32) {
        ds4_chunk(qtype, wrow + (c >> 3) * uint32_t(block_bytes), c & 7u, wv, grid);
        const DS4_GLOBAL float* xc = x + 32 * c;
        for (uint32_t t = 0; t < 32; t++) {
            acc += wv[t] * xc[t];
        }
    }
    return acc;
}
