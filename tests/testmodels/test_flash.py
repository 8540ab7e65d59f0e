"""The Flash-shape test file: ds4's tensor table, types, metadata and tokenizer,
random weights in shared data regions.

A full-size file (4 GiB) is too big for a unit test, so the writer's one code path is exercised on
a scaled-down Flash layout (43 layers, the real ratios, vocabulary and quant types, width 256), and
the full-size layout is checked as a plan (tensor table, offsets, size) without writing data.
"""

from __future__ import annotations

import hashlib
from collections import namedtuple
from dataclasses import replace

import gguf
import mlx.core as mx
import numpy as np
import pytest

from ds4agent import cli
from ds4agent.commands.info import format_info
from ds4agent.engine import Engine, quant
from ds4agent.engine.config import FLASH_TEST_KEY, TEST_MODEL_KEY, flash_config, flash_ratio, from_metadata
from ds4agent.engine.device import KERNELS_ENV
from ds4agent.engine.gguf import GGUFFile
from ds4agent.engine.layout import tensor_table
from ds4agent.engine.memory import model_info
from ds4agent.engine.weights import load_weights
from ds4agent.protocol.tokenizer import Tokenizer
from ds4agent.testmodels import flash, make_test_model

GIB = 1 << 30
Q8_ROLES = ("attn_q_a.", "attn_q_b.", "attn_kv.", "attn_output_a.", "attn_output_b.", "_shexp.")
F16_ROLES = ("hc_attn_fn.", "hc_ffn_fn.", "compressor_kv.", "compressor_gate.", "compressor_ape.",
             "indexer.attn_q_b.", "indexer.proj.", "ffn_gate_inp.")


def scaled_flash(n_layers: int = 43):
    """The Flash layout at width 256: real layer count, ratios, vocabulary; small everything else."""
    return replace(
        flash_config(), n_layers=n_layers, dim=256, n_heads=4, head_dim=128, value_dim=128,
        rope_dim=64, q_lora_rank=128, out_lora_rank=64, out_groups=2, n_experts=8,
        n_experts_used=2, expert_ffn=256, window=16, indexer_heads=4, indexer_dim=64,
        indexer_top_k=8, ratios=tuple(flash_ratio(i) for i in range(n_layers)),
        swiglu_clamp=(10.0,) * n_layers, name="flash-scaled",
    )


def expected_type(name: str, experts: str) -> str:
    """model.md §6.3's type column, stated independently of the writer."""
    if "_exps." in name:
        if experts == "q4":
            return "Q4_K"
        return "Q2_K" if "down_exps" in name else "IQ2_XXS"
    if name.endswith("tid2eid.weight"):
        return "I32"
    if name in ("token_embd.weight", "output_hc_fn.weight") or any(r in name for r in F16_ROLES):
        return "F16"  # (before Q8_0: the indexer's attn_q_b is F16)
    if name == "output.weight" or any(r in name for r in Q8_ROLES):
        return "Q8_0"
    return "F32"


@pytest.fixture(scope="module")
def q2_file(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("flashshape") / "q2.gguf", scaled_flash(),
                           seed=0, experts="q2")


@pytest.fixture(scope="module")
def q2_reader(q2_file):
    """The `gguf` package's reader: the cross-check of our own (it parses every field: slow)."""
    return gguf.GGUFReader(q2_file)


def test_names_shapes_and_types_are_ds4s_and_the_gguf_package_reads_the_same(q2_file, q2_reader):
    cfg = scaled_flash()
    table = tensor_table(cfg)
    reader = {t.name: t for t in q2_reader.tensors}
    with GGUFFile.open(q2_file) as gf:
        assert list(gf.tensors) == [s.name for s in table]
        for spec in table:
            ti = gf.tensors[spec.name]
            assert ti.shape == spec.shape, spec.name
            assert ti.type_name == expected_type(spec.name, "q2"), spec.name
            r = reader[spec.name]
            assert (r.tensor_type.name, r.data_offset, tuple(int(d) for d in r.shape)) == \
                (ti.type_name, ti.offset, ti.dims)
        assert gf.file_size < sum(ti.nbytes for ti in gf.tensors.values())  # regions are shared


def test_experts_share_one_region_large_matrices_cycle_small_tensors_are_distinct(q2_file):
    with GGUFFile.open(q2_file) as gf:
        def off(name):
            return gf.tensors[name].offset

        L = 43
        for kind in ("gate", "up", "down"):
            assert len({off(f"blk.{i}.ffn_{kind}_exps.weight") for i in range(L)}) == 1
        assert len({off(f"blk.0.ffn_{k}_exps.weight") for k in ("gate", "up", "down")}) == 3
        # the k-th layer with a tensor uses variant k % 4
        assert [off(f"blk.{i}.attn_q_b.weight") for i in range(8)] == \
            [off(f"blk.{i % 4}.attn_q_b.weight") for i in range(8)]
        assert len({off(f"blk.{i}.attn_q_b.weight") for i in range(L)}) == 4
        ratio4 = [i for i in range(L) if flash_ratio(i) == 4]
        assert off(f"blk.{ratio4[4]}.indexer.attn_q_b.weight") == off(f"blk.{ratio4[0]}.indexer.attn_q_b.weight")
        assert len({off(f"blk.{i}.indexer.attn_q_b.weight") for i in ratio4[:4]}) == 4
        for name in ("attn_norm", "hc_attn_fn", "hc_ffn_base", "attn_sinks", "ffn_gate_inp"):
            assert len({off(f"blk.{i}.{name}.weight") for i in range(L)}) == L, name
        # tensors either share exactly one region or do not overlap at all
        spans = sorted({(t.offset, t.nbytes) for t in gf.tensors.values()})
        for (a, na), (b, _) in zip(spans, spans[1:], strict=False):
            assert a + na <= b
        for t in gf.tensors.values():
            same = [u for u in gf.tensors.values() if u.offset == t.offset]
            assert {(u.type_name, u.shape) for u in same} == {(t.type_name, t.shape)}


@pytest.mark.parametrize("name", ["blk.5.ffn_gate_exps.weight", "blk.5.ffn_up_exps.weight",
                                  "blk.5.ffn_down_exps.weight"])
def test_expert_blocks_are_valid_and_scaled_like_the_test_models(q2_file, name):
    with GGUFFile.open(q2_file) as gf:
        ti = gf.tensors[name]
        qtype = gguf.GGMLQuantizationType[ti.type_name]
        raw = np.array(gf.raw(name)).reshape(*ti.shape[:-1], -1)
        ref = gguf.quants.dequantize(raw, qtype)  # the reference dequantiser
        assert ref.shape == ti.shape and np.isfinite(ref).all()
        rms = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
        want = 0.5 / np.sqrt(ti.shape[-1])  # the test models' expert scale
        assert 0.85 * want < rms < 1.15 * want
        assert abs(float(ref.mean())) < 0.02 * rms
        per_expert = np.sqrt(np.mean(ref.astype(np.float64) ** 2, axis=(1, 2)))
        assert per_expert.min() > 0.8 * want  # every expert is live
        ours = quant.dequantize(mx.array(np.array(gf.raw(name))), int(qtype), ti.shape)
        assert np.array_equal(np.array(ours), ref)


def test_tokenizer_is_embedded_as_ds4s_files_carry_it(q2_file, q2_reader):
    tok = Tokenizer.load()
    with GGUFFile.open(q2_file) as gf:
        m = gf.metadata
        assert (m["tokenizer.ggml.model"], m["tokenizer.ggml.pre"]) == ("gpt2", "joyai-llm")
        tokens = list(m["tokenizer.ggml.tokens"])
        assert len(tokens) == 129280
        assert tokens == [tok.token_string(i) for i in range(129280)]
        assert (tokens[0], tokens[1], tokens[128803], tokens[128825]) == \
            ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "｜DSML｜")  # the full-width bar (U+FF5C) is the protocol's
        types = m["tokenizer.ggml.token_type"]
        assert len(types) == 129280 and gf.array_types["tokenizer.ggml.token_type"].name == "INT32"
        assert (types[0], types[1], types[128803], types[128821], types[128825], types[1000]) == \
            (3, 3, 3, 4, 4, 1)  # control, control, control, user-defined, user-defined, normal
        merges = list(m["tokenizer.ggml.merges"])
        assert len(merges) == 127741 and merges[:2] == ["Ġ t", "Ġ a"]
        assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"],
                m["tokenizer.ggml.padding_token_id"]) == (0, 1, 1)
        assert gf.value_types["tokenizer.ggml.bos_token_id"].name == "UINT32"
    field = q2_reader.get_field("tokenizer.ggml.tokens")
    assert len(field.data) == 129280 and field.contents(128804) == "<｜Assistant｜>"  # the full-width bar (U+FF5C) is the protocol's


def test_no_test_model_marker_and_info_says_what_the_file_is(q2_file):
    with GGUFFile.open(q2_file) as gf:
        assert TEST_MODEL_KEY not in gf.metadata
        assert gf.metadata["general.name"] == \
            "ds4agent Flash-shape test model (q2, seed 0, shared expert data)"
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        got, want = from_metadata(gf.metadata, mode="test", types=types), scaled_flash()
        assert replace(got, hc_eps=want.hc_eps, rms_eps=want.rms_eps) == want  # eps are stored as f32
    lines = format_info(model_info(q2_file)).splitlines()
    notes = [ln for ln in lines if ln.startswith("test file ")]
    assert len(notes) == 1 and "random-weight test file with shared data regions (q2 experts, seed 0)" in notes[0]


def test_activations_stay_finite_and_varied_through_43_layers(q2_file):
    with GGUFFile.open(q2_file) as gf:
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        cfg = from_metadata(gf.metadata, mode="test", types=types)
        eng = Engine(config=cfg, weights=load_weights(gf, cfg), ctx=64)
        a, b = eng.new_session(), eng.new_session()
        a.sync([0, 5, 99, 250, 3, 17, 400, 1000, 20000, 128803, 88, 7])
        b.sync([0, 5, 99, 250, 3, 17])
        for logits in (a.logits, b.logits):
            assert np.isfinite(logits).all()
            assert 0.3 < float(logits.std()) < 30 and float(logits.max() - logits.min()) > 3
        assert float(np.abs(a.logits - b.logits).max()) > 0.5  # the input matters


def _buffer_address(a: mx.array) -> int:
    return np.asarray(memoryview(a)).__array_interface__["data"][0]


def test_gpu_kernel_set_holds_one_device_copy_per_shared_expert_region(q2_file, monkeypatch):
    """The GPU kernel set copies expert blocks into resident device arrays. The test file points
    every layer's gate (likewise up, down) tensor at one region: one copy per region, not one
    per tensor (at the full shape a copy per tensor is 72 GiB for 1.7 GiB of distinct bytes),
    and the shared copies decode what the CPU reference decodes."""
    tokens = [0, 5, 99, 250, 3, 17]
    with GGUFFile.open(q2_file) as gf:
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        cfg = from_metadata(gf.metadata, mode="test", types=types)
        ref = Engine(config=cfg, weights=load_weights(gf, cfg), ctx=64).new_session()
        ref.sync(tokens)
        monkeypatch.setenv(KERNELS_ENV, "gpu")
        before = mx.get_active_memory()
        weights = load_weights(gf, cfg)
        held = mx.get_active_memory() - before
        kinds = {"gate": set(), "up": set(), "down": set()}
        for layer in weights.layers:
            for kind, addresses in kinds.items():
                ex = getattr(layer.ffn, f"{kind}_exps")
                assert isinstance(ex.raw, mx.array)
                addresses.add(_buffer_address(ex.raw))
        assert [len(a) for a in kinds.values()] == [1, 1, 1]
        plan = model_info(q2_file).plan
        assert held < plan.weights + plan.experts + (8 << 20)  # not 43 copies of each region
        gpu = Engine(config=cfg, weights=weights, ctx=64).new_session()
        gpu.sync(tokens)
        scale = float(np.abs(ref.logits).max())
        assert float(np.abs(gpu.logits - ref.logits).max()) <= 1e-2 * scale
        assert int(np.argmax(gpu.logits)) == int(np.argmax(ref.logits))


def test_q4_flavour_is_deterministic_per_seed(tmp_path):
    cfg = scaled_flash(4)
    one = make_test_model(tmp_path / "a.gguf", cfg, seed=3, experts="q4")
    again = make_test_model(tmp_path / "b.gguf", cfg, seed=3, experts="q4")
    other = make_test_model(tmp_path / "c.gguf", cfg, seed=4, experts="q4")

    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert digest(one) == digest(again) != digest(other)
    with GGUFFile.open(one) as gf:
        for name, ti in gf.tensors.items():
            assert ti.type_name == expected_type(name, "q4"), name
        w = gguf.quants.dequantize(np.array(gf.raw("blk.3.ffn_down_exps.weight")).reshape(8, 256, -1),
                                   gguf.GGMLQuantizationType.Q4_K)
        rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        assert 0.85 < rms / (0.5 / np.sqrt(cfg.expert_ffn)) < 1.15
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]


@pytest.mark.parametrize("experts", ["q2", "q4"])
def test_full_size_layout_is_ds4s_table_within_12_gib(experts):
    cfg = flash_config()
    layout = flash.plan_layout(cfg, experts)
    table = tensor_table(cfg)
    assert [p.spec.name for p in layout.tensors] == [s.name for s in table]
    assert len(layout.tensors) == 1328
    for p, spec in zip(layout.tensors, table, strict=True):
        assert p.spec.shape == spec.shape
        assert p.spec.ggml_type == expected_type(spec.name, experts), spec.name
        assert p.nbytes == flash.tensor_bytes(p.spec.ggml_type, p.spec.shape)
        # a shared region holds data of exactly this tensor's type and shape
        assert (p.region.spec.ggml_type, p.region.spec.shape) == (p.spec.ggml_type, p.spec.shape)
    regions = layout.regions
    assert all(r.offset % flash.ALIGN == 0 for r in regions)
    assert all(a.offset + a.nbytes <= b.offset for a, b in zip(regions, regions[1:], strict=False))
    assert regions[-1].offset + regions[-1].nbytes <= layout.data_bytes
    assert layout.max_file_bytes <= flash.MAX_FILE_BYTES
    routed = sum(p.nbytes for p in layout.tensors if "_exps." in p.spec.name)
    assert routed == {"q2": 77_913_391_104, "q4": 155_826_782_208}[experts]  # 72.6 / 145.1 GiB
    lo, hi = {"q2": (3.8, 4.3), "q4": (5.5, 6.0)}[experts]  # the file: 4.05 / 5.74 GiB
    assert lo * GIB < layout.data_bytes < hi * GIB


def test_strict_check_ignores_the_description_and_tokenizer_keys():
    meta = flash_config().to_metadata() | {
        FLASH_TEST_KEY: flash.describe("q2", 0),
        "general.name": "ds4agent Flash-shape test model (q2, seed 0, shared expert data)",
        "tokenizer.ggml.pre": "joyai-llm",
    }
    assert from_metadata(meta, mode="flash") == flash_config()


def test_cli_refuses_experts_without_flash_and_a_too_small_disk(tmp_path, capsys, monkeypatch):
    out = tmp_path / "x.gguf"
    assert cli.main(["make-test-model", str(out), "--config", "tiny", "--experts", "q2"]) == 2
    assert "--experts q2 applies to --config flash" in capsys.readouterr().err
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(flash.shutil, "disk_usage", lambda _p: usage(100 * GIB, 99 * GIB, GIB))
    assert cli.main(["make-test-model", str(out), "--config", "flash"]) == 2
    err = capsys.readouterr().err
    assert "not enough free disk space" in err and "1.0 GiB free" in err
    assert list(tmp_path.iterdir()) == []
