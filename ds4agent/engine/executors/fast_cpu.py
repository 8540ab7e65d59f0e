"""The fast CPU executor: every matrix product on the fast CPU kernels (docs/numerics-fast-cpu.md).

Its layer plan is fast_layers.py: the reference plan's sublayers (layers.py) on host arrays from
end to end, the residual stream and every sublayer's input and output numpy, MLX arrays only for
the session state. Its primitives (norms, RoPE, the fp8 simulation, SwiGLU) are ops.EXACT's steps
in numpy (host_ops.py), the hyper-connection mixing and the router host_mixing.py's. Its weights
are built for the fast set (weights.build_weights with kernels="cpu"): dense layers are
fast_linear.FastLinear (8-bit activations and integer block dots for Q8_0, a fixed-order f32
product for F16/F32) and routed experts experts.fast.FastExperts.
What differs from the reference:
  * a layer's routed experts in one call (gate and up from one activation rounding, the SwiGLU
    and the weighting on the host, down, the slot sum in selection order: qmatrix.routed_ffn);
  * attention's output projection A over all groups in one call (FastLinear.grouped_host);
  * the attention core over exactly the rows each query sees (fast_attention.py) instead of the
    reference's fixed-length masked slot sets;
  * the hyper-connection mixing, the router and the compressor's pooling on the host: as MLX
    graphs their few thousand floats per token cost far more in dispatch than in arithmetic.
Every product of a token runs on all cores, and a prefill chunk multiplies all its tokens per
weight read, so prefill per token is far cheaper than decode. The output head is the
reference's plan on the fast weights (one product a token).
"""

from __future__ import annotations

from typing import Any

from .. import fast_layers, host_ops
from ..config import ModelConfig
from ..layers import Profile, Trace
from ..state import LayerState
from ..weights import AttentionWeights, FFNWeights, HCWeights
from .reference import ReferenceExecutor


class FastCpuExecutor(ReferenceExecutor):
    name = "cpu"
    ops = host_ops.HOST

    def hc_pre(self, w: HCWeights, R: Any, c: ModelConfig) -> tuple[Any, Any, Any]:
        return fast_layers.hc_pre(w, R, c)

    def hc_post(self, R: Any, y: Any, post: Any, C: Any) -> Any:
        """The reference's R'[j] = post[j]·y + Σ_i C[i][j]·R[i] on the host, in ds4's order
        (host_mixing.hc_post); R' stays on the host for the next sublayer."""
        return fast_layers.hc_post(R, y, post, C)

    def attention(self, aw: AttentionWeights, c: ModelConfig, layer: int, x: Any, lay: LayerState, p0: int,
                  rounding: bool, trace: Trace | None, profile: Profile | None = None) -> tuple[Any, LayerState]:
        return fast_layers.attention_block(aw, c, layer, x, lay, p0, rounding, trace, profile)

    def ffn(self, fw: FFNWeights, c: ModelConfig, layer: int, x: Any, tokens: Any, trace: Trace | None,
            profile: Profile | None = None) -> Any:
        return fast_layers.ffn_block(fw, c, layer, x, tokens, trace, profile)
