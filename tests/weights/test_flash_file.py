"""A full-size DS4 Flash GGUF (sparse: its data region is a hole): lazy open, strict metadata,
expert backends that read only the selected experts, and `ds4agent info`."""

from __future__ import annotations

import resource
import sys

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.cli import main as cli_main
from ds4agent.commands.info import format_info
from ds4agent.engine import ConfigError, quant
from ds4agent.engine import config as config_mod
from ds4agent.engine.experts.base import quant_experts
from ds4agent.engine.experts.portable import QuantExperts
from ds4agent.engine.gguf import GGUFFile
from ds4agent.engine.memory import model_info, payload_bytes
from tests.weights.flashfile import write_sparse_flash

GIB = 1 << 30


@pytest.fixture(scope="module")
def flash_file(tmp_path_factory):
    return write_sparse_flash(tmp_path_factory.mktemp("flash") / "ds4flash-q2.gguf")


def _rss_bytes() -> int:
    """Resident memory now (Linux: /proc/self/statm, which a page-in of the mapped file raises);
    elsewhere the peak (ru_maxrss), which can only understate a rise after an earlier peak."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except OSError:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024


def test_payload_size_formula_matches_the_spec_values():
    cfg = config_mod.flash_config()
    spec = {1: 12_811_664, 128: 25_757_580, 512: 31_042_956, 652: 32_966_076, 653: 32_966_080,
            10_000: 161_630_668, 10_240: 164_939_148, 30_000: 436_900_428, 100_000: 1_400_385_548}
    for t, want in spec.items():
        assert payload_bytes(cfg, t) == want, t


def test_flash_file_opens_lazily_and_validates_strictly(flash_file):
    with GGUFFile.open(flash_file) as gf:
        assert flash_file.stat().st_size > 80 * GIB and len(gf.tensors) == 1328
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        cfg = config_mod.from_metadata(gf.metadata, mode="flash", types=types)
        want = config_mod.flash_config()
        assert (cfg.n_layers, cfg.dim, cfg.n_experts, cfg.ratios) == (want.n_layers, want.dim, want.n_experts, want.ratios)
        assert cfg.rms_eps == pytest.approx(1e-6)  # stored as f32
        assert gf.tensors["blk.42.ffn_down_exps.weight"].type_name == "Q2_K"


def test_wrong_flash_metadata_names_the_key(tmp_path):
    bad = write_sparse_flash(tmp_path / "bad.gguf", metadata_overrides={"deepseek4.expert_count": 128})
    with GGUFFile.open(bad) as gf:
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        with pytest.raises(ConfigError, match=r"deepseek4\.expert_count is 128, expected 256"):
            config_mod.from_metadata(gf.metadata, mode="flash", types=types)
    info = model_info(bad, ctx=4096)
    assert info.mode == "invalid" and "deepseek4.expert_count is 128, expected 256" in format_info(info)


def test_expert_backends_read_only_the_selected_experts(flash_file):
    """129 routed-expert tensors (72 GiB) become backends without reading a byte; one MoE step
    through 6 experts of three tensors pages in only those experts (~40 MB)."""
    before = _rss_bytes()
    with GGUFFile.open(flash_file) as gf:
        backends = {}
        for name, ti in gf.tensors.items():
            if "_exps." in name:
                qtype = quant.EXPERT_TYPES[[quant.type_name(t) for t in quant.EXPERT_TYPES].index(ti.type_name)]
                backends[name] = quant_experts(gf.raw(name), qtype, ti.shape, backend="portable")
        assert len(backends) == 129
        assert sum(b.nbytes for b in backends.values()) > 70 * GIB
        ids = mx.array([[3, 17, 100, 255, 0, 64]])
        h = mx.ones((1, 4096))
        gate = backends["blk.10.ffn_gate_exps.weight"]
        up = backends["blk.10.ffn_up_exps.weight"]
        down = backends["blk.10.ffn_down_exps.weight"]
        assert isinstance(gate, QuantExperts) and (gate.d_out, gate.d_in) == (2048, 4096)
        mid = gate.gather_matmul(h, ids) * up.gather_matmul(h, ids)  # [1, 6, 2048]
        out = down.gather_matmul(mid, ids)
        mx.eval(out)
        assert out.shape == (1, 6, 4096) and not np.any(np.array(out))  # a hole reads as zeros
        # Measured while the mapping and every backend are alive: 6 experts x (2 x 2048 x 1056 +
        # 4096 x 672) bytes of raw blocks were touched (~42 MB), plus the f32 dequantised copies
        # (6 x 32 MiB per tensor, mostly freed); far below the 72 GiB the tensors span.
        assert _rss_bytes() - before < 400 << 20  # reading any one whole tensor: > 550 MB
        del backends, gate, up, down


def test_info_on_the_flash_file(flash_file, capsys):
    info = model_info(flash_file, ctx=100_000)
    assert info.mode == "flash" and info.n_tensors == 1328
    assert info.types["IQ2_XXS"][0] == 86 and info.types["Q2_K"][0] == 43
    routed = next(g for g in info.groups if g.name == "routed experts")
    assert routed.file_bytes == routed.memory_bytes == 43 * (2 * 256 * 2048 * 16 * 66 + 256 * 4096 * 8 * 84)
    assert info.state_bytes == 1_400_385_548
    assert cli_main(["info", str(flash_file), "--ctx", "100000"]) == 0
    out = capsys.readouterr().out
    assert "DeepSeek V4 Flash (strict metadata check passed)" in out
    assert "43 layers, width 4096, vocab 129280" in out and "IQ2_XXS" in out and "1.30 GiB" in out


def test_info_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["info", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ds4agent: ") and "nope.gguf" in err and "Traceback" not in err
    assert cli_main(["info", str(tmp_path), "--ctx", "10"]) == 2
    assert "is a directory but not a model written by `ds4agent convert`" in capsys.readouterr().err


def test_info_on_a_test_model(tmp_path, capsys):
    from ds4agent.testmodels import make_test_model

    path = make_test_model(tmp_path / "micro.gguf", config="micro")
    info = model_info(path, ctx=64)
    assert info.mode == "test" and info.config.vocab == 512
    assert info.state_bytes == payload_bytes(info.config, 64)
    assert "ds4agent test model" in format_info(info)


def test_the_memory_plan_counts_q8_0_as_each_kernel_set_holds_it():
    """The fast CPU set repacks Q8_0 at the file's 34 bytes per 32 weights (qmatrix); the others
    hold MLX's affine form, 40."""
    from ds4agent.engine.device import forced_kernel_set
    from ds4agent.engine.memory import memory_bytes

    n = 1024 * 4096
    with forced_kernel_set("cpu"):
        assert memory_bytes("blk.0.attn_q_a.weight", "Q8_0", n, n // 32 * 34) == n // 32 * 34
    for other in ("reference", "gpu"):
        with forced_kernel_set(other):
            assert memory_bytes("blk.0.attn_q_a.weight", "Q8_0", n, n // 32 * 34) == n // 32 * 40


def test_the_memory_plan_counts_only_what_the_engine_reads(flash_file):
    """A real file may carry tensors the engine never loads (an MTP block): they must not make the
    start-up check refuse a model that fits."""
    from ds4agent.engine.config import flash_config
    from ds4agent.engine.gguf import GGUFFile, TensorInfo
    from ds4agent.engine.memory import memory_plan

    with GGUFFile.open(flash_file) as gf:
        tensors = list(gf.tensors.values())
    extra = [TensorInfo("mtp.0.ffn_gate_exps.weight", 16, (4096, 2048, 256), 1 << 40, 553648128),
             TensorInfo("mtp.0.attn_q_b.weight", 8, (1024, 32768), 1 << 41, 35651584)]
    plain = memory_plan(tensors, flash_config(), 32768)
    assert memory_plan(tensors + extra, flash_config(), 32768) == plain
    assert plain.experts == sum(t.nbytes for t in tensors if "_exps." in t.name)  # real files: no sharing
