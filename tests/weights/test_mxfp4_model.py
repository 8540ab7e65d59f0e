"""A test model with ds4's native MXFP4 routed experts (`make-test-model --experts mxfp4`): written as
ggml type 39, loaded through the engine onto MLX's mxfp4 gather_qmm, and the same model as the one
built in memory from the same values."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent import cli
from ds4agent.engine import load_engine
from ds4agent.engine.config import test_config
from ds4agent.engine.device import forced_kernel_set
from ds4agent.engine.experts.fast import FastExperts
from ds4agent.engine.experts.mxfp4 import Mxfp4Experts
from ds4agent.engine.experts.portable import DenseExperts
from ds4agent.engine.gguf import GGUFFile
from ds4agent.engine.model import forward
from ds4agent.engine.session import Engine
from ds4agent.engine.state import SessionState
from ds4agent.testmodels import make_test_model
from ds4agent.testmodels.random_weights import random_tensors, weights_from_tensors

TOKENS = [int(t) for t in np.random.default_rng(7).integers(3, 5000, 29)]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("mxfp4")
    return make_test_model(d / "mx.gguf", "tiny", seed=0, experts="mxfp4"), make_test_model(d / "f16.gguf", "tiny", seed=0)


def test_the_file_holds_type_39_experts_and_otherwise_the_f16_files_tensors(paths):
    mx_path, f16_path = paths
    with GGUFFile.open(mx_path) as a, GGUFFile.open(f16_path) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, ti in a.tensors.items():
            if "_exps." in name:
                assert ti.ggml_type == 39 and ti.type_name == "MXFP4" and ti.shape == b.tensors[name].shape
                assert ti.nbytes * 32 == ti.n_elements * 17  # 4.25 bits per weight
            else:
                assert ti.type_name == b.tensors[name].type_name
                assert np.array_equal(a.raw(name), b.raw(name)), name  # the same draws, the same bytes
    assert mx_path.stat().st_size < f16_path.stat().st_size


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_loads_onto_mlx_mxfp4_and_equals_the_model_built_from_the_same_values(paths, kernels):
    with forced_kernel_set(kernels):
        _loads_onto_mlx_mxfp4(paths, kernels)


def _loads_onto_mlx_mxfp4(paths, kernels):
    cfg = test_config("tiny")
    eng = load_engine(paths[0], ctx=64)
    for layer in eng.weights.layers:  # the fast CPU set's own kernels read the blocks in place
        for ex in (layer.ffn.gate_exps, layer.ffn.up_exps, layer.ffn.down_exps):
            assert type(ex) is (FastExperts if kernels == "cpu" else Mxfp4Experts)
    assert eng.quant_bits == 4  # a 4-bit expert type: what its session files record
    tensors = random_tensors(cfg, 0, experts="mxfp4")
    built = Engine(config=cfg, weights=weights_from_tensors(cfg, tensors, quantize_q8=True, mxfp4_experts=True), ctx=64)
    dense = Engine(config=cfg, weights=weights_from_tensors(cfg, tensors, quantize_q8=True), ctx=64)
    assert type(dense.weights.layers[0].ffn.gate_exps) is DenseExperts
    logits = []
    for engine in (eng, built, dense):
        s = engine.new_session()
        s.sync(TOKENS)
        logits.append(np.array(s.logits))
    got, same, twin = logits
    assert np.array_equal(got, same)  # the file's blocks are the values' blocks, on the same backend
    # Against the dequantised twin: the expert products only. The reference set's MLX mxfp4
    # products differ by float32 rounding (rounding simulations off: measured 3.9e-7 of the
    # largest logit); the fast CPU set's by its 8-bit activations too (measured 1.2e-2; 3e-2
    # allowed, the fast set's model-level bound, docs/numerics-fast-cpu.md). With the simulations on (f16 rows, fp8/fp4
    # steps) such a difference flips a simulated rounding now and then, and one flipped fp8 step
    # of a cached row moves the logits by ~1e-3-1e-2 of the largest (measured 6.0e-5 reference
    # set, 5.6e-3 fast CPU set).
    plain = [np.array(forward(e.weights, cfg, SessionState.empty(cfg), TOKENS, rounding=False)[0][-1])
             for e in (built, dense)]
    bound = 3e-2 if kernels == "cpu" else 1e-5
    assert np.abs(plain[0] - plain[1]).max() <= bound * max(1.0, np.abs(plain[1]).max())
    assert np.abs(got - twin).max() <= max(bound, 2e-2) * max(1.0, np.abs(twin).max())  # cpu: 1.2e-2
    assert got.argmax() == twin.argmax()
    assert np.isfinite(got).all() and 0.1 < float(np.std(got)) < 100


def test_cli_writes_mxfp4_for_a_test_config_and_still_refuses_q2(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert cli.main(["make-test-model", str(out), "--config", "micro", "--experts", "mxfp4", "--seed", "2"]) == 0
    assert "micro, mxfp4 experts, seed 2" in capsys.readouterr().out
    with GGUFFile.open(out) as gf:
        assert gf.tensors["blk.0.ffn_down_exps.weight"].type_name == "MXFP4"
    assert cli.main(["make-test-model", str(tmp_path / "q.gguf"), "--config", "micro", "--experts", "q4"]) == 2
    assert "--experts mxfp4 applies to every config" in capsys.readouterr().err


def test_a_flash_layout_mxfp4_plan_has_ds4s_block_sizes():
    from ds4agent.engine.config import flash_config
    from ds4agent.testmodels.flash import plan_layout

    layout = plan_layout(flash_config(), "mxfp4")
    routed = [p for p in layout.tensors if "_exps." in p.spec.name]
    assert {p.spec.ggml_type for p in routed} == {"MXFP4"}
    assert sum(p.nbytes for p in routed) == 43 * 3 * 256 * 2048 * 4096 // 32 * 17  # 82.8 GB: the release
    assert layout.max_file_bytes < 12 << 30


def test_the_file_pages_of_mxfp4_experts_are_dropped_once_re_laid(paths, monkeypatch):
    """The re-laid arrays are the only copy kept: like every converted tensor, the experts' file
    pages are released after the load reads them (a Q4_K tensor's stay mapped: its CPU kernels
    read the selected experts from the map). Measured on the small config after a prefill:
    2 MiB of the file resident for mxfp4 against 15 MiB for q4, peak RSS 426 vs 425 MiB."""
    released: list[str] = []
    real = GGUFFile.release

    def release(self, name):
        released.append(name)
        return real(self, name)

    monkeypatch.setattr(GGUFFile, "release", release)
    with forced_kernel_set("reference"):  # the re-laid backend (the fast CPU set reads the map)
        eng = load_engine(paths[0], ctx=64)
    experts = {n for n in eng.gguf.tensors if "_exps." in n}
    assert experts and experts <= set(released)
    assert not any(ex.maps_file() for layer in eng.weights.layers
                   for ex in (layer.ffn.gate_exps, layer.ffn.up_exps, layer.ffn.down_exps))


def test_flash_writer_mxfp4_blocks_have_the_expert_scale(tmp_path):
    """The Flash-layout writer's MXFP4 regions (here at the micro shape): random codes under a
    power-of-two scale near the expert scale 0.5/sqrt(fan_in), never the refused scale byte 255."""
    import gguf

    from ds4agent.testmodels.flash import write_flash_model

    path = write_flash_model(tmp_path / "f.gguf", test_config("micro"), experts="mxfp4")
    with GGUFFile.open(path) as gf:
        name = "blk.1.ffn_gate_exps.weight"
        ti = gf.tensors[name]
        assert ti.type_name == "MXFP4" and gf.tensors["blk.2.ffn_gate_exps.weight"].offset == ti.offset  # shared
        blocks = np.array(gf.raw(name)).reshape(-1, 17)
    assert blocks[:, 0].max() < 255
    w = gguf.quants.dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType.MXFP4)
    want = 0.5 * ti.shape[-1] ** -0.5
    assert want / 1.5 < float(np.sqrt(np.mean(np.square(w.astype(np.float64))))) < want * 1.5
