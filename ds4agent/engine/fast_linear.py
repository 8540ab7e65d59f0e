"""The fast CPU kernel set's dense layers: `FastLinear`, the weights.Linear face of qmatrix.

A FastLinear multiplies on the host, through qmatrix's compiled kernels (8-bit activations and
integer block dots for Q8_0 matrices, a fixed-order float32 product for F16/F32 ones: the fast
set's contract, docs/numerics-fast-cpu.md). A call evaluates its input, as every CPU product that
reads ids or values back does; the fast set runs on the CPU device only.

Built from what the loader or the in-memory test models give for a 2-D tensor:
  * the file's Q8_0 blocks (`from_q8_0_blocks`, repacked once: 34 bytes per 32 weights),
  * MLX affine 8-bit arrays that are the exact image of Q8_0 blocks (`from_affine`: the blocks are
    rebuilt bit for bit, see quant.q8_0_to_affine),
  * F16 or F32 arrays (`from_dense`: kept as they are, F16 widened in the kernel).
A grouped product (attention's output projection A, group g's rows taking group g's input) keeps
its rows as an ExpertMatrix with one "expert" per group (`grouped`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from . import quant
from .hostread import to_host
from .qmatrix import ExpertMatrix, QuantMatrix

F32 = mx.float32


def affine_to_q8_0(wq: Any, scales: Any, biases: Any) -> np.ndarray:
    """MLX affine 8-bit group-32 arrays made by quant.q8_0_to_affine -> the Q8_0 blocks they came
    from, uint8 [rows, in/32 * 34] (scale = d exactly, code = byte - 128; d was an f16, so it
    converts back without rounding)."""
    codes = to_host(wq).view(np.uint8)
    rows = codes.shape[0]
    codes = codes.reshape(rows, -1, 32) ^ np.uint8(0x80)
    d = to_host(scales).astype(np.float16).reshape(rows, -1, 1).view(np.uint8)
    if not np.array_equal(to_host(biases), to_host(scales) * np.float32(-128.0)):
        raise ValueError("affine 8-bit weights that are not an exact Q8_0 image have no fast CPU kernel")
    return np.ascontiguousarray(np.concatenate([d, codes], axis=-1)).reshape(rows, -1)


class FastLinear:
    """y = W·x over the last axis of x, on the fast CPU kernels (module docstring)."""

    __slots__ = ("matrix", "groups", "out_features", "in_features")

    def __init__(self, matrix: QuantMatrix | ExpertMatrix, groups: int = 1):
        self.matrix = matrix
        self.groups = int(groups)
        if isinstance(matrix, ExpertMatrix):
            self.out_features, self.in_features = matrix.n_experts * matrix.rows, matrix.cols
        else:
            self.out_features, self.in_features = matrix.rows, matrix.cols

    @classmethod
    def from_q8_0_blocks(cls, raw: Any, rows: int, cols: int, groups: int = 1) -> FastLinear:
        if groups > 1:
            return cls(ExpertMatrix.from_blocks(raw, quant.Q8_0, groups, rows // groups, cols), groups)
        return cls(QuantMatrix.from_blocks(raw, quant.Q8_0, rows, cols))

    @classmethod
    def from_affine(cls, wq: Any, scales: Any, biases: Any, groups: int = 1) -> FastLinear:
        blocks = affine_to_q8_0(wq, scales, biases)
        return cls.from_q8_0_blocks(blocks, blocks.shape[0], blocks.shape[1] // 34 * 32, groups)

    @classmethod
    def from_dense(cls, w: Any, groups: int = 1) -> FastLinear:
        wa = to_host(w) if isinstance(w, mx.array) else np.asarray(w)
        if wa.dtype not in (np.float16, np.float32):
            wa = wa.astype(np.float32)
        # A dense grouped matrix (test models) stays one QuantMatrix: grouped() multiplies its
        # row slices one group at a time (the expert kernels take block types only).
        return cls(QuantMatrix.from_dense(wa), groups)

    @property
    def quantized(self) -> bool:
        return self.matrix.kind != "f32"

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    def __call__(self, x: mx.array) -> mx.array:
        if self.groups > 1 or not isinstance(self.matrix, QuantMatrix):
            raise TypeError("a grouped FastLinear multiplies through grouped()")
        lead = tuple(x.shape[:-1])
        xh = to_host(x if x.dtype == F32 else x.astype(F32), np.float32).reshape(-1, self.in_features)
        # reshaped on the host: an MLX reshape is a graph node that the next read would wait for
        return mx.array(self.matrix.matmul(xh).reshape(*lead, self.out_features))

    def grouped(self, x: mx.array) -> mx.array:
        """x [n, G, in] -> [n, G·(out/G)]: group g's input times group g's rows (weights.Linear.grouped)."""
        return mx.array(self.grouped_host(to_host(x.astype(F32), np.float32)))

    def grouped_host(self, xh: np.ndarray) -> np.ndarray:
        """grouped() on a host array x [n, G, in] float32."""
        n, groups, _ = (int(s) for s in xh.shape)
        if groups != self.groups:
            raise ValueError(f"grouped() of a {self.groups}-group FastLinear got {groups} groups")
        if isinstance(self.matrix, QuantMatrix):
            o = self.out_features // groups
            m = self.matrix
            parts = [QuantMatrix(m.ggml_type, o, m.cols, m.w[g * o:(g + 1) * o], m.aux, 0).matmul(xh[:, g])
                     for g in range(groups)]
            return np.concatenate(parts, axis=-1)
        ids = np.broadcast_to(np.arange(groups, dtype=np.int32), (n, groups))
        return self.matrix.matmul(xh, ids).reshape(n, self.out_features)  # [n, G, O] -> [n, G·O]
