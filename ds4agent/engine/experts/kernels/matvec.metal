    // Body of the decode kernel (MLX's metal_kernel writes the signature: inputs w, x, eids,
    // grid; output out; template QTYPE, D_IN, D_OUT, BLOCK_BYTES). One simdgroup per (output
    // row, pair): row = thread x / 32, pair = thread y; out[pair, row] = W[eids[pair]][row] . x[pair].
    uint32_t lane = thread_index_in_simdgroup;
    uint32_t row = thread_position_in_grid.x / 32;
    uint32_t p = thread_position_in_grid.y;
    bool live = row < uint32_t(D_OUT);
    float acc = 0.0f;
    if (live) {
        const device uint8_t* wrow = w + (ulong(eids[p]) * ulong(D_OUT) + ulong(row)) * ulong(D_IN / 256 * BLOCK_BYTES);
        acc = ds4_row_partial(QTYPE, D_IN, BLOCK_BYTES, wrow, x + ulong(p) * ulong(D_IN), grid, lane);
    }
    acc = metal::simd_sum(acc);
    if (live && lane == 0) {
        out[ulong(p) * ulong(D_OUT) + ulong(row)] = acc;
    }
