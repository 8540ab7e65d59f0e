"""`ds4agent convert`: official-layout FP8/FP4 tensors repack to mxfp8/mxfp4 with identical values."""

from __future__ import annotations

import json
import os
import stat

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.cli import main as cli_main
from ds4agent.engine import convert as cv


def _fp8_codes(rng, shape):
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x12  # E4M3FN has no inf; keep NaN codes out of value checks
    return codes


def _scales(rng, shape, lo=110, hi=140):
    return rng.integers(lo, hi, size=shape, dtype=np.uint8)


def _mx_dequant(wq, scales, mode, bits):
    return np.array(mx.dequantize(mx.array(wq), mx.array(scales), group_size=32, bits=bits, mode=mode,
                                  dtype=mx.float32))


def test_reference_decoders_known_values():
    assert cv.e4m3_to_f32(np.array([0x00, 0x01, 0x08, 0x38, 0x7E, 0xFE, 0x80]))[:7].tolist() == [
        0.0, 2.0**-9, 2.0**-6, 1.0, 448.0, -448.0, -0.0]
    assert np.isnan(cv.e4m3_to_f32(np.array([0x7F])))[0]
    assert cv.e2m1_to_f32(np.arange(16)).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert cv.e8m0_to_f32(np.array([127, 128, 0, 254])).tolist() == [1.0, 2.0, 2.0**-127, 2.0**127]


@pytest.mark.parametrize("shape", [(256, 384), (200, 96), (7, 32)])
def test_fp8_block_repack_is_exact(rng, shape):
    out, n = shape
    w = _fp8_codes(rng, shape)
    s = _scales(rng, (-(-out // 128), -(-n // 128)), lo=100, hi=160)
    wq, sc = cv.fp8_block_to_mxfp8(w, s)
    assert wq.dtype == np.uint32 and wq.shape == (out, n // 4) and sc.shape == (out, n // 32)
    want = cv.dequant_fp8_block(w, s)
    got = _mx_dequant(wq, sc, "mxfp8", 8)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the tile structure really varies: rows 0 and 128 / columns 0 and 128 use different scales
    if out > 128 and n > 128:
        assert sc[0, 0] == s[0, 0] and sc[128, 0] == s[1, 0] and sc[0, 4] == s[0, 1]


def test_fp4_repack_is_exact(rng):
    out, n = 48, 256
    w = rng.integers(0, 256, size=(out, n // 2), dtype=np.uint8).view(np.int8)
    s = _scales(rng, (out, n // 32))
    wq, sc = cv.fp4_to_mxfp4(w, s)
    want = cv.dequant_fp4(w, s)
    got = _mx_dequant(wq, sc, "mxfp4", 4)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # element order: the low nibble of byte 0 is element 0
    assert want[0, 0] == cv.e2m1_to_f32(np.array([w.view(np.uint8)[0, 0] & 15]))[0] * cv.e8m0_to_f32(s[:1, :1])[0, 0]


def test_bad_scale_shapes_are_clear_errors(rng):
    with pytest.raises(cv.ConvertError, match=r"block scale has shape \[1, 1\], expected \[2, 1\]"):
        cv.fp8_block_to_mxfp8(_fp8_codes(rng, (130, 64)), np.zeros((1, 1), np.uint8))
    with pytest.raises(cv.ConvertError, match="needs a scale of"):
        cv.fp4_to_mxfp4(np.zeros((4, 16), np.int8), np.zeros((4, 2), np.uint8))


def _official_checkpoint(rng, path, n_layers=2, n_exp=3, E=64, F=32):
    """A miniature checkpoint in the official layout and dtypes, split over two shards."""
    t: dict[str, tuple[str, np.ndarray]] = {}
    bf16 = lambda *shape: rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)  # noqa: E731
    t["embed.weight"] = ("BF16", bf16(100, E))
    t["head.weight"] = ("BF16", bf16(100, E))
    t["norm.weight"] = ("BF16", bf16(E))
    t["hc_head_fn"] = ("F32", rng.standard_normal((4, 4 * E)).astype(np.float32))
    t["mtp.0.e_proj.weight"] = ("BF16", bf16(E, E))  # speculative decoding: skipped
    for li in range(n_layers):
        p = f"layers.{li}."
        t[p + "attn.wq_a.weight"] = ("F8_E4M3", _fp8_codes(rng, (160, E)))
        t[p + "attn.wq_a.scale"] = ("F8_E8M0", _scales(rng, (2, 1)))
        t[p + "attn_norm.weight"] = ("BF16", bf16(E))
        t[p + "hc_attn_scale"] = ("F32", rng.standard_normal(3).astype(np.float32))
        t[p + "ffn.gate.tid2eid"] = ("I64", rng.integers(0, n_exp, size=(100, 2)).astype(np.int64))
        for e in range(n_exp):
            for wn, (o, i) in (("w1", (F, E)), ("w3", (F, E)), ("w2", (E, F))):
                t[f"{p}ffn.experts.{e}.{wn}.weight"] = ("I8", rng.integers(-128, 128, size=(o, i // 2), dtype=np.int8))
                t[f"{p}ffn.experts.{e}.{wn}.scale"] = ("F8_E8M0", _scales(rng, (o, i // 32)))
    names = list(t)
    path.mkdir()
    cv.write_safetensors(path / "model-00001-of-00002.safetensors", {k: t[k] for k in names[::2]})
    cv.write_safetensors(path / "model-00002-of-00002.safetensors", {k: t[k] for k in names[1::2]})
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": n_layers}))
    return t


def test_convert_directory_exact_and_named(rng, tmp_path, capsys):
    src, out = tmp_path / "official", tmp_path / "mlx"
    t = _official_checkpoint(rng, src)
    assert cli_main(["convert", str(src), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    # built in a temp directory and renamed, but with a plain mkdir's permissions (mkdtemp: 0700)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlx", "official"]  # no temp left
    cfg = json.loads((out / "config.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    loaded = {}
    for f in set(index.values()):
        loaded.update(mx.load(str(out / f)))
    assert cfg["skipped"] == ["mtp.0.e_proj.weight"] and cfg["source_config"] == {"num_hidden_layers": 2}
    # plain tensors: bit-identical (BF16 kept as bfloat16, I64 ids as int32)
    emb = loaded["token_embd.weight"]
    assert emb.dtype == mx.bfloat16 and np.array_equal(np.array(emb.view(mx.uint16)), t["embed.weight"][1])
    assert np.array_equal(np.array(loaded["output_hc_fn.weight"]), t["hc_head_fn"][1])
    assert np.array_equal(np.array(loaded["blk.1.ffn_gate_tid2eid.weight"]), t["layers.1.ffn.gate.tid2eid"][1])
    # FP8 projection
    q = cfg["quantization"]["blk.0.attn_q_a.weight"]
    assert q == {"mode": "mxfp8", "group_size": 32, "bits": 8, "shape": [160, 64]}
    got = np.array(mx.dequantize(loaded["blk.0.attn_q_a.weight"], loaded["blk.0.attn_q_a.scales"],
                                 group_size=32, bits=8, mode="mxfp8", dtype=mx.float32))
    want = cv.dequant_fp8_block(t["layers.0.attn.wq_a.weight"][1], t["layers.0.attn.wq_a.scale"][1])
    assert np.array_equal(got, want)
    # routed experts stacked in expert order: gate = w1, up = w3, down = w2
    for canon, proj in (("ffn_gate_exps", "w1"), ("ffn_up_exps", "w3"), ("ffn_down_exps", "w2")):
        wq, sc = loaded[f"blk.1.{canon}.weight"], loaded[f"blk.1.{canon}.scales"]
        assert cfg["quantization"][f"blk.1.{canon}.weight"]["mode"] == "mxfp4" and wq.shape[0] == 3
        for e in range(3):
            got = np.array(mx.dequantize(wq[e], sc[e], group_size=32, bits=4, mode="mxfp4", dtype=mx.float32))
            want = cv.dequant_fp4(t[f"layers.1.ffn.experts.{e}.{proj}.weight"][1],
                                  t[f"layers.1.ffn.experts.{e}.{proj}.scale"][1])
            assert np.array_equal(got, want)
    # mxfp4 experts work directly with gather_qmm (what an engine loader would use)
    x = mx.array(rng.standard_normal((1, 1, 64)).astype(np.float32))
    y = mx.gather_qmm(x, loaded["blk.1.ffn_gate_exps.weight"], loaded["blk.1.ffn_gate_exps.scales"],
                      rhs_indices=mx.array([2]), transpose=True, group_size=32, bits=4, mode="mxfp4")
    w2 = cv.dequant_fp4(t["layers.1.ffn.experts.2.w1.weight"][1], t["layers.1.ffn.experts.2.w1.scale"][1])
    np.testing.assert_allclose(np.array(y).reshape(-1), w2 @ np.array(x).reshape(-1), rtol=1e-4, atol=1e-3)


def test_convert_refuses_bad_input_and_leaves_nothing(rng, tmp_path, capsys):
    assert cli_main(["convert", str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    src = tmp_path / "src"
    src.mkdir()
    cv.write_safetensors(src / "a.safetensors", {"layers.0.attn.wq_a.weight": ("F8_E4M3", _fp8_codes(rng, (8, 32)))})
    assert cli_main(["convert", str(src), str(tmp_path / "o")]) == 2
    assert "has no 'layers.0.attn.wq_a.scale' block scale" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no half-written output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert cli_main(["convert", str(src), str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
