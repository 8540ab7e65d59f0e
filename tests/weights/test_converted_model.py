"""End to end: a tiny model in the official DeepSeek layout (FP8 block-scaled projections, FP4
experts, BF16/F32/I64 rest) -> `convert` -> load_engine(directory) gives the logits of the same
model run from the exactly dequantised float32 weights."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from ds4agent.engine import Engine, load_engine
from ds4agent.engine import convert as cv
from ds4agent.engine.config import test_config
from ds4agent.engine.experts.portable import MxExperts
from ds4agent.engine.layout import tensor_table
from ds4agent.testmodels.random_weights import random_tensors, weights_from_tensors

FP8_FAMILIES = ("attn_q_a.", "attn_q_b.", "attn_kv.", "attn_output_a.", "attn_output_b.", "_shexp.",
                "indexer.attn_q_b.")
_E4M3_POS = cv.e4m3_to_f32(np.arange(127, dtype=np.uint8))  # codes 0..126, ascending magnitudes


def _nearest_codes(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    i = np.clip(np.searchsorted(table, values), 1, len(table) - 1)
    return np.where(values - table[i - 1] <= table[i] - values, i - 1, i).astype(np.uint8)


def _to_fp8_block(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out, n = w.shape
    to, tn = -(-out // 128), -(-n // 128)
    pad = np.zeros((to * 128, tn * 128), np.float32)
    pad[:out, :n] = w
    amax = np.abs(pad.reshape(to, 128, tn, 128)).max(axis=(1, 3))
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0)).astype(np.int32)
    scale = (exp + 127).astype(np.uint8)
    s_full = np.repeat(np.repeat(np.ldexp(1.0, exp), 128, 0), 128, 1)[:out, :n]
    codes = _nearest_codes(np.abs(w) / s_full, _E4M3_POS) | np.where(w < 0, 0x80, 0).astype(np.uint8)
    return codes, scale


def _to_fp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out, n = w.shape
    g = w.reshape(out, n // 32, 32)
    exp = np.ceil(np.log2(np.maximum(np.abs(g).max(axis=2), 1e-30) / 6.0)).astype(np.int32)
    mags = np.abs(g) / np.ldexp(1.0, exp)[..., None]
    codes = _nearest_codes(mags, cv._E2M1) | np.where(g < 0, 8, 0).astype(np.uint8)
    codes = codes.reshape(out, n)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (exp + 127).astype(np.uint8)


def _bf16(w: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _official_name(canon: str) -> str:
    inv_top = {v: k for k, v in cv._TOP.items()}
    if canon in inv_top:
        return inv_top[canon]
    _, layer, rest = canon.split(".", 2)
    inv = {v: k for k, v in cv._LAYER.items()}
    return f"layers.{layer}.{inv[rest]}"


def _official_checkpoint(cfg, path):
    """(official tensors written to `path`, canonical name -> exact float values they encode)."""
    canon = random_tensors(cfg, seed=3)
    official: dict[str, tuple[str, np.ndarray]] = {}
    ref: dict[str, np.ndarray] = {}
    for name, v in canon.items():
        v = np.asarray(v)
        if "_exps." in name:
            proj = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}[name.split(".")[2]]
            layer = name.split(".")[1]
            deq = []
            for e in range(v.shape[0]):
                w, s = _to_fp4(v[e].astype(np.float32))
                official[f"layers.{layer}.ffn.experts.{e}.{proj}.weight"] = ("I8", w)
                official[f"layers.{layer}.ffn.experts.{e}.{proj}.scale"] = ("F8_E8M0", s)
                deq.append(cv.dequant_fp4(w, s))
            ref[name] = np.stack(deq)
            continue
        off = _official_name(name)
        if any(f in name for f in FP8_FAMILIES):
            codes, scale = _to_fp8_block(v.astype(np.float32))
            official[off] = ("F8_E4M3", codes)
            official[off[: -len(".weight")] + ".scale"] = ("F8_E8M0", scale)
            ref[name] = cv.dequant_fp8_block(codes, scale)
        elif v.dtype == np.int32:
            official[off] = ("I64", v.astype(np.int64))
            ref[name] = v
        elif v.dtype == np.float16 or name.endswith("norm.weight"):
            b = _bf16(v.astype(np.float32))
            official[off] = ("BF16", b)
            ref[name] = (b.astype(np.uint32) << 16).view(np.float32)
        else:
            official[off] = ("F32", v.astype(np.float32))
            ref[name] = v.astype(np.float32)
    path.mkdir()
    cv.write_safetensors(path / "model-00001-of-00001.safetensors", official)
    hf = {
        "num_hidden_layers": cfg.n_layers, "hidden_size": cfg.dim, "vocab_size": cfg.vocab,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": 1, "head_dim": cfg.head_dim,
        "qk_rope_head_dim": cfg.rope_dim, "q_lora_rank": cfg.q_lora_rank, "o_lora_rank": cfg.out_lora_rank,
        "o_groups": cfg.out_groups, "n_routed_experts": cfg.n_experts, "num_experts_per_tok": cfg.n_experts_used,
        "moe_intermediate_size": cfg.expert_ffn, "n_shared_experts": 1, "num_hash_layers": cfg.n_hash_layers,
        "sliding_window": cfg.window, "index_n_heads": cfg.indexer_heads, "index_head_dim": cfg.indexer_dim,
        "index_topk": cfg.indexer_top_k, "hc_mult": cfg.hc_count, "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters,
        "hc_eps": cfg.hc_eps, "compress_ratios": list(cfg.ratios) + [0], "swiglu_limit": 10.0,
        "rope_theta": cfg.rope_base, "compress_rope_theta": cfg.compress_rope_base,
        "rope_scaling": {"factor": cfg.yarn_factor, "original_max_position_embeddings": cfg.yarn_orig_ctx,
                         "beta_fast": cfg.yarn_beta_fast, "beta_slow": cfg.yarn_beta_slow, "type": "yarn"},
        "rms_norm_eps": cfg.rms_eps, "routed_scaling_factor": cfg.expert_weights_scale, "norm_topk_prob": True,
        "ds4agent_test_model": True,
    }
    (path / "config.json").write_text(json.dumps(hf))
    return official, ref


def test_converted_directory_runs_like_the_dequantised_model(tmp_path):
    cfg = test_config("micro")
    assert {s.name for s in tensor_table(cfg)}  # the canonical table drives the fixture
    _, ref = _official_checkpoint(cfg, tmp_path / "official")
    out = cv.convert(tmp_path / "official", tmp_path / "mlx")
    conv = load_engine(out, ctx=64)
    assert conv.config == cfg and conv.quant_bits == 4
    assert isinstance(conv.weights.layers[0].ffn.down_exps, MxExperts)
    assert conv.weights.layers[0].attn.q_a.mode == "mxfp8"
    dense = Engine(config=cfg, weights=weights_from_tensors(cfg, ref), ctx=64)
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, 500, 30)]
    a, b = conv.new_session(), dense.new_session()
    # on another thread than the load (the TUI's worker): nothing lazy may cross (test_threads.py)
    worker = threading.Thread(target=a.sync, args=(tokens,))
    worker.start()
    worker.join()
    assert a.tokens == tuple(tokens)
    b.sync(tokens)
    # same weight values, different matmul kernels (quantized vs dense): f32 rounding only
    scale = max(1.0, float(np.abs(b.logits).max()))
    assert np.abs(a.logits - b.logits).max() <= 2e-4 * scale
    assert int(np.argmax(a.logits)) == int(np.argmax(b.logits))


def test_metadata_errors_are_readable(tmp_path):
    with pytest.raises(cv.ConvertError, match="config.json has no hidden_size"):
        cv.hf_metadata({"num_hidden_layers": 2})
    src = tmp_path / "src"
    src.mkdir()
    cv.write_safetensors(src / "a.safetensors", {"norm.weight": ("F32", np.ones(4, np.float32))})
    out = cv.convert(src, tmp_path / "out")  # no config.json: converts, but cannot be loaded
    from ds4agent.engine import ModelFileError

    with pytest.raises(ModelFileError, match="no model metadata"):
        load_engine(out, ctx=16)


def test_info_describes_a_converted_directory(tmp_path, capsys):
    from ds4agent.cli import main as cli_main

    cfg = test_config("micro")
    _official_checkpoint(cfg, tmp_path / "official")
    out = cv.convert(tmp_path / "official", tmp_path / "mlx")
    assert cli_main(["info", str(out), "--ctx", "64"]) == 0
    text = capsys.readouterr().out
    assert "ds4agent test model" in text and "mxfp4" in text and "mxfp8" in text
    assert "4 layers, width 32, vocab 512" in text


def test_directories_that_are_not_conversions_say_what_is_missing(tmp_path, capsys):
    from ds4agent.cli import main as cli_main

    d = tmp_path / "d"
    d.mkdir()
    cases = [
        (None, "is a directory but not a model written by `ds4agent convert` (it has no config.json)"),
        ("{not json", "config.json is not valid JSON"),
        ('{"format": "other"}', "its config.json is not a ds4agent-mlx description"),
        ('{"format": "ds4agent-mlx"}', "cannot read model.safetensors.index.json (No such file or directory); "
                                       "an incomplete conversion?"),
    ]
    for text, message in cases:
        if text is not None:
            (d / "config.json").write_text(text)
        code = cli_main(["dump-logits", "--model", str(d), "--tokens", "1", "--out", str(tmp_path / "o.npy")])
        err = capsys.readouterr().err
        # A bad model file is exit 1 at the file commands' boundary (commands/boundary.py).
        assert code == 1 and message in err and "Errno" not in err and "Traceback" not in err, err
        if "index.json" not in message:  # info reads the same config.json with the same words
            assert cli_main(["info", str(d)]) == 2 and message in capsys.readouterr().err
