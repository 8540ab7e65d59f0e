"""Tiny DS4 test GGUFs whose routed experts are real 2/4-bit GGUF blocks.

`write_quant_model(path, cfg, expert_types, seed, dequantised=False)` writes the same tensors as
`ds4agent.testmodels.make_test_model` except the routed experts, which are random blocks of the given types
(random bytes are valid blocks; the f16 scale fields are set so the dequantised weights have the
test model's usual magnitude). With `dequantised=True` the very same experts are stored as F32
values from `gguf.quants.dequantize`: the reference twin of the quantised file.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ds4agent.engine import quant
from ds4agent.engine.config import TEST_MODEL_KEY, ModelConfig, test_config
from ds4agent.engine.layout import ARCH, tensor_table
from ds4agent.testmodels import values as tm_values
from tests.support.gguf_writer import add_tensor, finish
from tests.weights.conftest import random_blocks

# typical |w| of a block per unit of its f16 scale fields (chosen so w ~ 0.5/sqrt(fan_in))
_MAGNITUDE = {quant.Q4_K: 400.0, quant.Q2_K: 30.0, quant.IQ2_XXS: 60.0, quant.Q8_0: 60.0}

Q2_TYPES = {"ffn_gate_exps": quant.IQ2_XXS, "ffn_up_exps": quant.IQ2_XXS, "ffn_down_exps": quant.Q2_K}
Q4_TYPES = {"ffn_gate_exps": quant.Q4_K, "ffn_up_exps": quant.Q4_K, "ffn_down_exps": quant.Q4_K}


def quant_config(base: str = "micro") -> ModelConfig:
    """A test config whose expert matrices are multiples of the 256-weight K-quant block."""
    return test_config(base, dim=256, expert_ffn=256)


def _expert_qtype(name: str, types: dict[str, int]) -> int | None:
    for key, t in types.items():
        if f".{key}." in name:
            return t
    return None


def write_quant_model(path: Path, cfg: ModelConfig, expert_types: dict[str, int], *, seed: int = 0,
                      expert_seed: int = 1, dequantised: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    blocks_rng = np.random.default_rng(expert_seed)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_bool(TEST_MODEL_KEY, True)
    tm_values.add_config_metadata(w, cfg)
    for spec in tensor_table(cfg):
        values = tm_values.random_values(spec, cfg, rng)  # keep the stream identical for every tensor
        qtype = _expert_qtype(spec.name, expert_types)
        if qtype is None:
            data = tm_values.encode(spec, values)
            add_tensor(w, spec.name, data, gguf.GGMLQuantizationType.Q8_0 if spec.ggml_type == "Q8_0" else None)
            continue
        block, size, _ = quant.block_info(qtype)
        fan_in = spec.shape[-1]
        scale = 0.5 / np.sqrt(fan_in) / _MAGNITUDE[qtype]
        n_blocks = int(np.prod(spec.shape)) // block
        raw = random_blocks(blocks_rng, qtype, n_blocks, scale=scale)
        if dequantised:
            dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(spec.shape)
            w.add_tensor(spec.name, dense.astype(np.float32))
        else:
            byte_shape = (*spec.shape[:-1], spec.shape[-1] // block * size)
            w.add_tensor(spec.name, raw.reshape(byte_shape), raw_shape=byte_shape,
                         raw_dtype=gguf.GGMLQuantizationType(qtype))
    return finish(w, path)
