"""Routed-expert backends: one interface, `gather_matmul(x, expert_ids)`, over four kinds of weights.

    base.py      the ExpertWeights protocol, the call check and the factories (dense_experts,
                 quant_experts: which backend a tensor gets)
    portable.py  MLX backends: DenseExperts (float), MxExperts (MLX microscaled), QuantExperts
                 (raw GGUF blocks, dequantised bit-exactly)
    cpu.py       the CPU path of QuantExperts: compiled kernels (cpu_kernels.py) over raw blocks
    gpu.py       Metal and CUDA kernels for IQ2_XXS / Q2_K / Q4_K (sources in kernels/)
    fast.py      FastExperts: the fast CPU kernel set (8-bit activations, integer dots; qmatrix.py)
    mxfp4.py     ds4's MXFP4 GGUF blocks re-laid as MLX mxfp4, on MLX's gather_qmm (every device)
"""
