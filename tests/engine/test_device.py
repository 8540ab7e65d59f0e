"""Device selection: the GPU when MLX has one, the CPU otherwise, `--device` overriding, and a
one-line notice (never a crash) when a GPU was asked for or expected and is not there."""

from __future__ import annotations

import pytest

from ds4agent import cli
from ds4agent.agent import events as ev
from ds4agent.engine import EngineError, load_engine
from ds4agent.engine import device as dev
from ds4agent.testmodels import make_test_model
from ds4agent.ui import fmt
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import ScriptedEngine


def _machine(monkeypatch, *, gpu: str | None, cuda_build: bool = False) -> list:
    """Pretend MLX sees `gpu` ("metal", "cuda" or None); record the default devices set."""
    monkeypatch.setattr(dev, "_available", lambda backend: backend == gpu)
    monkeypatch.setattr(dev, "cuda_build_installed", lambda: cuda_build)
    calls: list = []
    monkeypatch.setattr(dev.mx, "set_default_device", calls.append)
    return calls


@pytest.mark.parametrize("gpu, label", [("metal", "Metal GPU"), ("cuda", "CUDA GPU")])
def test_a_gpu_is_used_by_default_and_cpu_overrides(monkeypatch, gpu, label):
    calls = _machine(monkeypatch, gpu=gpu)
    assert dev.use_device(None) == dev.Device("gpu", label)
    assert dev.use_device("gpu") == dev.Device("gpu", label)
    assert dev.use_device("cpu") == dev.Device("cpu", "CPU")
    assert calls == [dev.mx.gpu, dev.mx.gpu, dev.mx.cpu]


def test_no_gpu_runs_on_the_cpu_and_says_so_only_when_one_was_asked_for(monkeypatch):
    calls = _machine(monkeypatch, gpu=None)
    assert dev.use_device(None) == dev.Device("cpu", "CPU")  # nothing expected, nothing to say
    asked = dev.use_device("gpu")
    assert (asked.kind, asked.label) == ("cpu", "CPU")
    assert asked.notice.startswith("--device gpu: MLX finds no usable GPU") and "\n" not in asked.notice
    assert calls == [dev.mx.cpu, dev.mx.cpu]


def test_cuda_build_without_a_gpu_falls_back_with_a_notice(monkeypatch):
    _machine(monkeypatch, gpu=None, cuda_build=True)
    d = dev.choose_device(None)
    assert (d.kind, d.label) == ("cpu", "CPU")
    assert "CUDA build is installed but finds no usable NVIDIA GPU; running on the CPU" in d.notice


def test_broken_gpu_query_counts_as_no_gpu(monkeypatch):
    class Broken:
        @staticmethod
        def is_available():
            raise RuntimeError("driver mismatch")

    monkeypatch.setattr(dev.mx, "cuda", Broken, raising=False)
    monkeypatch.setattr(dev.mx, "metal", Broken, raising=False)
    assert dev.gpu_backend() is None


def test_bad_device_name_is_refused():
    with pytest.raises(EngineError, match="--device must be cpu or gpu"):
        dev.choose_device("tpu")


def test_cli_validates_device(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["--device", "tpu"])
    assert exit_.value.code == 2
    assert cli.build_parser().parse_args(["--device", "cpu"]).device == "cpu"
    assert cli.build_parser().parse_args(["--device", "gpu", "info", "m.gguf"]).device == "gpu"
    assert cli.build_parser().parse_args(["info", "m.gguf", "--device", "cpu"]).device == "cpu"


def test_engine_load_records_the_device_and_asking_for_a_missing_gpu_still_loads(tmp_path, monkeypatch):
    model = make_test_model(tmp_path / "micro.gguf", "micro", seed=1)
    monkeypatch.setattr(dev, "_available", lambda backend: False)  # this machine has no GPU, as far as we know
    before = dev.mx.default_device()
    try:
        engine = load_engine(model, ctx=64, device="gpu")
        assert engine.device.label == "CPU" and engine.device.notice.startswith("--device gpu")
        assert dev.mx.default_device() == dev.mx.cpu
        assert engine.new_session().sync([1, 2, 3]) == 3  # it runs
    finally:
        dev.mx.set_default_device(before)


def test_info_names_the_device(tmp_path, monkeypatch, capsys):
    model = make_test_model(tmp_path / "micro.gguf", "micro", seed=1)
    _machine(monkeypatch, gpu="cuda")
    assert cli.main(["info", str(model)]) == 0
    assert "device      CUDA GPU" in capsys.readouterr().out
    assert cli.main(["info", str(model), "--device", "cpu"]) == 0
    assert "device      CPU" in capsys.readouterr().out


def test_agent_reports_the_device_and_the_fallback_notice(tmp_path):
    engine = ScriptedEngine()
    engine.device = dev.Device("cpu", "CPU", "--device gpu: MLX finds no usable GPU here; running on the CPU")
    h = AgentHarness.build(tmp_path, engine=engine)
    try:
        ready = of(h.events, ev.Ready)[0]
        assert ready.device == "CPU"
        notices = [n.text for n in of(h.events, ev.Notice) if "GPU" in n.text]
        assert notices == [engine.device.notice]
    finally:
        h.stop()


def test_status_line_shows_the_device():
    s = fmt.StatusState(state="idle", ctx_total=1000, think_mode="think", permission="ask")
    assert fmt.status_line(s).endswith("think · ask")
    s.device = "Metal GPU"
    assert fmt.status_line(s).endswith("think · ask · Metal GPU")


def test_the_gpu_computes_float32_products_not_tf32():
    """MLX's CUDA and M5 default is TF32 products (10-bit mantissa), outside the GPU kernel
    set's float32 contract: the engine sets the switch off from its loader's import until MLX
    has read it (the device choice), then takes it out of the environment, so the programs the
    agent starts get MLX's default; a value the user set is kept throughout."""
    import os
    import subprocess
    import sys

    probe = ("import os; from ds4agent.engine import load_engine; from ds4agent.engine import device; "
             "before = os.environ.get('MLX_ENABLE_TF32'); device.use_device('cpu'); "
             "print(before, os.environ.get('MLX_ENABLE_TF32'))")
    env = {k: v for k, v in os.environ.items() if k != dev.TF32_ENV}
    fresh = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == ["0", "None"]
    kept = subprocess.run([sys.executable, "-c", probe], env={**env, dev.TF32_ENV: "1"},
                          capture_output=True, text=True, check=True)
    assert kept.stdout.split() == ["1", "1"]
