"""The reference executor: the exact float32 path of model.md §4, bit-exact and chunk-invariant.

The steps of a layer whose form depends on the kernel set, in their exact form: hyper-connection
mixing (§4.1-4.2), the attention input's norms and projections, the grouped output projection A,
the router (§4.6: exact top-k by U rounds of max, weights summed in selection order), the routed
and shared experts (slots summed in selection order) and the output head (§4.7). The shared
layer plan (layers.py) calls these through the executor it is given; the oracle, chunk-invariance
and exact-resume tests run on this one. The fast CPU and GPU executors derive from it and replace
what their kernel sets do differently.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .. import ops
from ..config import ModelConfig
from ..layers import Profile, Trace, attention_block, attention_core, ffn_block
from ..ops import OpSet
from ..state import LayerState
from ..weights import AttentionWeights, FFNWeights, HCWeights, ModelWeights

NEG_INF = float("-inf")


class ReferenceExecutor:
    name = "reference"
    ops: OpSet = ops.EXACT

    # ---- hyper-connections ------------------------------------------------------------------

    def hc_pre(self, w: HCWeights, R: mx.array, c: ModelConfig) -> tuple[mx.array, mx.array, mx.array]:
        """R [n, hc, E] -> (sublayer input x [n, E], post [n, hc], comb C [n, hc, hc]) (§4.1)."""
        n, hc, E = R.shape
        flat = self.ops.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)
        mix = w.fn(flat)
        s, b = w.scale, w.base
        pre = mx.sigmoid(mix[:, :hc] * s[0] + b[:hc]) + c.hc_eps
        post = 2.0 * mx.sigmoid(mix[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
        comb = (mix[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(n, hc, hc)
        C = ops.sinkhorn(comb, c.hc_sinkhorn_iters, c.hc_eps)
        return mx.sum(pre[:, :, None] * R, axis=1), post, C

    def hc_post(self, R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
        """R'[j] = post[j]·y + Σ_i C[i][j]·R[i] (§4.2)."""
        return post[:, :, None] * y[:, None, :] + mx.swapaxes(C, -1, -2) @ R

    # ---- attention ----------------------------------------------------------------------------

    def attn_front(self, aw: AttentionWeights, c: ModelConfig, rounding: bool, x: mx.array, cos: mx.array,
                   sin: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """The attention input's norms and projections: (a, q_a rows, roped q, roped kv row)."""
        xo, n, eps = self.ops, x.shape[0], c.rms_eps
        a = xo.rms_norm(x, aw.norm, eps)
        qr = xo.rms_norm(aw.q_a(a), aw.q_a_norm, eps)
        q = xo.rms_norm(aw.q_b(qr).reshape(n, c.n_heads, c.head_dim), None, eps)
        kv = xo.rms_norm(aw.kv(a), aw.kv_norm, eps)
        q = xo.rope_tail(q, cos, sin)
        kv = xo.rope_tail(kv, cos, sin)
        if rounding:
            kv = ops.f16_round(xo.fp8sim(kv, c.nope_dim))
        return a, qr, q, kv

    def attend(self, c: ModelConfig, q: mx.array, k_all: mx.array, r0: int, p0: int, sinks: mx.array,
               comp: mx.array | None, ratio: int, index_inputs=None, trace_masks: list | None = None) -> mx.array:
        """The attention core (layers.attention_core: fixed-length masked slot sets)."""
        return attention_core(c, q, k_all, r0, p0, sinks, comp, ratio, index_inputs, trace_masks)

    def attention(self, aw: AttentionWeights, c: ModelConfig, layer: int, x: mx.array, lay: LayerState, p0: int,
                  rounding: bool, trace: Trace | None, profile: Profile | None = None) -> tuple[Any, LayerState]:
        """The attention sublayer on the HC-pre input x [n, E] -> (y [n, E], the layer's new state):
        the shared plan (layers.attention_block) on this executor's steps."""
        return attention_block(self, aw, c, layer, x, lay, p0, rounding, trace, profile)

    def ffn(self, fw: FFNWeights, c: ModelConfig, layer: int, x: mx.array, tokens: mx.array, trace: Trace | None,
            profile: Profile | None = None) -> Any:
        """The MoE sublayer on the HC-pre input x [n, E] -> y [n, E] (layers.ffn_block)."""
        return ffn_block(self, fw, c, layer, x, tokens, trace, profile)

    def out_a(self, aw: AttentionWeights, o: mx.array) -> mx.array:
        """Output projection A by groups: o [n, G, (H/G)·Dh] -> [n, G·O], group g's slice of
        rows on group g's heads, one product per group (each a plain product, as exact as any)."""
        return mx.concatenate([lin(o[:, g]) for g, lin in enumerate(aw.out_a)], axis=-1)

    # ---- MoE ----------------------------------------------------------------------------------

    def top_u(self, score: mx.array, U: int) -> mx.array:
        """Indices [n, U] of the U largest entries per row, by descending score, ties to the lower
        index (exact: U rounds of max + lowest index attaining it)."""
        ne = score.shape[-1]
        ar = mx.arange(ne, dtype=mx.int32)
        picks = []
        s = score
        for _ in range(U):
            m = mx.max(s, axis=-1, keepdims=True)
            j = mx.min(mx.where(s == m, ar, ne), axis=-1)
            picks.append(j)
            s = mx.where(ar[None, :] == j[:, None], NEG_INF, s)
        return mx.stack(picks, axis=-1)

    def slot_sum(self, v: mx.array) -> mx.array:
        """Σ over axis 1 (the U selected slots) in selection order, by explicit additions."""
        total = v[:, 0]
        for k in range(1, v.shape[1]):
            total = total + v[:, k]
        return total

    def route(self, fw: FFNWeights, c: ModelConfig, layer: int, h: mx.array,
              tokens: mx.array) -> tuple[mx.array, mx.array]:
        """Router (§4.6): (selected experts [n, U] int32, their weights [n, U])."""
        prob = mx.sqrt(self.ops.softplus(fw.gate_inp(h)))
        if c.is_hash_layer(layer):
            assert fw.tid2eid is not None  # every hash layer has its table
            sel = fw.tid2eid[tokens]  # router bias unused on hash layers
        else:
            sel = self.top_u(prob + fw.bias if fw.bias is not None else prob, c.n_experts_used)
        sel = sel.astype(mx.int32)
        pw = mx.take_along_axis(prob, sel, axis=-1)  # [n, U]
        total = self.slot_sum(pw)
        return sel, pw / mx.maximum(total, 6.103515625e-5)[:, None] * c.expert_weights_scale

    def ffn_front(self, fw: FFNWeights, c: ModelConfig, layer: int, x: mx.array,
                  tokens: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The FFN norm and the router: (h, selected experts, their weights)."""
        h = self.ops.rms_norm(x, fw.norm, c.rms_eps)
        return (h, *self.route(fw, c, layer, h, tokens))

    def routed(self, fw: FFNWeights, U: int, clamp: float, h: mx.array, sel: mx.array,
               wts: mx.array) -> mx.array:
        """The routed experts of h [n, E] -> [n, E], slots summed in selection order."""
        g = fw.gate_exps.gather_matmul(h, sel)
        u = fw.up_exps.gather_matmul(h, sel)
        mid = self.ops.swiglu(g, u, clamp) * wts[:, :, None]  # [n, U, F]
        return self.slot_sum(fw.down_exps.gather_matmul(mid, sel))  # [n, U, E] -> [n, E]

    def shared(self, fw: FFNWeights, clamp: float, h: mx.array) -> mx.array:
        return fw.down_shexp(self.ops.swiglu(fw.gate_shexp(h), fw.up_shexp(h), clamp))

    # ---- head ---------------------------------------------------------------------------------

    def output_head(self, w: ModelWeights, c: ModelConfig, R: mx.array) -> mx.array:
        """§4.7: HC head + output norm + output projection; R [n, hc, E] -> logits [n, V]."""
        n, hc, E = R.shape
        xo = self.ops
        assert w.head is not None and w.output is not None  # weights that include the last layer
        flat = xo.rms_norm(R.reshape(n, hc * E), None, c.rms_eps)
        pre = w.head.fn(flat)
        wts = mx.sigmoid(pre * w.head.scale[0] + w.head.base) + c.hc_eps
        e = mx.sum(wts[:, :, None] * R, axis=1)
        return w.output(xo.rms_norm(e, w.output_norm, c.rms_eps))
