"""Test-model maker: real tensor names/dims/types, real metadata keys, deterministic bytes, CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat

import pytest

from ds4agent import cli
from ds4agent.engine.config import TEST_MODEL_KEY, from_metadata, test_config
from ds4agent.engine.gguf import GGUFFile
from ds4agent.engine.layout import tensor_table
from ds4agent.testmodels import make_test_model


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
        # what llama.cpp-family loaders require of a DeepSeek-V4 file (sqrt-softplus scoring)
        assert gf.metadata["deepseek4.expert_gating_func"] == 4
        assert gf.value_types["deepseek4.expert_gating_func"].name == "UINT32"
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
    from ds4agent.testmodels import writer

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

    real_encode = writer.encode
    monkeypatch.setattr(writer, "encode", failing_encode)
    with pytest.raises(OSError):
        make_test_model(out, "micro", seed=2)
    assert out.read_bytes() == before  # the old file is kept whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.gguf"]  # and no temp is left
