"""What a random-weight test file holds and how it is written: value scales, Q8_0 rounding, metadata.

    kind = fill_kind(spec.name)                   # "linear", "norm", "embed", "expert", ...
    values = random_values(spec, cfg, rng)        # float32 (int32 for tid2eid), spec.shape
    data = encode(spec, values)                   # as the file stores it (F16, Q8_0/MXFP4 blocks, ...)
    add_config_metadata(writer, cfg)              # the config's `deepseek4.*` keys, typed as ds4's

Weights are scaled so activations stay O(1) through any depth: every matrix is N(0, 1/fan_in)
(variance-preserving mat-vec), norms are ~1, the hyper-connection mixers are small so the
Sinkhorn mix starts close to uniform, and the routed/shared experts are small so residual
streams grow slowly. Q8_0 tensors are quantised here with a vectorised numpy round-to-nearest
(d = amax/127 as f16), which is all a test file needs: the loader only has to reproduce the
stored d·q exactly.

The values are drawn from one generator in tensor-table order, so the same (config, seed) always
gives the same numbers, whichever writer (writer.py, flash.py) or in-memory builder
(random_weights.py) asks for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ds4agent.engine.config import METADATA_KINDS, ModelConfig
from ds4agent.engine.layout import TensorSpec


def fill_kind(name: str) -> str:
    """How a tensor is filled, from its name: the role decides the scale (module docstring)."""
    if name == "token_embd.weight":
        return "embed"
    if "_exps." in name or "_shexp." in name:
        return "expert"
    if name.endswith("tid2eid.weight"):
        return "tid2eid"
    if name.endswith("exp_probs_b.bias"):
        return "bias"
    if name.endswith("attn_sinks.weight"):
        return "sink"
    if "hc_" in name and name.endswith("_scale.weight"):
        return "hc_scale"
    if "hc_" in name and name.endswith("_base.weight"):
        return "hc_base"
    if ("hc_" in name and name.endswith("_fn.weight")) or name.endswith("_ape.weight"):
        return "small"
    if name.endswith("norm.weight"):
        return "norm"
    return "linear"


def random_values(spec: TensorSpec, cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    """Float values (or ints) for one tensor; see the module docstring for the scales."""
    shape = spec.shape
    fan_in = shape[-1]
    kind = fill_kind(spec.name)
    if kind == "linear":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(fan_in**-0.5)
    if kind == "expert":
        # Experts add into the residual stream of every layer: keep them at half scale.
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5 * fan_in**-0.5)
    if kind == "embed":
        return rng.standard_normal(shape, dtype=np.float32)
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "small":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1 * fan_in**-0.5)
    if kind == "hc_scale":
        return (0.5 + 0.5 * rng.random(shape)).astype(np.float32)
    if kind == "hc_base":
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "sink":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "tid2eid":
        # Hash routing picks U distinct experts per token id: the first U of a random permutation.
        keys = rng.random((shape[0], cfg.n_experts), dtype=np.float32)
        return np.argsort(keys, axis=1, kind="stable")[:, : shape[1]].astype(np.int32)
    raise AssertionError(kind)


def q8_0_blocks(values: np.ndarray) -> np.ndarray:
    """Quantise rows to Q8_0 blocks (d = amax/127 as f16, q = round(w/d)); uint8 [rows, bytes]."""
    rows = int(np.prod(values.shape[:-1]))
    cols = values.shape[-1]
    x = values.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = (amax / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)
    safe = np.where(d32 == 0, 1.0, d32)
    q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    out[:, :, 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(*values.shape[:-1], cols // 32 * 34)


# E2M1 magnitudes by code and the midpoints between neighbours (nearest code by search)
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
_E2M1_MIDS = (_E2M1[1:] + _E2M1[:-1]) / 2


def mxfp4_blocks(values: np.ndarray) -> np.ndarray:
    """Quantise rows to ggml MXFP4 blocks (uint8 [rows, bytes]): per 32 values the E8M0 scale
    2^(floor(log2 amax) - 2) (ggml's choice: amax lands in [4, 8) scale units, codes clip at 6)
    and the nearest E2M1 code of each value; weight j < 16 in the low nibble of byte 1 + j,
    j + 16 in its high nibble. MXFP4 values re-encode to the same blocks (zeros are written +0)."""
    rows = int(np.prod(values.shape[:-1]))
    cols = values.shape[-1]
    x = values.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2 + 127, 0)
    e = np.clip(e, 0, 254).astype(np.uint8)
    mag = np.abs(x) / np.ldexp(np.float32(1), e.astype(np.int32) - 127)
    codes = np.searchsorted(_E2M1_MIDS, mag).astype(np.uint8)
    codes |= ((x < 0) & (codes > 0)).astype(np.uint8) << 3  # a zero is code 0, never -0 (code 8)
    out = np.empty((rows, cols // 32, 17), dtype=np.uint8)
    out[:, :, 0] = e[..., 0]
    out[:, :, 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(*values.shape[:-1], cols // 32 * 17)


def encode(spec: TensorSpec, values: np.ndarray) -> np.ndarray:
    """`values` as the file stores a tensor of spec's type (the plain types, Q8_0 and MXFP4)."""
    if spec.ggml_type == "F32":
        return values.astype(np.float32)
    if spec.ggml_type == "F16":
        return values.astype(np.float16)
    if spec.ggml_type == "I32":
        return values.astype(np.int32)
    if spec.ggml_type == "Q8_0":
        return q8_0_blocks(values)
    if spec.ggml_type == "MXFP4":
        return mxfp4_blocks(values)
    raise AssertionError(spec.ggml_type)


EXTRA_METADATA = {"deepseek4.expert_gating_func": 4}


def add_config_metadata(writer: Any, cfg: ModelConfig) -> None:
    """The config's `deepseek4.*` keys on a gguf.GGUFWriter, each of the GGUF type ds4 writes."""
    from gguf import GGUFValueType as VT

    kinds = {"u32": VT.UINT32, "f32": VT.FLOAT32, "bool": VT.BOOL}
    for key, value in cfg.to_metadata().items():
        kind = METADATA_KINDS.get(key, "u32")
        if kind == "u32_array":
            writer.add_key_value(key, [int(v) for v in value], VT.ARRAY, sub_type=VT.UINT32)
        elif kind == "f32_array":
            writer.add_key_value(key, [float(v) for v in value], VT.ARRAY, sub_type=VT.FLOAT32)
        elif kind == "bool":
            writer.add_key_value(key, bool(value), VT.BOOL)
        elif kind == "f32":
            writer.add_key_value(key, float(value), VT.FLOAT32)
        else:
            writer.add_key_value(key, int(value), kinds[kind])
    # Keys ds4 does not read but llama.cpp-family loaders require of a DeepSeek-V4 file: the MoE
    # scoring function (4: sqrt-softplus, what the router computes). Without it ik_llama.cpp
    # refuses the file ("expects sqrtsoftplus MoE scoring"), and it cannot be a side-by-side peer.
    for key, value in EXTRA_METADATA.items():
        writer.add_key_value(key, value, VT.UINT32)
