    // Body of the prefill kernel (inputs w, eids, grid; output out [U, D_OUT, D_IN] float32):
    // one thread per chunk of 32 weights of the selected experts (global thread x = chunk within
    // the expert, block y = which selected expert). The caller bounds U (a tile of experts).
    uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t u = blockIdx.y;
    if (c >= uint32_t(D_OUT * (D_IN / 32))) {
        return;
    }
    uint32_t row = c / uint32_t(D_IN / 32);
    uint32_t cc = c % uint32_t(D_IN / 32);
    const uint8_t* wrow = w + (uint64_t(eids[u]) * uint64_t(D_OUT) + uint64_t(row)) * uint64_t(D_IN / 256 * BLOCK_BYTES);
    float wv[32];
    ds4_chunk(QTYPE, wrow + (cc >> 3) * uint32_t(BLOCK_BYTES), cc & 7u, wv, grid);
    float* o = out + (uint64_t(u) * uint64_t(D_OUT) + uint64_t(row)) * uint64_t(D_IN) + 32 * cc;
    for (uint32_t t = 0; t < 32; t++) {
        o[t] = wv[t];
    }
