"""Loading a DS4 GGUF into the engine: exact round trip of the written weights, and validation
errors (wrong type, wrong shape, missing tensor, wrong metadata) that name what is wrong."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ds4agent.engine import (
    ConfigError,
    Engine,
    MissingTensorError,
    TensorShapeError,
    TensorTypeError,
    load_engine,
)
from ds4agent.engine.config import test_config
from ds4agent.engine.gguf import GGML_TYPE_IDS, GGUFFile
from ds4agent.testmodels import make_test_model
from ds4agent.testmodels.random_weights import random_weights
from tests.support.gguf_writer import add_tensor, finish

TOKENS = [5, 99, 250, 3, 3, 17, 400, 1, 2, 88, 7, 7, 64]


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("load") / "micro.gguf", "micro", seed=4)


def test_loaded_weights_equal_the_written_values(micro_path):
    eng = load_engine(micro_path, ctx=32)
    ref = random_weights(test_config("micro"), seed=4)  # the values make_test_model wrote
    w = eng.weights
    assert np.array_equal(np.array(w.token_embd), np.array(ref.token_embd))
    assert w.output.quantized and w.layers[2].attn.q_b.quantized
    for got, want in ((w.output, ref.output), (w.layers[3].attn.q_a, ref.layers[3].attn.q_a),
                      (w.layers[0].ffn.down_shexp, ref.layers[0].ffn.down_shexp)):
        assert np.array_equal(np.array(got.dense()), np.array(want.dense()))
    assert np.array_equal(np.array(w.layers[0].ffn.tid2eid), np.array(ref.layers[0].ffn.tid2eid))
    assert np.array_equal(np.array(w.layers[2].attn.indexer.compressor.ape),
                          np.array(ref.layers[2].attn.indexer.compressor.ape))
    # and the same numbers give the same logits, bit for bit
    built = Engine(config=eng.config, weights=ref, ctx=32)
    a, b = eng.new_session(), built.new_session()
    a.sync(TOKENS)
    b.sync(TOKENS)
    assert np.array_equal(a.logits, b.logits)


def _rewrite(src, dst, *, replace=None, drop=None, meta=None):
    """Copy a GGUF, optionally replacing one tensor's data/type, dropping one, or changing a key."""
    with GGUFFile.open(src) as gf:
        w = gguf.GGUFWriter(str(dst), "deepseek4")
        for key, value in gf.metadata.items():
            if key.startswith("general.architecture") or key == "general.alignment":
                continue
            vt = gguf.GGUFValueType(int(gf.value_types[key]))
            if meta and key in meta:
                value = meta[key]
            if vt == gguf.GGUFValueType.ARRAY:
                w.add_key_value(key, list(value), vt,
                                sub_type=gguf.GGUFValueType(int(gf.array_types[key])))
            else:
                w.add_key_value(key, value, vt)
        for name, ti in gf.tensors.items():
            if name == drop:
                continue
            if replace and name in replace:
                arr, raw_dtype = replace[name]
            elif ti.type_name == "Q8_0":
                arr, raw_dtype = np.array(gf.raw(name)).reshape(*ti.shape[:-1], -1), QT.Q8_0
            else:
                arr, raw_dtype = np.array(gf.numpy(name)), None
            add_tensor(w, name, arr, raw_dtype)
        return finish(w, dst)


def test_copy_loads_identically(micro_path, tmp_path):
    copy = _rewrite(micro_path, tmp_path / "copy.gguf")
    a = load_engine(micro_path, ctx=32).new_session()
    b = load_engine(copy, ctx=32).new_session()
    a.sync(TOKENS[:5])
    b.sync(TOKENS[:5])
    assert np.array_equal(a.logits, b.logits)


def test_wrong_shape_names_the_tensor(micro_path, tmp_path):
    bad = np.zeros((33, 32), dtype=np.float32)  # attn_kv_a_norm is [Dh] = [80]
    path = _rewrite(micro_path, tmp_path / "shape.gguf",
                    replace={"blk.1.attn_kv_a_norm.weight": (bad, None)})
    with pytest.raises(TensorShapeError, match=r"'blk\.1\.attn_kv_a_norm\.weight' has shape \[33, 32\]"):
        load_engine(path, ctx=32)


def test_wrong_q8_shape_names_the_tensor(micro_path, tmp_path):
    src = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)  # want [80, 32]
    q = gguf.quants.quantize(src, QT.Q8_0)
    path = _rewrite(micro_path, tmp_path / "q8.gguf", replace={"blk.2.attn_kv.weight": (q, QT.Q8_0)})
    with pytest.raises(TensorShapeError, match=r"'blk\.2\.attn_kv\.weight'.*expected \[80, 32\]"):
        load_engine(path, ctx=32)


def test_wrong_type_names_the_tensor(micro_path, tmp_path):
    ints = np.zeros((80,), dtype=np.int32)
    path = _rewrite(micro_path, tmp_path / "type.gguf",
                    replace={"blk.0.attn_kv_a_norm.weight": (ints, None)})
    with pytest.raises(TensorTypeError, match=r"'blk\.0\.attn_kv_a_norm\.weight' has type I32"):
        load_engine(path, ctx=32)
    assert GGML_TYPE_IDS["I32"] == 26


def test_missing_tensor_is_named(micro_path, tmp_path):
    path = _rewrite(micro_path, tmp_path / "missing.gguf", drop="blk.3.attn_compressor_norm.weight")
    with pytest.raises(MissingTensorError, match=r"'blk\.3\.attn_compressor_norm\.weight' is missing"):
        load_engine(path, ctx=32)


def test_bad_metadata_names_the_key(micro_path, tmp_path):
    path = _rewrite(micro_path, tmp_path / "meta.gguf",
                    meta={"deepseek4.attention.compress_ratios": [0, 0, 4]})
    with pytest.raises(ConfigError, match="compress_ratios has 3 entries"):
        load_engine(path, ctx=32)


def test_real_files_get_the_strict_flash_checks(micro_path, tmp_path):
    """Without the test-model marker a file must be DS4 Flash: the first wrong key is named."""
    path = _rewrite(micro_path, tmp_path / "flash.gguf", meta={"ds4agent.test_model": False})
    with pytest.raises(ConfigError, match=r"not a DS4 Flash model: deepseek4\.block_count is 4, expected 43"):
        load_engine(path, ctx=32)


def test_f32_dense_weights_are_accepted_in_test_mode(micro_path, tmp_path):
    """Test mode takes F32 for a 2-D weight that real files store as Q8_0 (model.md §1.1)."""
    with GGUFFile.open(micro_path) as gf:
        ti = gf.tensors["blk.2.attn_q_a.weight"]
        deq = gguf.quants.dequantize(np.array(gf.raw(ti.name)).reshape(ti.shape[0], -1), QT.Q8_0)
    path = _rewrite(micro_path, tmp_path / "f32.gguf", replace={ti.name: (deq, None)})
    a = load_engine(micro_path, ctx=32)
    b = load_engine(path, ctx=32)
    assert not b.weights.layers[2].attn.q_a.quantized
    assert np.array_equal(np.array(a.weights.layers[2].attn.q_a.dense()),
                          np.array(b.weights.layers[2].attn.q_a.dense()))
    assert mx.allclose(b.weights.layers[2].attn.q_a.dense(), mx.array(deq)).item()


def test_a_type_the_loader_cannot_read_there_is_refused_before_loading(tmp_path):
    """check_directory follows how each tensor is read: the embedding and APE tables are plain
    arrays, so a Q8_0 one is one readable line (it used to pass the check and crash the build)."""
    from ds4agent.engine import TensorTypeError
    from ds4agent.engine.gguf import GGUFFile
    from ds4agent.testmodels import make_test_model

    path = make_test_model(tmp_path / "m.gguf", "micro")
    with GGUFFile.open(path) as gf:
        head = bytearray(gf._buf[: gf.data_offset])
    key = len(b"token_embd.weight").to_bytes(8, "little") + b"token_embd.weight"
    at = head.index(key) + len(key)
    at += 4 + 8 * int.from_bytes(head[at:at + 4], "little")
    with open(path, "r+b") as fh:  # F16 -> Q8_0 (smaller: the data still fits the file)
        fh.seek(at)
        fh.write((8).to_bytes(4, "little"))
    with pytest.raises(TensorTypeError, match="'token_embd.weight' has type Q8_0, expected F32 or F16"):
        load_engine(path, ctx=64)
