"""The canonical tensor table: model.md §6.3's names, dims and types, its presence rules, and the
expert flavours of ds4's files."""

from __future__ import annotations

import pytest

from ds4agent.engine import EngineError
from ds4agent.engine.config import flash_config, test_config
from ds4agent.engine.layout import EXPERT_TYPES, tensor_table

# GGML dims (ne0 first) copied from model.md §6.3 for the Flash shape.
FLASH_DIMS = {
    "token_embd.weight": ("F16", (4096, 129280)),
    "output_hc_fn.weight": ("F16", (16384, 4)),
    "output_hc_scale.weight": ("F32", (1,)),
    "output_hc_base.weight": ("F32", (4,)),
    "output_norm.weight": ("F32", (4096,)),
    "output.weight": ("Q8_0", (4096, 129280)),
    "blk.5.hc_attn_fn.weight": ("F16", (16384, 24)),
    "blk.5.hc_ffn_scale.weight": ("F32", (3,)),
    "blk.5.hc_ffn_base.weight": ("F32", (24,)),
    "blk.0.attn_q_a.weight": ("Q8_0", (4096, 1024)),
    "blk.0.attn_q_a_norm.weight": ("F32", (1024,)),
    "blk.0.attn_q_b.weight": ("Q8_0", (1024, 32768)),
    "blk.0.attn_kv.weight": ("Q8_0", (4096, 512)),
    "blk.0.attn_kv_a_norm.weight": ("F32", (512,)),
    "blk.0.attn_sinks.weight": ("F32", (64,)),
    "blk.0.attn_output_a.weight": ("Q8_0", (4096, 8192)),
    "blk.0.attn_output_b.weight": ("Q8_0", (8192, 4096)),
    "blk.2.attn_compressor_ape.weight": ("F16", (1024, 4)),
    "blk.3.attn_compressor_ape.weight": ("F16", (512, 128)),
    "blk.2.attn_compressor_kv.weight": ("F16", (4096, 1024)),
    "blk.3.attn_compressor_gate.weight": ("F16", (4096, 512)),
    "blk.3.attn_compressor_norm.weight": ("F32", (512,)),
    "blk.42.indexer.attn_q_b.weight": ("F16", (1024, 8192)),
    "blk.42.indexer.proj.weight": ("F16", (4096, 64)),
    "blk.42.indexer_compressor_ape.weight": ("F16", (256, 4)),
    "blk.42.indexer_compressor_kv.weight": ("F16", (4096, 256)),
    "blk.42.indexer_compressor_norm.weight": ("F32", (128,)),
    "blk.7.ffn_gate_inp.weight": ("F16", (4096, 256)),
    "blk.7.exp_probs_b.bias": ("F32", (256,)),
    "blk.2.ffn_gate_tid2eid.weight": ("I32", (6, 129280)),
    "blk.7.ffn_gate_exps.weight": (None, (4096, 2048, 256)),
    "blk.7.ffn_down_exps.weight": (None, (2048, 4096, 256)),
    "blk.7.ffn_up_shexp.weight": ("Q8_0", (4096, 2048)),
    "blk.7.ffn_down_shexp.weight": ("Q8_0", (2048, 4096)),
}


def test_tensor_table_matches_the_flash_spec():
    table = {t.name: t for t in tensor_table(flash_config())}
    for name, (typ, dims) in FLASH_DIMS.items():
        spec = table[name]
        assert spec.shape == tuple(reversed(dims)), name
        if typ is not None:
            assert spec.ggml_type == typ, name
    # presence rules: compressor iff ratio != 0, indexer iff ratio 4, tid2eid iff hash layer
    assert "blk.1.attn_compressor_kv.weight" not in table
    assert "blk.3.indexer.proj.weight" not in table
    assert "blk.3.ffn_gate_tid2eid.weight" not in table and "blk.2.exp_probs_b.bias" not in table
    per_layer = {0: 24, 2: 34, 3: 28}  # dense / ratio 4 / ratio 128
    for layer, count in per_layer.items():
        assert sum(n.startswith(f"blk.{layer}.") for n in table) == count
    assert len(table) == 6 + 2 * 24 + 21 * 34 + 20 * 28


@pytest.mark.parametrize("experts", ["q2", "q4", "mxfp4"])
def test_expert_flavours_change_only_the_routed_expert_types(experts):
    plain = tensor_table(flash_config())
    typed = tensor_table(flash_config(), experts=experts)
    assert [(t.name, t.shape) for t in typed] == [(t.name, t.shape) for t in plain]
    want = {"q2": ("IQ2_XXS", "IQ2_XXS", "Q2_K"), "q4": ("Q4_K", "Q4_K", "Q4_K"),
            "mxfp4": ("MXFP4", "MXFP4", "MXFP4")}[experts]
    for before, after in zip(plain, typed, strict=True):
        if "_exps." in after.name:
            kind = ("gate", "up", "down").index(after.name.split(".")[2].split("_")[1])
            assert after.ggml_type == want[kind], after.name
        else:
            assert after.ggml_type == before.ggml_type, after.name
    assert set(EXPERT_TYPES) == {"q2", "q4", "mxfp4"}


def test_unknown_flavour_and_roles():
    with pytest.raises(EngineError, match="unknown expert flavour 'q3'"):
        tensor_table(test_config("micro"), experts="q3")
    roles = {t.name: t.role for t in tensor_table(test_config("micro"))}
    assert roles["blk.3.ffn_down_exps.weight"] == "ffn_down_exps"
    assert roles["blk.2.indexer.attn_q_b.weight"] == "indexer.attn_q_b"
    assert roles["output.weight"] == "output"
