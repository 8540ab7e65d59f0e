    // Body of the prefill kernel (inputs w, eids, grid; output out [U, D_OUT, D_IN] float32):
    // one thread per chunk of 32 weights of the selected experts (thread x = chunk within the
    // expert, thread y = which selected expert). The caller bounds U (a tile of experts).
    uint32_t c = thread_position_in_grid.x;
    uint32_t u = thread_position_in_grid.y;
    if (c >= uint32_t(D_OUT * (D_IN / 32))) {
        return;
    }
    uint32_t row = c / uint32_t(D_IN / 32);
    uint32_t cc = c % uint32_t(D_IN / 32);
    const device uint8_t* wrow = w + (ulong(eids[u]) * ulong(D_OUT) + ulong(row)) * ulong(D_IN / 256 * BLOCK_BYTES);
    float wv[32];
    ds4_chunk(QTYPE, wrow + (cc >> 3) * uint32_t(BLOCK_BYTES), cc & 7u, wv, grid);
    device float* o = out + (ulong(u) * ulong(D_OUT) + ulong(row)) * ulong(D_IN) + 32 * cc;
    for (uint32_t t = 0; t < 32; t++) {
        o[t] = wv[t];
    }
