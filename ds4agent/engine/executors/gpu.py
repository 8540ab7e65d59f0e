"""The GPU executor: MLX's native kernels, few launches per decoded token.

Differs from the reference executor in form, not in the model: MLX's fused RMSNorm and compiled
elementwise chains (ops.FUSED); the hyper-connection mixing, the attention front, the FFN norm
with its router and the output head each compiled whole per layer's weights; one sort for the
router's top-k; slot sums and the grouped output projection as single ops; a layer's gate and up
experts in one call where the backend offers it. Nothing inside a decoded token reads back to the
host, so decode.py can chain token n+1's step before token n is read. It agrees with the reference
within the GPU contract (tests/engine/test_gpu_kernels.py).

The compiled functions capture the weights as constants, so each is cached on the weights object
it closes over (their `compiled` dict): it lives and dies with them, and one executor serves any
number of loaded models.
"""

from __future__ import annotations

import mlx.core as mx

from .. import ops
from ..config import ModelConfig
from ..weights import AttentionWeights, FFNWeights, HCWeights, ModelWeights
from .reference import ReferenceExecutor


def _hc_post(R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
    return post[:, :, None] * y[:, None, :] + mx.swapaxes(C, -1, -2) @ R


_hc_post_fused = ops.fused(_hc_post)


class GpuExecutor(ReferenceExecutor):
    name = "gpu"
    ops = ops.FUSED

    def hc_pre(self, w: HCWeights, R: mx.array, c: ModelConfig) -> tuple[mx.array, mx.array, mx.array]:
        """The norm, the mixing matrix and the whole mixing chain (Sinkhorn included) compiled as
        one function per HCWeights: a decoded token calls it twice per layer."""
        fn = w.compiled.get("hc_pre")
        if fn is None:
            hc, iters, eps = c.hc_count, c.hc_sinkhorn_iters, c.hc_eps
            # Each mixing column's scale (pre, post, comb: scale[0], [1], [2]) as one vector, made
            # once: the same products as scaling each slice, without the per-call slicing.
            col_scale = mx.concatenate([mx.broadcast_to(w.scale[i:i + 1], (m,))
                                        for i, m in enumerate((hc, hc, hc * hc))])
            mx.eval(col_scale)

            def pre(R: mx.array) -> tuple[mx.array, mx.array, mx.array]:
                n, _, E = R.shape
                mix = w.fn(mx.fast.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)) * col_scale + w.base
                pre_w = mx.sigmoid(mix[:, :hc]) + eps
                post = 2.0 * mx.sigmoid(mix[:, hc:2 * hc])
                C = ops.sinkhorn_eager(mix[:, 2 * hc:].reshape(n, hc, hc), iters, eps)
                return mx.sum(pre_w[:, :, None] * R, axis=1), post, C

            fn = w.compiled["hc_pre"] = ops.fused(pre)
        return fn(R)

    def hc_post(self, R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
        return _hc_post_fused(R, y, post, C)

    def attn_front(self, aw: AttentionWeights, c: ModelConfig, rounding: bool, x: mx.array, cos: mx.array,
                   sin: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        key = ("attn_front", rounding)
        fn = aw.compiled.get(key)
        if fn is None:
            front = super().attn_front
            fn = aw.compiled[key] = ops.fused(lambda x, cos, sin: front(aw, c, rounding, x, cos, sin))
        return fn(x, cos, sin)

    def out_a(self, aw: AttentionWeights, o: mx.array) -> mx.array:
        """One batched product over the groups instead of G products and a concatenation."""
        if aw.out_a_all is None:
            return super().out_a(aw, o)
        return aw.out_a_all.grouped(o)

    def top_u(self, score: mx.array, U: int) -> mx.array:
        """One sort instead of 4·U small ops. Its ids are a permutation's, so always in
        0..n_experts-1, even for NaN scores (where the exact rounds would give n_experts); exact
        ties (measure zero for real scores) may pick either index."""
        return mx.argsort(-score, axis=-1)[:, :U].astype(mx.int32)

    def slot_sum(self, v: mx.array) -> mx.array:
        return mx.sum(v, axis=1)

    def ffn_front(self, fw: FFNWeights, c: ModelConfig, layer: int, x: mx.array,
                  tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        fn = fw.compiled.get("ffn_front")
        if fn is None:
            front = super().ffn_front
            fn = fw.compiled["ffn_front"] = ops.fused(lambda x, tokens: front(fw, c, layer, x, tokens))
        return fn(x, tokens)

    def routed(self, fw: FFNWeights, U: int, clamp: float, h: mx.array, sel: mx.array,
               wts: mx.array) -> mx.array:
        pair = getattr(fw.gate_exps, "gather_matmul_with", None)
        # The backend may decline a call (another expert class, or too many pairs for one
        # fused call: a prefill chunk); then gate and up are two calls, as in the reference.
        both = pair(fw.up_exps, h, sel) if pair is not None else None
        if both is None:
            return super().routed(fw, U, clamp, h, sel, wts)
        g, u = both
        mid = self.ops.swiglu(g, u, clamp) * wts[:, :, None]
        return mx.sum(fw.down_exps.gather_matmul(mid, sel), axis=1)

    def output_head(self, w: ModelWeights, c: ModelConfig, R: mx.array) -> mx.array:
        fn = w.compiled.get("output_head")
        if fn is None:
            head = super().output_head
            fn = w.compiled["output_head"] = ops.fused(lambda R: head(w, c, R))
        return fn(R)
