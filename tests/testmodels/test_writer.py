"""Test-model maker: real tensor names/dims/types, real metadata keys, deterministic bytes, CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat

import pytest

from ds4agent import cli
from ds4agent.engine.config import flash_config, from_metadata, test_config
from ds4agent.engine.gguf import GGUFFile
from ds4agent.testmodels.writer import TEST_MODEL_KEY, make_test_model, tensor_table

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


@pytest.fixture(scope="module")
def micro_file(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("tm") / "micro.gguf", "micro", seed=5)


def test_written_file_has_real_metadata_and_every_tensor(micro_file):
    cfg = test_config("micro")
    with GGUFFile.open(micro_file) as gf:
        assert gf.metadata["general.architecture"] == "deepseek4"
        assert gf.metadata[TEST_MODEL_KEY] is True
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        got = from_metadata(gf.metadata, mode="test", types=types)
        for f in dataclasses.fields(cfg):
            if f.name == "name":
                continue
            want, have = getattr(cfg, f.name), getattr(got, f.name)
            if isinstance(want, float):
                assert have == pytest.approx(want, rel=1e-6), f.name
            else:
                assert have == want, f.name
        assert gf.value_types["deepseek4.block_count"].name == "UINT32"
        assert gf.array_types["deepseek4.attention.compress_ratios"].name == "UINT32"
        table = tensor_table(cfg)
        assert list(gf.tensors) == [t.name for t in table]
        for t in table:
            gf.check(t.name, shape=t.shape, types=(t.ggml_type,))
        tid = gf.numpy("blk.0.ffn_gate_tid2eid.weight")
        assert tid.shape == (cfg.vocab, cfg.n_experts_used)
        assert tid.min() >= 0 and tid.max() < cfg.n_experts
        assert all(len(set(row)) == cfg.n_experts_used for row in tid.tolist())  # distinct experts


def test_same_seed_same_bytes_other_seed_other_bytes(micro_file, tmp_path):
    again = make_test_model(tmp_path / "again.gguf", "micro", seed=5)
    other = make_test_model(tmp_path / "other.gguf", "micro", seed=6)

    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert digest(again) == digest(micro_file)
    assert digest(other) != digest(micro_file)
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file


def test_cli_make_test_model(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert cli.main(["make-test-model", str(out), "--config", "micro", "--seed", "2"]) == 0
    assert out.exists() and "wrote" in capsys.readouterr().out
    assert cli.main(["make-test-model", str(tmp_path / "x.gguf"), "--config", "huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown test config 'huge'" in err and "tiny" in err
    assert not (tmp_path / "x.gguf").exists()
    assert cli.main(["make-test-model", str(tmp_path / "x.gguf"), "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--seed must be a non-negative integer (got -1)" in err and "Traceback" not in err
    assert cli.main(["make-test-model", str(tmp_path), "--config", "micro"]) == 1  # a directory
    assert "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # nothing else was left


def test_written_atomically_with_ordinary_permissions(tmp_path, monkeypatch):
    from ds4agent.testmodels import writer as testmodel

    umask = os.umask(0)
    os.umask(umask)
    out = make_test_model(tmp_path / "sub" / "m.gguf", "micro", seed=1)  # parent made as needed
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # not a temp file's 0600
    before = out.read_bytes()
    calls = []

    def failing_encode(spec, values):  # the disk fills up half way through the tensors
        calls.append(spec.name)
        if len(calls) == 20:
            raise OSError(28, "No space left on device")
        return real_encode(spec, values)

    real_encode = testmodel._encode
    monkeypatch.setattr(testmodel, "_encode", failing_encode)
    with pytest.raises(OSError):
        make_test_model(out, "micro", seed=2)
    assert out.read_bytes() == before  # the old file is kept whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.gguf"]  # and no temp is left
