"""The fast CPU executor: every matrix product on the fast CPU kernels (docs/numerics-fast-cpu.md).

The layer plan is the reference's; its primitives (norms, RoPE, the fp8 simulation, SwiGLU) are
the same steps in numpy on the host (host_ops.HOST: an MLX result read back on the CPU waits
80-100 µs for MLX's stream thread, and every product here reads its input back). Its weights are
built for the fast set (weights.build_weights with kernels="cpu"): dense layers are
fast_linear.FastLinear (8-bit activations and integer block dots for Q8_0, a fixed-order f32
product for F16/F32) and routed experts experts.fast.FastExperts.
What differs from the reference:
  * a layer's routed experts in one call (gate and up from one activation rounding, the SwiGLU
    and the weighting on the host, down, the slot sum in selection order: qmatrix.routed_ffn);
  * attention's output projection A over all groups in one call (FastLinear.grouped);
  * the attention core over exactly the rows each query sees (fast_attention.py) instead of the
    reference's fixed-length masked slot sets;
  * the hyper-connection mixing before and after each sublayer and the router on the host
    (host_mixing.py: numpy, and numba loops for the RMS statistic and the update): as MLX graphs their few thousand floats per token cost far more in
    dispatch than in arithmetic.
Every product of a token runs on all cores, and a prefill chunk multiplies all its tokens per
weight read, so prefill per token is far cheaper than decode.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .. import host_mixing, host_ops
from ..config import ModelConfig
from ..experts.fast import FastExperts, fast_routed_ffn
from ..fast_attention import attend
from ..fast_linear import FastLinear
from ..hostread import to_host
from ..qmatrix import QuantMatrix
from ..weights import AttentionWeights, DenseLayer, FFNWeights, HCWeights
from .reference import ReferenceExecutor


def _host_product(layer: DenseLayer) -> host_mixing.HostProduct:
    """A dense layer's product on host arrays: the fast kernels' own where the layer is a
    FastLinear (the weights of a file), else the layer's MLX product (in-memory test models)."""
    if isinstance(layer, FastLinear) and isinstance(layer.matrix, QuantMatrix):
        return layer.matrix.matmul
    return lambda x: to_host(layer(mx.array(x)), np.float32)


def _host_copies(cache: dict, **arrays: mx.array | None) -> dict:
    """The host copies of a weights object's small arrays, made once and kept in its cache."""
    host = cache.get("host")
    if host is None:
        host = cache["host"] = {k: None if a is None else to_host(a) for k, a in arrays.items()}
    return host


class FastCpuExecutor(ReferenceExecutor):
    name = "cpu"
    ops = host_ops.HOST

    def hc_pre(self, w: HCWeights, R: mx.array, c: ModelConfig) -> tuple[mx.array, mx.array, mx.array]:
        host = _host_copies(w.compiled, scale=w.scale, base=w.base)
        x, post, comb = host_mixing.hc_pre(_host_product(w.fn), host["scale"], host["base"],
                                           to_host(R, np.float32), c)
        return mx.array(x), mx.array(post), mx.array(comb)

    def hc_post(self, R: mx.array, y: mx.array, post: mx.array, C: mx.array) -> mx.array:
        """The reference's R'[j] = post[j]·y + Σ_i C[i][j]·R[i] on the host, in ds4's order
        (host_mixing.hc_post; the next sublayer's mixing reads R' on the host)."""
        return mx.array(host_mixing.hc_post(host_ops.host(R), host_ops.host(y), host_ops.host(post),
                                            host_ops.host(C)))

    def route(self, fw: FFNWeights, c: ModelConfig, layer: int, h: mx.array,
              tokens: mx.array) -> tuple[mx.array, mx.array]:
        host = _host_copies(fw.compiled, bias=fw.bias, tid2eid=fw.tid2eid)
        sel, weights = host_mixing.route(_host_product(fw.gate_inp), host["bias"], host["tid2eid"],
                                         to_host(h, np.float32), to_host(tokens), c, c.is_hash_layer(layer))
        return mx.array(sel), mx.array(weights)

    def attn_front(self, aw: AttentionWeights, c: ModelConfig, rounding: bool, x: mx.array, cos: mx.array,
                   sin: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """The reference's attention front (the same steps through host_ops), host array to host
        array: no MLX node between its products, so nothing waits on MLX's stream thread."""
        host = host_ops.host
        n, eps = x.shape[0], c.rms_eps
        w = _host_copies(aw.compiled, norm=aw.norm, q_a_norm=aw.q_a_norm, kv_norm=aw.kv_norm)
        ch, sh = host(cos), host(sin)
        a = host_ops.rms_norm_np(host(x), w["norm"], eps)
        qr = host_ops.rms_norm_np(_host_product(aw.q_a)(a), w["q_a_norm"], eps)
        q = host_ops.rms_norm_np(_host_product(aw.q_b)(qr).reshape(n, c.n_heads, c.head_dim), None, eps)
        kv = host_ops.rms_norm_np(_host_product(aw.kv)(a), w["kv_norm"], eps)
        host_ops.rope_tail_inplace(q, ch, sh)  # q and kv are this step's own arrays
        host_ops.rope_tail_inplace(kv, ch, sh)
        if rounding:
            kv = host_ops.f16_round_np(host_ops.fp8sim_np(kv, c.nope_dim))
        return mx.array(a), mx.array(qr), mx.array(q), mx.array(kv)

    def attend(self, c: ModelConfig, q: mx.array, k_all: mx.array, r0: int, p0: int, sinks: mx.array,
               comp: mx.array | None, ratio: int, index_inputs=None, trace_masks: list | None = None) -> mx.array:
        """Each query over exactly the rows it sees, on every core (fast_attention.py)."""
        return attend(c, q, k_all, r0, p0, sinks, comp, ratio, index_inputs, trace_masks)

    def out_a(self, aw: AttentionWeights, o: mx.array) -> mx.array:
        if aw.out_a_all is None:
            return super().out_a(aw, o)
        return aw.out_a_all.grouped(o)

    def routed(self, fw: FFNWeights, U: int, clamp: float, h: mx.array, sel: mx.array,
               wts: mx.array) -> mx.array:
        g, u, d = fw.gate_exps, fw.up_exps, fw.down_exps
        if isinstance(g, FastExperts) and isinstance(u, FastExperts) and isinstance(d, FastExperts):
            return fast_routed_ffn(g, u, d, h, sel, wts, clamp)
        return super().routed(fw, U, clamp, h, sel, wts)  # dense test experts
