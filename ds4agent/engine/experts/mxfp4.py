"""ds4's native MXFP4 routed experts (the FP4 experts as DeepSeek released them) on MLX's own kernels.

A GGUF tensor of GGML type MXFP4 (39: per 32 weights one E8M0 scale byte and 16 bytes of E2M1
codes) holds exactly what MLX's `mxfp4` quantisation holds: the same codes, the same scale byte.
`Mxfp4Experts` re-lays the file's blocks once at load (quant.mxfp4_to_mlx: a nibble shuffle, no
arithmetic) into MLX's packed codes and scales and multiplies with `mx.gather_qmm(mode="mxfp4")`
on whatever device MLX runs (CPU, Metal, CUDA): no kernel of ours, nothing dequantised at load,
the selected experts read in their 4.25-bit form by every call.

Numerics (docs/numerics-mxfp4.md): the weights are bit-exact (the value of every code is the
one `gguf.quants` gives; tests/weights/test_mxfp4.py); the products are MLX's, which accumulate in
float32 in their own order, so they differ from the in-order float32 product of the dequantised
weights by float32 rounding only. Each (row, slot) is its own 1-row product (MxExperts), so a
row's result does not depend on the rows sharing the call (chunk invariance, model.md §9).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.portable import MxExperts


class Mxfp4Experts(MxExperts):
    """MXFP4 GGUF blocks `raw` ([n_experts, d_out, row_bytes] uint8 or any array of those bytes,
    e.g. a view of the file's memory map) of `shape` (n_experts, d_out, d_in), held as MLX
    `mxfp4` arrays. The mapped bytes are read once here and never again: the caller may drop
    their pages (weights.load_weights does, so the file is not held twice)."""

    qtype = quant.MXFP4

    def __init__(self, raw, shape):
        n_experts, d_out, d_in = (int(s) for s in shape)
        try:
            codes, scales = quant.mxfp4_to_mlx(raw, (n_experts, d_out, d_in))
        except quant.QuantError as err:
            raise EngineError(f"MXFP4 experts [{n_experts}, {d_out}, {d_in}]: {err}") from None
        wq = mx.array(codes)
        del codes  # the host copy goes before the scales are copied: one tensor's transient at a time
        sc = mx.array(scales)
        mx.eval(wq, sc)
        super().__init__(wq, sc, mode="mxfp4", bits=4)

    def maps_file(self) -> bool:
        """Whether calls read the file's mapped bytes (they do not: the blocks were copied)."""
        return False

    @property
    def nbytes(self) -> int:
        return int(self.wq.nbytes + self.scales.nbytes)

    def dequantize(self, experts) -> mx.array:
        """float32 [len(experts), d_out, d_in] of the given experts (MLX's dequantiser: the same
        values as quant.dequantize of the file's blocks; a zero may carry the sign bit)."""
        idx = mx.array(np.asarray(experts, dtype=np.uint32).reshape(-1))
        return mx.dequantize(self.wq[idx], self.scales[idx], group_size=32, bits=4, mode="mxfp4",
                             dtype=mx.float32)
