"""GGUF reader: round trip against gguf.GGUFWriter fixtures, lazy open, validation errors."""

from __future__ import annotations

import struct

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from ds4agent.engine import EngineError, MissingTensorError, ModelFileError, TensorShapeError, TensorTypeError
from ds4agent.engine.gguf import GGUFFile, ValueType
from ds4agent.engine.quant import load_q8_0, q8_0_to_affine
from tests.support.gguf_writer import add_tensor, finish


def _write(path, *, kv=(), tensors=(), alignment=None):
    w = gguf.GGUFWriter(str(path), "deepseek4")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, val, vt, sub in kv:
        w.add_key_value(key, val, vt, sub_type=sub)
    for name, arr, raw in tensors:
        add_tensor(w, name, arr, raw)
    return finish(w, path)


@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory):
    rng = np.random.default_rng(7)
    f32 = rng.standard_normal((5, 64)).astype(np.float32)
    f16 = rng.standard_normal((3, 4, 32)).astype(np.float16)
    i32 = rng.integers(-5, 1000, size=(7, 3), dtype=np.int32)
    q_src = (rng.standard_normal((6, 96)) * 3).astype(np.float32)
    q8 = gguf.quants.quantize(q_src, QT.Q8_0)
    kv = [
        ("deepseek4.block_count", 43, VT.UINT32, None),
        ("t.u8", 200, VT.UINT8, None),
        ("t.i8", -100, VT.INT8, None),
        ("t.u16", 60000, VT.UINT16, None),
        ("t.i16", -30000, VT.INT16, None),
        ("t.i32", -7, VT.INT32, None),
        ("t.f32", 1.5, VT.FLOAT32, None),
        ("t.bool", True, VT.BOOL, None),
        ("t.str", "héllo", VT.STRING, None),
        ("t.u64", 2**40 + 3, VT.UINT64, None),
        ("t.i64", -(2**40), VT.INT64, None),
        ("t.f64", 1e-6, VT.FLOAT64, None),
        ("t.ratios", [0, 0, 4, 128], VT.ARRAY, VT.UINT32),
        ("t.clamps", [10.0, 2.5], VT.ARRAY, VT.FLOAT32),
        ("t.flags", [True, False, True], VT.ARRAY, VT.BOOL),
        ("t.words", ["a", "", "<｜User｜>", "zz"], VT.ARRAY, VT.STRING),
    ]
    tensors = [("f32", f32, None), ("f16", f16, None), ("i32", i32, None), ("q8", q8, QT.Q8_0)]
    path = _write(tmp_path_factory.mktemp("gguf") / "fix.gguf", kv=kv, tensors=tensors)
    return path, {"f32": f32, "f16": f16, "i32": i32, "q8": q8, "q_src": q_src}


def test_metadata_values_and_types_round_trip(fixture_file):
    path, _ = fixture_file
    with GGUFFile.open(path) as gf:
        md, vt = gf.metadata, gf.value_types
        assert gf.version == 3 and gf.alignment == 32
        assert md["general.architecture"] == "deepseek4"
        assert md["deepseek4.block_count"] == 43 and vt["deepseek4.block_count"] == ValueType.UINT32
        assert (md["t.u8"], md["t.i8"], md["t.u16"], md["t.i16"]) == (200, -100, 60000, -30000)
        assert md["t.i32"] == -7 and vt["t.i32"] == ValueType.INT32
        assert md["t.f32"] == 1.5 and vt["t.f32"] == ValueType.FLOAT32
        assert md["t.bool"] is True and md["t.str"] == "héllo"
        assert md["t.u64"] == 2**40 + 3 and md["t.i64"] == -(2**40)
        assert md["t.f64"] == 1e-6 and vt["t.f64"] == ValueType.FLOAT64
        assert md["t.ratios"] == [0, 0, 4, 128]
        assert vt["t.ratios"] == ValueType.ARRAY and gf.array_types["t.ratios"] == ValueType.UINT32
        assert md["t.clamps"] == [10.0, 2.5] and gf.array_types["t.clamps"] == ValueType.FLOAT32
        assert md["t.flags"] == [True, False, True]
        words = md["t.words"]
        assert len(words) == 4 and list(words) == ["a", "", "<｜User｜>", "zz"]
        assert words[2] == "<｜User｜>"


def test_lazy_strings_survive_close_and_raw_after_close_is_refused(fixture_file):
    path, _ = fixture_file
    gf = GGUFFile.open(path)
    words = gf.metadata["t.words"]  # not decoded yet
    gf.close()
    assert list(words) == ["a", "", "<｜User｜>", "zz"]
    with pytest.raises(ModelFileError, match="closed"):
        gf.raw("f32")


def test_tensor_directory_and_zero_copy_views(fixture_file):
    path, src = fixture_file
    with GGUFFile.open(path) as gf:
        assert list(gf.tensors) == ["f32", "f16", "i32", "q8"]
        ti = gf.tensors["f16"]
        assert ti.type_name == "F16" and ti.dims == (32, 4, 3) and ti.shape == (3, 4, 32)
        assert ti.nbytes == 3 * 4 * 32 * 2 and ti.offset % 32 == 0
        q = gf.tensors["q8"]
        assert q.type_name == "Q8_0" and q.shape == (6, 96) and q.nbytes == 6 * 3 * 34
        for name in ("f32", "f16", "i32"):
            view = gf.numpy(name)
            assert view.dtype == src[name].dtype and view.shape == src[name].shape
            assert np.array_equal(view, src[name])
            assert not view.flags.writeable and not view.flags.owndata
        raw = gf.raw("q8")
        assert raw.dtype == np.uint8 and np.array_equal(raw.reshape(src["q8"].shape), src["q8"])
        loaded = gf.load("f16", shape=(3, 4, 32), types=("F16",))
        assert loaded.dtype == mx.float16 and np.array_equal(np.array(loaded), src["f16"])
        as32 = gf.load("f16", dtype=mx.float32)
        assert as32.dtype == mx.float32
        assert np.array_equal(np.array(as32), src["f16"].astype(np.float32))


def test_q8_0_loads_as_exact_affine_8bit(fixture_file):
    path, src = fixture_file
    ref = gguf.quants.dequantize(src["q8"], QT.Q8_0)
    with GGUFFile.open(path) as gf:
        wq, scales, biases = load_q8_0(gf, "q8", shape=(6, 96))
    assert wq.dtype == mx.uint32 and wq.shape == (6, 24) and scales.shape == (6, 3)
    deq = mx.dequantize(wq, scales, biases, group_size=32, bits=8)
    assert np.array_equal(np.array(deq), ref)  # exact, not approximately
    x = np.random.default_rng(1).standard_normal((2, 96)).astype(np.float32)
    y = mx.quantized_matmul(mx.array(x), wq, scales, biases, transpose=True, group_size=32, bits=8)
    np.testing.assert_allclose(np.array(y), x @ ref.T, rtol=1e-5, atol=1e-5)


def test_q8_0_conversion_is_exact_including_extreme_scales():
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(4, 2, 34), dtype=np.uint8)
    d = np.array([[65504.0, -0.0], [6e-8, -1.0], [0.5, 2.0], [-65504.0, 1e-3]], dtype=np.float16)
    blocks[:, :, 0:2] = d.view(np.uint8).reshape(4, 2, 2)
    raw = blocks.reshape(4, 68)
    wq, s, b = q8_0_to_affine(raw, (4, 64))
    deq = np.array(mx.dequantize(wq, s, b, group_size=32, bits=8))
    assert np.array_equal(deq, gguf.quants.dequantize(raw, QT.Q8_0))


def test_validation_errors_name_the_tensor(fixture_file):
    path, _ = fixture_file
    with GGUFFile.open(path) as gf:
        with pytest.raises(MissingTensorError, match="'blk.0.attn_q_a.weight' is missing"):
            gf.load("blk.0.attn_q_a.weight")
        with pytest.raises(TensorTypeError, match=r"'f32' has type F32, expected F16") as ei:
            gf.load("f32", types=("F16",))
        assert ei.value.tensor == "f32"
        with pytest.raises(TensorShapeError, match=r"'f32' has shape \[5, 64\], expected \[64, 5\]"):
            gf.load("f32", shape=(64, 5))
        with pytest.raises(TensorTypeError, match="'f16' has type F16, expected Q8_0"):
            load_q8_0(gf, "f16")
        with pytest.raises(TensorShapeError, match="'q8'"):
            load_q8_0(gf, "q8", shape=(96, 6))
        with pytest.raises(TensorTypeError):
            gf.numpy("q8")


def test_custom_alignment_is_honoured(tmp_path):
    arr = np.arange(10, dtype=np.float32)
    path = _write(tmp_path / "a.gguf", tensors=[("x", arr, None), ("y", arr * 2, None)], alignment=64)
    with GGUFFile.open(path) as gf:
        assert gf.alignment == 64 and gf.data_offset % 64 == 0
        assert all(t.offset % 64 == 0 for t in gf.tensors.values())
        assert np.array_equal(gf.numpy("y"), arr * 2)


def test_open_is_lazy_on_a_huge_sparse_file(tmp_path):
    """~98 GB of expert-sized tensors that exist only as a file hole: opening parses the
    directory alone, and a raw view costs nothing until its pages are touched."""
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "deepseek4")
    shape = (256, 2048, 4096)  # row-major [experts, out, in]
    nbytes = 256 * 2048 * 4096 // 32 * 34
    names = [f"blk.{i}.ffn_gate_exps.weight" for i in range(43)]
    for name in names:
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=QT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    start = -(-header // 32) * 32
    with open(path, "r+b") as fh:
        fh.truncate(start + nbytes * len(names))  # a hole: no data blocks are written
    with GGUFFile.open(path) as gf:
        assert gf.data_offset == start and list(gf.tensors) == names
        last = gf.tensors[names[-1]]
        assert last.type_name == "Q8_0" and last.shape == shape and last.nbytes == nbytes
        assert last.offset == start + nbytes * 42
        raw = gf.raw(names[-1])
        assert raw.shape == (nbytes,) and raw[-1] == 0  # one page touched, the rest untouched


def test_truncated_tensor_data_is_refused(tmp_path):
    arr = np.ones((4, 32), dtype=np.float32)
    path = _write(tmp_path / "t.gguf", tensors=[("head", arr, None)])
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ModelFileError, match="'head' extends past the end"):
        GGUFFile.open(path)


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"", "not a GGUF file"),
        (b"GGML" + b"\0" * 40, "bad magic"),
        (b"GGUF" + struct.pack("<IQQ", 2, 0, 0), "version 2 is not supported"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 100) + b"abc", "truncated"),
        (b"GGUF" + struct.pack("<IQQ", 3, 10**12, 0), "truncated GGUF file"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
         + struct.pack("<I", 99) + b"\0" * 8, "unknown value type 99"),
    ],
)
def test_malformed_headers_raise_readable_errors(tmp_path, blob, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(ModelFileError, match=message):
        GGUFFile.open(path)


def test_missing_file_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="cannot open model file"):
        GGUFFile.open(tmp_path / "nope.gguf")


def test_every_truncation_and_random_corruption_gives_a_model_file_error(tmp_path):
    """Cut a small valid file at every byte and flip random header bytes: the reader either
    opens it or raises ModelFileError, never another exception."""
    kv = [("deepseek4.block_count", 4, VT.UINT32, None),
          ("t.words", ["ab", "c"], VT.ARRAY, VT.STRING),
          ("t.ratios", [0, 4], VT.ARRAY, VT.UINT32)]
    arr = np.arange(64, dtype=np.float32).reshape(2, 32)
    good = _write(tmp_path / "g.gguf", kv=kv, tensors=[("w", arr, None)]).read_bytes()
    with GGUFFile.open(tmp_path / "g.gguf") as gf:
        data_end = gf.tensors["w"].offset + gf.tensors["w"].nbytes
    bad = tmp_path / "b.gguf"
    for cut in range(data_end):
        bad.write_bytes(good[:cut])
        with pytest.raises(ModelFileError):
            GGUFFile.open(bad)
    rng = np.random.default_rng(0)
    header_len = data_end - arr.nbytes
    for _ in range(150):
        blob = bytearray(good)
        for pos in rng.integers(0, header_len, size=3):
            blob[pos] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(blob))
        try:
            GGUFFile.open(bad).close()
        except ModelFileError:
            pass
