"""The fast CPU routed-expert backend: `FastExperts`, the ExpertWeights face of qmatrix.ExpertMatrix.

Activations rounded to 8 bits per block and integer dot products (the fast kernel set's contract,
docs/numerics-fast-cpu.md), on every core; the blocks are used in place (a view of the file's
memory map: only the experts a call selects are read). Chosen with
`quant_experts(..., backend="fast")`; the exact reference stays `QuantExperts` (portable.py).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.portable import check_call
from ds4agent.engine.hostread import to_host
from ds4agent.engine.qmatrix import BLOCK_TYPES, ExpertMatrix

FAST_HOW = "fast CPU kernels"  # what describe() says of this backend


class FastExperts:
    """Raw expert blocks [n_experts, d_out, row_bytes] (IQ2_XXS, Q2_K, Q4_K, Q8_0, MXFP4)."""

    def __init__(self, raw, qtype: int, shape):
        if qtype not in BLOCK_TYPES:
            raise EngineError(f"routed experts of type {quant.type_name(qtype)} are not supported")
        self.qtype = int(qtype)
        self.n_experts, self.d_out, self.d_in = (int(s) for s in shape)
        self.matrix = ExpertMatrix.from_blocks(np.asarray(raw).reshape(-1), self.qtype, self.n_experts,
                                               self.d_out, self.d_in)

    @classmethod
    def keeps_resident(cls) -> bool:
        """The blocks are read in place from the map, never copied to a device array."""
        return False

    def maps_file(self) -> bool:
        """The blocks are read from the file's map for as long as the engine runs."""
        return True

    def describe(self) -> tuple[str, str]:
        return quant.type_name(self.qtype), FAST_HOW

    @property
    def nbytes(self) -> int:
        return self.n_experts * self.d_out * quant.row_bytes(self.qtype, self.d_in)

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        check_call(self, x, expert_ids)
        out = self.matrix.matmul(to_host(x.astype(mx.float32), np.float32), to_host(expert_ids))
        return mx.array(out)

    def gather_matmul_with(self, other: FastExperts, x: mx.array, expert_ids: mx.array) -> tuple[mx.array, mx.array]:
        """(self.gather_matmul(x, ids), other.gather_matmul(x, ids)), bit for bit, from one
        rounding of x and one hand-off to the worker threads (a layer's gate and up)."""
        check_call(self, x, expert_ids)
        a, b = self.matrix.matmul_pair(other.matrix, to_host(x.astype(mx.float32), np.float32), to_host(expert_ids))
        return mx.array(a), mx.array(b)

