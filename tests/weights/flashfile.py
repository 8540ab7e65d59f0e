"""A DS4 Flash GGUF with the real metadata and full tensor directory whose data is a file hole.

~86 GB of tensors cost no disk blocks and are never read unless a test touches them: the
directory, the types (q2 flavour: IQ2_XXS gate/up, Q2_K down experts, Q8_0 projections) and the
sizes are exactly those of ds4's q2 file, which is what `info`, the lazy reader and the expert
backends need.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ds4agent.engine import config as config_mod
from ds4agent.engine.layout import tensor_table
from ds4agent.testmodels.values import add_config_metadata

Q2_EXPERT_TYPES = {"ffn_gate_exps": "IQ2_XXS", "ffn_up_exps": "IQ2_XXS", "ffn_down_exps": "Q2_K"}


def expert_type(name: str, types: dict[str, str]) -> str | None:
    for key, t in types.items():
        if f".{key}." in name:
            return t
    return None


def write_sparse_flash(path: Path, *, metadata_overrides: dict | None = None,
                       expert_types: dict[str, str] = Q2_EXPERT_TYPES) -> Path:
    cfg = config_mod.flash_config()
    w = gguf.GGUFWriter(str(path), "deepseek4")
    add_config_metadata(w, cfg)
    for key, value in (metadata_overrides or {}).items():
        w.kv_data[0][key] = gguf.GGUFValue(value, gguf.GGUFValueType.UINT32)
    total = 0
    for spec in tensor_table(cfg):
        t = expert_type(spec.name, expert_types) or spec.ggml_type
        qt = gguf.GGMLQuantizationType[t]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        nbytes = int(np.prod(spec.shape)) // block * size
        w.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32), nbytes, raw_dtype=qt)
        total += -(-nbytes // 32) * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = -(-path.stat().st_size // 32) * 32
    with open(path, "r+b") as fh:
        fh.truncate(start + total)  # the whole data region is a hole
    return path
