"""The random test weights in memory: the exact values make_test_model writes, without a file.

    tensors = random_tensors(cfg, seed)          # name -> numpy array (F16 / dequantised Q8_0 / I32)
    weights = weights_from_tensors(cfg, tensors) # ModelWeights through the engine's build_weights
    tensors = random_tensors(cfg, seed, experts="mxfp4")   # the routed experts' MXFP4 values
    weights = random_weights(cfg, seed)          # both at once

For the engine's tests and the numpy oracle: an engine built from these equals one loaded from
the written file, because both draw from values.py in the same order and both go through
engine.weights.build_weights (the one name -> weight-structure mapping).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.config import ModelConfig
from ds4agent.engine.device import kernel_set
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.layout import tensor_table
from ds4agent.engine.quant import q8_0_to_affine
from ds4agent.engine.weights import ModelWeights, build_weights

from .values import mxfp4_blocks, q8_0_blocks, random_values


def random_tensors(config: ModelConfig, seed: int = 0, experts: str | None = None) -> dict[str, np.ndarray]:
    """The exact tensor VALUES `make_test_model(path, config, seed, experts)` writes, by name.

    F16 tensors come back as float16, Q8_0 and MXFP4 tensors dequantised (float32), I32 as int32,
    so an engine built from these equals one loaded from the written file, and the numpy oracle
    reads the same numbers. `experts`: None (F16 routed experts) or "mxfp4".
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in tensor_table(config, experts):
        v = random_values(spec, config, rng)
        if spec.ggml_type == "MXFP4":
            v = np.array(quant.dequantize(mxfp4_blocks(v), quant.MXFP4, spec.shape))
        elif spec.ggml_type == "Q8_0":
            blocks = q8_0_blocks(v).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
            v = (d * q).reshape(spec.shape)
        elif spec.ggml_type == "F16":
            v = v.astype(np.float16)
        elif spec.ggml_type == "F32":
            v = v.astype(np.float32)
        out[spec.name] = v
    return out


def weights_from_tensors(config: ModelConfig, tensors: Mapping[str, Any], *,
                         quantize_q8: bool = False, mxfp4_experts: bool = False,
                         layer_range: tuple[int, int] | None = None) -> ModelWeights:
    """ModelWeights from a name -> array mapping (e.g. `random_tensors`).

    quantize_q8: store the tensors that are Q8_0 in a GGUF as MLX affine 8-bit (as a loaded file
    does; the values are Q8_0-exact so this is lossless) instead of dense f32.
    mxfp4_experts: the routed experts (MXFP4 values, random_tensors(..., experts="mxfp4")) on the
    MXFP4 backend a loaded file gets under the kernel set in force; else dense.
    """
    q8_names: set[str] = set()
    if quantize_q8:
        q8_names = {s.name for s in tensor_table(config) if s.ggml_type == "Q8_0"}

    def get(name: str) -> Any:
        v = tensors[name]
        if mxfp4_experts and "_exps." in name:
            # MXFP4 values re-encode to the file's blocks bit for bit (values.mxfp4_blocks), on
            # the backend a loaded file gets under the kernel set in force (weights.load_weights).
            return quant_experts(mxfp4_blocks(np.asarray(v, dtype=np.float32)), quant.MXFP4, v.shape,
                                 backend="fast" if kernel_set() == "cpu" else "auto")
        if name in q8_names:
            # The values are Q8_0-exact: re-encoding them gives the file's blocks bit for bit.
            return exact_q8_affine(np.asarray(v, dtype=np.float32))
        if isinstance(v, np.ndarray) and v.dtype == np.float16 and name != "token_embd.weight":
            return mx.array(v.astype(np.float32))
        return v

    return build_weights(config, get, has=lambda name: name in tensors, layer_range=layer_range)


def exact_q8_affine(w: np.ndarray) -> tuple[mx.array, mx.array, mx.array]:
    """A Q8_0-representable [out, in] matrix as the exact affine-8 triple (scale d, bias -128·d)."""
    return q8_0_to_affine(q8_0_blocks(w).reshape(-1), w.shape)


def random_weights(config: ModelConfig, seed: int = 0, *, quantize_q8: bool = True) -> ModelWeights:
    """Deterministic random weights for `config`: the same values `make_test_model` writes."""
    return weights_from_tensors(config, random_tensors(config, seed), quantize_q8=quantize_q8)
