"""Which routed-expert backend runs, and why, said in one line: Engine.expert_backend (the Ready
event, the status line) and `ds4agent info` (before loading), from the same words."""

from __future__ import annotations

import pytest

from ds4agent import cli
from ds4agent.engine import load_engine
from ds4agent.engine.device import forced_kernel_set
from ds4agent.engine.experts import base
from ds4agent.engine.experts.base import describe_experts, planned_experts
from ds4agent.testmodels import make_test_model
from tests.weights.quantmodel import Q2_TYPES, Q4_TYPES, quant_config, write_quant_model


@pytest.mark.parametrize("kernels,flavour,want", [
    ("cpu", "q2", "IQ2_XXS/Q2_K fast CPU kernels"),
    ("reference", "q4", "Q4_K exact CPU kernels"),
    ("gpu", "q4", "Q4_K portable MLX dequantise + gather_mm"),
])
def test_the_engine_names_its_quantised_expert_backend(tmp_path, kernels, flavour, want):
    path = write_quant_model(tmp_path / "m.gguf", quant_config("micro"), {"q2": Q2_TYPES, "q4": Q4_TYPES}[flavour])
    with forced_kernel_set(kernels):
        assert load_engine(path, ctx=32).expert_backend == want
        # info says the same before loading (no Metal here)
        assert planned_experts(["IQ2_XXS", "Q2_K"] if flavour == "q2" else ["Q4_K"],
                               "gpu" if kernels == "gpu" else "cpu") == want


def test_mxfp4_and_dense_experts_are_named_on_every_kernel_set(tmp_path):
    mx_path = make_test_model(tmp_path / "mx.gguf", "micro", experts="mxfp4")
    f16_path = make_test_model(tmp_path / "f16.gguf", "micro")
    for kernels in ("reference", "cpu", "gpu"):
        with forced_kernel_set(kernels):
            want = "MXFP4 fast CPU kernels" if kernels == "cpu" else "mxfp4 via MLX gather_qmm"
            assert load_engine(mx_path, ctx=32).expert_backend == want
            assert load_engine(f16_path, ctx=32).expert_backend == "dense float32 via MLX gather_mm"
    with forced_kernel_set("reference"):
        assert planned_experts(["MXFP4"], "gpu") == planned_experts(["MXFP4"], "cpu") == "mxfp4 via MLX gather_qmm"
    with forced_kernel_set("cpu"):
        assert planned_experts(["MXFP4"], "cpu") == "MXFP4 fast CPU kernels"
    assert describe_experts([]) == "none"


def test_info_names_the_expert_types_and_backend(tmp_path, capsys, monkeypatch):
    path = make_test_model(tmp_path / "mx.gguf", "micro", experts="mxfp4")
    with forced_kernel_set("reference"):
        assert cli.main(["info", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "            routed types MXFP4; experts: mxfp4 via MLX gather_qmm\n" in out
    assert "routed experts 51.00 KiB (MLX arrays)" in out  # re-laid at load, not mapped
    with forced_kernel_set("cpu"):
        assert cli.main(["info", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "            routed types MXFP4; experts: MXFP4 fast CPU kernels\n" in out
    assert "routed experts 51.00 KiB memory-mapped" in out  # read in place by the fast CPU kernels
    q4 = write_quant_model(tmp_path / "q4.gguf", quant_config("micro"), Q4_TYPES)
    monkeypatch.setattr(base.gpu, "available_backend", lambda: "metal")
    assert planned_experts(["Q4_K"], "gpu") == "Q4_K Metal kernels (self-checked at load, portable MLX if they fail)"
    with forced_kernel_set("cpu"):
        assert cli.main(["info", str(q4), "--device", "cpu"]) == 0
    assert "routed types Q4_K; experts: Q4_K fast CPU kernels" in capsys.readouterr().out
