"""Canonical tensor names -> per-layer weight structures (the model's view of a weight file).

`build_weights(config, get)` is the ONE mapping from the spec's GGUF tensor names (model.md §6.3)
to the dataclasses model.py consumes; `get(name)` returns the tensor's value. Both the GGUF
loader (`load_weights(gf, config)`) and the in-memory random weights of ds4agent.testmodels
(`random_weights(config, seed)`) go through it, so the name mapping cannot drift between them.

Name mapping (N = layer; array shapes are row-major = GGML dims reversed):

    token_embd.weight                [V, E]            ModelWeights.token_embd (f16/f32 rows)
    output_hc_fn.weight              [n, n·E]          ModelWeights.head.fn          (Linear)
    output_hc_scale.weight           [1]               ModelWeights.head.scale
    output_hc_base.weight            [n]               ModelWeights.head.base
    output_norm.weight               [E]               ModelWeights.output_norm
    output.weight                    [V, E]            ModelWeights.output           (Linear)
    blk.N.hc_attn_{fn,scale,base}    [mix, n·E],[3],[mix]  layers[N].hc_attn: HCWeights
    blk.N.hc_ffn_{fn,scale,base}                       layers[N].hc_ffn: HCWeights
    blk.N.attn_norm.weight           [E]               layers[N].attn.norm
    blk.N.attn_q_a.weight            [Q, E]            layers[N].attn.q_a            (Linear)
    blk.N.attn_q_a_norm.weight       [Q]               layers[N].attn.q_a_norm
    blk.N.attn_q_b.weight            [H·Dh, Q]         layers[N].attn.q_b            (Linear)
    blk.N.attn_kv.weight             [Dh, E]           layers[N].attn.kv             (Linear)
    blk.N.attn_kv_a_norm.weight      [Dh]              layers[N].attn.kv_norm
    blk.N.attn_sinks.weight          [H]               layers[N].attn.sinks
    blk.N.attn_output_a.weight       [G·O, (H/G)·Dh]   layers[N].attn.out_a (tuple of G row-slice Linears)
    blk.N.attn_output_b.weight       [E, G·O]          layers[N].attn.out_b          (Linear)
    blk.N.attn_compressor_{kv,gate}  [coff·Dh, E]      layers[N].attn.compressor.{kv,gate} (Linear)
    blk.N.attn_compressor_ape        [r, coff·Dh]      layers[N].attn.compressor.ape
    blk.N.attn_compressor_norm       [Dh]              layers[N].attn.compressor.norm
    blk.N.indexer.attn_q_b.weight    [Hi·Di, Q]        layers[N].attn.indexer.q_b    (Linear)
    blk.N.indexer.proj.weight        [Hi, E]           layers[N].attn.indexer.proj   (Linear)
    blk.N.indexer_compressor_*       (as above, Di)    layers[N].attn.indexer.compressor
    blk.N.ffn_norm.weight            [E]               layers[N].ffn.norm
    blk.N.ffn_gate_inp.weight        [n_exp, E]        layers[N].ffn.gate_inp        (Linear)
    blk.N.exp_probs_b.bias           [n_exp] optional  layers[N].ffn.bias
    blk.N.ffn_gate_tid2eid.weight    [V, U] (N < NH)   layers[N].ffn.tid2eid (int32)
    blk.N.ffn_{gate,up,down}_exps    [n_exp, F, E]/[n_exp, E, F]  layers[N].ffn.{gate,up,down}_exps
                                                       (ExpertWeights)
    blk.N.ffn_{gate,up,down}_shexp   [F, E]/[E, F]     layers[N].ffn.{gate,up,down}_shexp (Linear)

Values `get` may return: a numpy/MLX array (dense), a `(wq, scales, biases)` triple (MLX affine
8-bit group 32, i.e. a Q8_0 tensor), a ready `Linear`, or (experts) an `ExpertWeights` object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from . import device, quant
from .config import ModelConfig
from .errors import TensorError, TensorShapeError
from .experts.base import dense_experts, quant_experts
from .fast_linear import FastLinear
from .gguf import GGML_TYPE_IDS
from .hostread import to_int
from .layout import tensor_table

# Quantised products on CPU run one MLX op per CPU stream over a slice of the output rows (see
# device.cpu_streams): a single quantized_matmul uses one core. Slicing output rows changes no
# arithmetic (every output element is the same dot product over the same input row, in the same
# order), so the result is bit-identical to the one-op product (tests/engine/test_ops.py). Only
# products of at least _PARALLEL_MIN_MACS multiply-adds are split: below that, the extra ops cost
# more than a second core gains.
_PARALLEL_MIN_MACS = 1 << 22


class Linear:
    """y = W·x over the last axis of x, W stored [out, in] (array order of a GGML (in, out) tensor).

    Dense: `weight` is an f32 or f16 MLX array [out, in]. F16 stays F16 in memory and is widened
    per call, into a temporary the product consumes: every product in the engine is f32, and
    the widening is exact (f16 -> f32 loses nothing), so the bits equal those of a resident f32
    copy while the resident cost is the file's 2 bytes per weight instead of 4 (at the Flash
    shape that is 2 GiB instead of 4 of the memory plan). The per-call copy is cheap next
    to the product itself. On the CPU device it is stored transposed and contiguous, [in, out],
    and `weight` is a view of that: with the reference BLAS of the Linux mlx[cpu] wheel,
    `x @ Wt` on a contiguous Wt runs ~2.4x faster than `x @ W.T` on the transposed view (same
    products in the same order: bit-identical results, checked in tests/engine/test_ops.py), and
    the memory is the same. On a GPU the [out, in] layout is kept (MLX's Metal mat-vec is tuned
    for it). The stored form is evaluated at construction, so a loader holds at most one
    tensor's conversion temporaries at a time (not the whole model's graph).
    Quantised: `(wq, scales, biases)` of MLX affine 8-bit, group 32 (exact image of Q8_0,
    model.md §7), multiplied with `mx.quantized_matmul` on f32 activations. (The fast CPU kernel
    set multiplies through fast_linear.FastLinear instead: build_weights makes those.)

    `kernels` is the kernel set the weights are built for (device.KERNEL_SETS; default: the one
    device.kernel_set() names now), fixed here. The GPU kernel set widens an F16 matrix once, here, and keeps it as f32:
    a decoded token then reads 4 bytes per weight instead of widening per call (read 2, write 4,
    read 4), for 2 more bytes per weight resident (about 1 GiB at the Flash shape; the memory
    plan counts it). Multiplying it as F16 instead (activations rounded to f16, the product's
    result rounded to f16) was measured: max |dlogit| rose from ~1e-4 to ~1e-2 of max |logit|
    on the test configs and the argmax flipped at near-ties on ~4% of positions, outside the
    GPU contract (tests/engine/test_gpu_kernels.py).
    """

    __slots__ = ("weight", "scales", "biases", "out_features", "in_features", "_wt", "_parts", "_widen",
                 "_cpu", "_kernels")
    weight: mx.array
    scales: mx.array | None
    biases: mx.array | None
    _wt: mx.array | None  # dense only: the stored operand (see above)
    _parts: tuple[tuple[mx.array, mx.array, mx.array], ...]

    def __init__(self, weight: mx.array, scales: mx.array | None = None,
                 biases: mx.array | None = None, *, in_features: int | None = None,
                 kernels: str | None = None):
        self._kernels = kernels or device.kernel_set()
        gpu_set = self._kernels == "gpu"
        if scales is None:
            w = weight if isinstance(weight, mx.array) else mx.array(np.asarray(weight))
            if w.ndim != 2:
                raise ValueError(f"Linear weight must be 2-D, got shape {list(w.shape)}")
            if w.dtype not in (mx.float32, mx.float16):
                w = w.astype(mx.float32)  # e.g. bf16: exact in f32, rare enough to keep widened
            if w.dtype == mx.float16 and gpu_set:
                w = w.astype(mx.float32)  # widened once for the GPU kernel set (class docstring)
            self._widen = w.dtype == mx.float16
            self._cpu = not gpu_set  # the CPU layout (class docstring); the GPU set keeps the GPU's
            if self._cpu:
                self._wt = mx.contiguous(w.T)  # [in, out]: the stored copy (see class docstring)
                self.weight = self._wt.T
            else:
                self.weight = w
                self._wt = w.T
            mx.eval(self._wt)
            self.scales = self.biases = None
            self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])
            self._parts = ()
        else:
            self.weight, self.scales, self.biases = weight, scales, biases
            self._wt = None
            self._widen = self._cpu = False
            self.out_features = int(weight.shape[0])
            self.in_features = int(in_features if in_features is not None else scales.shape[-1] * 32)
            # Row slices for the parallel CPU product (views: no extra memory); whether a call
            # uses them depends on its row count too (a prefill chunk splits more products).
            k = 1 if gpu_set else device.cpu_parts()
            if k > 1 and self.out_features >= 64 * k and biases is not None:
                bounds = [self.out_features * i // k for i in range(k + 1)]
                self._parts = tuple((weight[a:b], scales[a:b], biases[a:b])
                                    for a, b in zip(bounds, bounds[1:], strict=False))
            else:
                self._parts = ()

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    def __call__(self, x: mx.array) -> mx.array:
        wt = self._wt
        if wt is not None:  # dense
            if not self._widen:
                return x @ wt
            # Widen in the stored layout, so the product sees exactly the operand layout a
            # resident f32 copy would have (CPU: contiguous [in, out]; GPU: [out, in] viewed .T).
            if self._cpu:
                return x @ wt.astype(mx.float32)
            return x @ self.weight.astype(mx.float32).T
        if self._parts and (x.size // self.in_features) * self.out_features * self.in_features \
                >= _PARALLEL_MIN_MACS:
            outs = [mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=32, bits=8, stream=st)
                    for (wq, sc, bi), st in zip(self._parts, device.cpu_streams(len(self._parts)), strict=True)]
            return mx.concatenate(outs, axis=-1)
        assert self.scales is not None and self.biases is not None  # quantised: affine 8-bit
        return mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                   group_size=32, bits=8)

    def rows(self, start: int, stop: int) -> Linear:
        """The Linear of output rows start..stop-1 (a view; used for the grouped output LoRA)."""
        kernels = self._kernels
        if self.scales is None:
            return Linear(self.weight[start:stop], kernels=kernels)
        biases = None if self.biases is None else self.biases[start:stop]
        return Linear(self.weight[start:stop], self.scales[start:stop], biases,
                      in_features=self.in_features, kernels=kernels)

    def grouped(self, x: mx.array) -> mx.array:
        """x [n, G, in] -> [n, G·(out/G)]: input group g times output rows g·O..(g+1)·O - 1
        (O = out/G), i.e. the G row-slice products `rows()` gives, as one batched op (the GPU
        kernel set's grouped output LoRA: one kernel launch instead of G products and a concat)."""
        n, groups, d = (int(s) for s in x.shape)
        o = self.out_features // groups
        if self.scales is None:
            w = (self.weight.astype(mx.float32) if self._widen else self.weight).reshape(groups, o, d)
            y = x[:, :, None, :] @ mx.swapaxes(w, -1, -2)
        else:
            assert self.biases is not None  # quantised: affine 8-bit
            idx = mx.broadcast_to(mx.arange(groups, dtype=mx.uint32), (n, groups))
            y = mx.gather_qmm(x[:, :, None, :], self.weight.reshape(groups, o, -1),
                              self.scales.reshape(groups, o, -1), self.biases.reshape(groups, o, -1),
                              rhs_indices=idx, transpose=True, group_size=32, bits=8)
        return y.reshape(n, groups * o)

    def dense(self) -> mx.array:
        """float32 [out, in] (widened or dequantised if needed)."""
        if self.scales is None:
            return self.weight.astype(mx.float32) if self._widen else self.weight
        return mx.dequantize(self.weight, self.scales, self.biases, group_size=32, bits=8)


# A dense layer of the weights: weights.Linear (the reference and GPU kernel sets) or
# fast_linear.FastLinear (the fast CPU set); both are called as f(x) and offer grouped(x).
DenseLayer = Linear | FastLinear

# `compiled`: an executor's compiled functions of these weights (the GPU executor's fused graphs
# capture the weights as constants), owned by the weights they close over so they live and die
# together; never compared or hashed.


@dataclass(frozen=True)
class HCWeights:
    fn: DenseLayer  # n·E -> n(2+n) (layers) or n (output head)
    scale: mx.array  # [3] (layers) or [1] (head)
    base: mx.array  # [n(2+n)] or [n]
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class CompressorWeights:
    kv: DenseLayer  # E -> coff·d
    gate: DenseLayer  # E -> coff·d
    ape: mx.array  # [r, coff·d] f32
    norm: mx.array  # [d]
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class IndexerWeights:
    q_b: DenseLayer  # Q -> Hi·Di
    proj: DenseLayer  # E -> Hi
    compressor: CompressorWeights


@dataclass(frozen=True)
class AttentionWeights:
    norm: mx.array
    q_a: DenseLayer
    q_a_norm: mx.array
    q_b: DenseLayer
    kv: DenseLayer
    kv_norm: mx.array
    sinks: mx.array  # [H]
    out_a: tuple[DenseLayer, ...]  # G row slices of attn_output_a, each (H/G)·Dh -> O
    out_b: DenseLayer
    compressor: CompressorWeights | None  # ratio != 0
    indexer: IndexerWeights | None  # ratio == 4
    out_a_all: DenseLayer | None = None  # attn_output_a whole (the slices are views of it): Linear.grouped
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class FFNWeights:
    norm: mx.array
    gate_inp: DenseLayer
    bias: mx.array | None  # exp_probs_b (selection only)
    tid2eid: mx.array | None  # [V, U] int32 on hash layers
    gate_exps: Any  # ExpertWeights
    up_exps: Any
    down_exps: Any
    gate_shexp: DenseLayer
    up_shexp: DenseLayer
    down_shexp: DenseLayer
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class LayerWeights:
    hc_attn: HCWeights
    hc_ffn: HCWeights
    attn: AttentionWeights
    ffn: FFNWeights


@dataclass(frozen=True)
class ModelWeights:
    """The whole model, or a pipeline rank's part of it (`layer_range`): layers
    first_layer..first_layer+len(layers)-1; the embedding only with layer 0, the head only with
    the last layer (None otherwise)."""

    token_embd: mx.array | None  # [V, E]
    layers: tuple[LayerWeights, ...]
    head: HCWeights | None  # output_hc_{fn,scale,base}
    output_norm: mx.array | None
    output: DenseLayer | None
    first_layer: int = 0
    kernels: str = "reference"  # the kernel set the weights were built for (device.KERNEL_SETS)
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


# ---- building ---------------------------------------------------------------------------------


def _as_linear(name: str, v: Any, shape: tuple[int, int], kernels: str, groups: int = 1) -> DenseLayer:
    """A dense layer of the kernel set `kernels` from what `get` returned (module docstring).
    groups > 1: a matrix multiplied by groups (attention's output projection A), which the fast
    CPU set keeps in its grouped form."""
    lin: DenseLayer
    if isinstance(v, (Linear, FastLinear)):
        lin = v
    elif kernels == "cpu":
        if isinstance(v, tuple):
            wq, scales, biases = v
            lin = FastLinear.from_affine(wq, scales, biases, groups=groups)
        else:
            lin = FastLinear.from_dense(v, groups)
    elif isinstance(v, tuple):
        lin = Linear(*v, in_features=shape[1], kernels=kernels)
    else:
        lin = Linear(v, kernels=kernels)
    got = (lin.out_features, lin.in_features)
    if got != tuple(shape):
        raise TensorShapeError(name, tuple(shape), got)
    return lin


def _as_array(name: str, v: Any, shape: tuple[int, ...] | None, dtype=mx.float32) -> mx.array:
    a = v if isinstance(v, mx.array) else mx.array(np.asarray(v))
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise TensorShapeError(name, tuple(shape), tuple(a.shape))
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    return a


def _as_experts(name: str, v: Any, shape: tuple[int, int, int]) -> Any:
    ex = v if hasattr(v, "gather_matmul") else dense_experts(v)
    got = (ex.n_experts, ex.d_out, ex.d_in)
    if got != tuple(shape):
        raise TensorShapeError(name, tuple(shape), got)
    return ex


def _expert_table(name: str, table: mx.array, n_experts: int) -> mx.array:
    """A hash layer's token -> expert table, its ids checked once here (a host read at load).

    The router's other ids come from a top-k over n_experts scores, in range by construction; so
    with this check no expert id can leave 0..n_experts-1, and the expert backends take device
    ids unchecked (a GPU gather does not bounds-check: a bad id would read foreign memory)."""
    if table.size:
        lo, hi = to_int(mx.min(table)), to_int(mx.max(table))
        if lo < 0 or hi >= n_experts:
            bad = lo if lo < 0 else hi
            raise TensorError(f"tensor {name} maps a token to expert {bad}, outside 0..{n_experts - 1}",
                              tensor=name)
    return table


def build_weights(config: ModelConfig, get: Callable[[str], Any],
                  has: Callable[[str], bool] | None = None,
                  progress: Callable[[float], None] | None = None,
                  layer_range: tuple[int, int] | None = None, kernels: str | None = None) -> ModelWeights:
    """Build ModelWeights from `get(name)` under the canonical names (see module docstring), for
    the kernel set `kernels` (default: device.kernel_set(), read once here; the weights carry it).

    `has(name)` tells whether an optional tensor exists (exp_probs_b); default: try `get` and
    treat KeyError as absent. `layer_range` (start, stop): build only those layers, plus the
    embedding when start is 0 and the output head when stop is the last layer (a pipeline
    rank's part, engine/pipeline/); `get` is never asked for any other tensor.

    One long function on purpose: it is the tensor table read in order, one block per part of a
    layer (attention, compressor, indexer, hyper-connections, router, experts); each block needs
    the same config, getters and layer prefix, which helpers would only pass around.
    """
    c = config
    E, V, H, Dh = c.dim, c.vocab, c.n_heads, c.head_dim
    Q, G, O = c.q_lora_rank, c.out_groups, c.out_lora_rank
    n, mix = c.hc_count, c.hc_mix
    Hi, Di = c.indexer_heads, c.indexer_dim
    NE, U, F = c.n_experts, c.n_experts_used, c.expert_ffn
    kernels = kernels or device.kernel_set()
    fast = kernels == "cpu"

    def opt(name: str) -> Any | None:
        if has is not None:
            return get(name) if has(name) else None
        try:
            return get(name)
        except KeyError:
            return None

    def lin(name: str, shape: tuple[int, int], groups: int = 1) -> DenseLayer:
        return _as_linear(name, get(name), shape, kernels, groups)

    def arr(name: str, shape: tuple[int, ...], dtype=mx.float32) -> mx.array:
        return _as_array(name, get(name), shape, dtype)

    def hc(prefix: str, n_out: int, n_scale: int) -> HCWeights:
        return HCWeights(
            fn=lin(f"{prefix}_fn.weight", (n_out, n * E)),
            scale=arr(f"{prefix}_scale.weight", (n_scale,)),
            base=arr(f"{prefix}_base.weight", (n_out,)),
        )

    def compressor(prefix: str, r: int, coff: int, d: int) -> CompressorWeights:
        return CompressorWeights(
            kv=lin(f"{prefix}_kv.weight", (coff * d, E)),
            gate=lin(f"{prefix}_gate.weight", (coff * d, E)),
            ape=arr(f"{prefix}_ape.weight", (r, coff * d)),
            norm=arr(f"{prefix}_norm.weight", (d,)),
        )

    start, stop = layer_range if layer_range is not None else (0, c.n_layers)
    if not 0 <= start < stop <= c.n_layers:
        raise ValueError(f"layer range {start}..{stop - 1} is outside the model's {c.n_layers} layers")
    layers = []
    for li in range(start, stop):
        b = f"blk.{li}."
        r, coff = c.ratios[li], c.coff(li)
        # The fast CPU set multiplies attn_output_a by groups in one call (its grouped form); the
        # other sets keep G row-slice views beside the whole matrix.
        out_a_full = lin(f"{b}attn_output_a.weight", (G * O, (H // G) * Dh), G if fast else 1)
        attn = AttentionWeights(
            norm=arr(f"{b}attn_norm.weight", (E,)),
            q_a=lin(f"{b}attn_q_a.weight", (Q, E)),
            q_a_norm=arr(f"{b}attn_q_a_norm.weight", (Q,)),
            q_b=lin(f"{b}attn_q_b.weight", (H * Dh, Q)),
            kv=lin(f"{b}attn_kv.weight", (Dh, E)),
            kv_norm=arr(f"{b}attn_kv_a_norm.weight", (Dh,)),
            sinks=arr(f"{b}attn_sinks.weight", (H,)),
            out_a=() if isinstance(out_a_full, FastLinear) else tuple(out_a_full.rows(O * g, O * g + O)
                                                                     for g in range(G)),
            out_a_all=out_a_full,
            out_b=lin(f"{b}attn_output_b.weight", (E, G * O)),
            compressor=compressor(f"{b}attn_compressor", r, coff, Dh) if r != 0 else None,
            indexer=IndexerWeights(
                q_b=lin(f"{b}indexer.attn_q_b.weight", (Hi * Di, Q)),
                proj=lin(f"{b}indexer.proj.weight", (Hi, E)),
                compressor=compressor(f"{b}indexer_compressor", 4, 2, Di),
            ) if r == 4 else None,
        )
        bias = opt(f"{b}exp_probs_b.bias")
        ffn = FFNWeights(
            norm=arr(f"{b}ffn_norm.weight", (E,)),
            gate_inp=lin(f"{b}ffn_gate_inp.weight", (NE, E)),
            bias=_as_array(f"{b}exp_probs_b.bias", bias, (NE,)) if bias is not None else None,
            tid2eid=_expert_table(f"{b}ffn_gate_tid2eid.weight", arr(f"{b}ffn_gate_tid2eid.weight", (V, U), mx.int32),
                                  NE) if c.is_hash_layer(li) else None,
            gate_exps=_as_experts(f"{b}ffn_gate_exps.weight", get(f"{b}ffn_gate_exps.weight"), (NE, F, E)),
            up_exps=_as_experts(f"{b}ffn_up_exps.weight", get(f"{b}ffn_up_exps.weight"), (NE, F, E)),
            down_exps=_as_experts(f"{b}ffn_down_exps.weight", get(f"{b}ffn_down_exps.weight"), (NE, E, F)),
            gate_shexp=lin(f"{b}ffn_gate_shexp.weight", (F, E)),
            up_shexp=lin(f"{b}ffn_up_shexp.weight", (F, E)),
            down_shexp=lin(f"{b}ffn_down_shexp.weight", (E, F)),
        )
        layers.append(LayerWeights(hc_attn=hc(f"{b}hc_attn", mix, 3), hc_ffn=hc(f"{b}hc_ffn", mix, 3),
                                   attn=attn, ffn=ffn))
        if progress is not None:
            progress((li - start + 1) / (stop - start + 1))
    emb = _as_array("token_embd.weight", get("token_embd.weight"), (V, E), dtype=None) if start == 0 else None
    last = stop == c.n_layers
    return ModelWeights(
        token_embd=emb,
        layers=tuple(layers),
        head=hc("output_hc", n, 1) if last else None,
        output_norm=arr("output_norm.weight", (E,)) if last else None,
        output=lin("output.weight", (V, E)) if last else None,
        first_layer=start,
        kernels=kernels,
    )


def tensor_in_range(name: str, config: ModelConfig, layer_range: tuple[int, int]) -> bool:
    """Whether build_weights(..., layer_range=layer_range) reads tensor `name`."""
    start, stop = layer_range
    if name.startswith("blk."):
        return start <= int(name.split(".", 2)[1]) < stop
    if name == "token_embd.weight":
        return start == 0
    return stop == config.n_layers  # output_hc_*, output_norm, output


# ---- GGUF ---------------------------------------------------------------------------------------

_PLAIN = ("F32", "F16")
_ANY_2D = ("F32", "F16", "Q8_0")
_EXPERT_TYPES = ("F16", "F32", "Q8_0", "Q2_K", "Q4_K", "IQ2_XXS", "MXFP4")


def _accepted_types(name: str, ndim: int) -> tuple[str, ...]:
    """The GGML types the loader below accepts for a tensor (its `get` rules, in one place)."""
    if "_exps." in name:
        return _EXPERT_TYPES
    if name.endswith("tid2eid.weight"):
        return ("I32",)
    if name == "token_embd.weight" or name.endswith("_ape.weight"):
        return _PLAIN  # read as plain arrays (embedding rows, APE tables), never as a Linear
    return _ANY_2D if ndim == 2 else _PLAIN


def check_directory(gf, config: ModelConfig) -> None:
    """Every tensor the model needs is present, of an accepted type and of the expected shape.

    Run over the whole tensor directory before any weight is read: a file with a wrong type in
    its last layer must be refused in milliseconds with one line naming the tensor, not after
    minutes of loading (or mid-prefill). The names and shapes are the canonical table
    (layout.tensor_table), which the test-model writers also write and the load round-trip tests
    keep equal to what build_weights reads.
    """
    for spec in tensor_table(config):
        if spec.name.endswith("exp_probs_b.bias") and spec.name not in gf.tensors:
            continue  # optional (model.md §6.3)
        gf.check(spec.name, shape=spec.shape, types=_accepted_types(spec.name, len(spec.shape)))


def load_weights(gf, config: ModelConfig, progress: Callable[[float], None] | None = None,
                 layer_range: tuple[int, int] | None = None, kernels: str | None = None) -> ModelWeights:
    """Load every tensor of `config` (or of `layer_range`, see build_weights) from an open
    GGUFFile (gguf.py), validated by name, for the kernel set `kernels` (as build_weights).

    2-D weights: F32/F16 as dense f32, Q8_0 as MLX affine 8-bit (exact); on the fast CPU set both
    as fast_linear.FastLinear (Q8_0 blocks repacked, F16 kept). Routed experts: F16/F32 dense
    (test models) or raw quantised blocks behind `experts.quant_experts` (on the fast CPU set
    read in place from the map, MXFP4 included; elsewhere MXFP4 re-laid into MLX arrays, whose
    file pages are then dropped like any converted tensor's).
    """
    kernels = kernels or device.kernel_set()
    resident: dict[tuple[int, int], Any] = {}  # expert blocks copied to the device (quant_experts)

    def get(name: str) -> Any:
        ti = gf.info(name)
        value = convert(name, ti)
        if "_exps." in name and ti.type_name not in _PLAIN and value.maps_file():
            return value  # raw blocks stay mapped: only selected experts are read
        # The value is now an MLX copy (mx.array copies host data eagerly; a backend that keeps
        # its expert blocks resident copied them): drop the file pages this read made resident,
        # so the model is not held twice (GGUFFile.release).
        gf.release(name)
        return value

    def convert(name: str, ti) -> Any:
        t = ti.type_name
        if "_exps." in name:
            if t in _PLAIN:
                return gf.load(name, types=_PLAIN, dtype=mx.float32)
            qtype = GGML_TYPE_IDS.get(t)
            if qtype is None or qtype not in quant.ROUTED_TYPES:
                gf.check(name, types=_EXPERT_TYPES)
            assert qtype is not None  # gf.check refused every type that is not an expert type
            return quant_experts(gf.raw(name), qtype, ti.shape, shared=resident,
                                 backend="fast" if kernels == "cpu" else "auto")
        if name.endswith("tid2eid.weight"):
            return gf.load(name, types=("I32",))
        if kernels == "cpu" and len(ti.shape) == 2 and t in _ANY_2D and not name.endswith("_ape.weight") \
                and name != "token_embd.weight":
            groups = config.out_groups if name.endswith("attn_output_a.weight") else 1
            if t == "Q8_0":
                rows, cols = (int(s) for s in ti.shape)
                return FastLinear.from_q8_0_blocks(gf.raw(name), rows, cols, groups)
            gf.check(name, types=("F32", "F16"))
            return FastLinear.from_dense(np.array(gf.numpy(name)), groups)  # a copy: the pages are released
        if t == "Q8_0":
            return quant.load_q8_0(gf, name)
        return gf.load(name, types=_ANY_2D if len(ti.shape) == 2 else ("F32", "F16"))

    def has(name: str) -> bool:
        return name in gf.tensors

    return build_weights(config, get, has=has, progress=progress, layer_range=layer_range, kernels=kernels)
