    // Body of the decode kernel (MLX's cuda_kernel writes the signature: inputs w, x, eids,
    // grid; output out; constants QTYPE, D_IN, D_OUT, BLOCK_BYTES). One warp per (output row,
    // pair): row = global thread x / 32, pair = block y; out[pair, row] = W[eids[pair]][row] . x[pair].
    uint32_t gx = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t lane = threadIdx.x & 31u;
    uint32_t row = gx / 32;
    uint32_t p = blockIdx.y;
    bool live = row < uint32_t(D_OUT);
    float acc = 0.0f;
    if (live) {
        const uint8_t* wrow = w + (uint64_t(eids[p]) * uint64_t(D_OUT) + uint64_t(row)) * uint64_t(D_IN / 256 * BLOCK_BYTES);
        acc = ds4_row_partial(QTYPE, D_IN, BLOCK_BYTES, wrow, x + uint64_t(p) * uint64_t(D_IN), grid, lane);
    }
    for (int o = 16; o > 0; o = o / 2) {
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    }
    if (live && lane == 0) {
        out[uint64_t(p) * uint64_t(D_OUT) + uint64_t(row)] = acc;
    }
