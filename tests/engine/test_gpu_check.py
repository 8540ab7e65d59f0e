"""bench/gpu_check.py dry-run on the CPU: tiny config, the Flash part skipped (its --no-flash)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from ds4agent.engine.device import KERNELS_ENV

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
ARGS = ["--device", "cpu", "--no-flash", "--configs", "tiny", "--agree-tokens", "12", "--prefill", "6",
        "--decode", "3"]


@pytest.fixture
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_prints_one_table_and_passes(gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)  # the suite pins the reference (tests/conftest.py)
    rc = gpu_check.main([*ARGS, "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    table = out[out.index(" check "):]
    for row in ("device", "CPU (MLX", "kernel set of the GPU run", "tiny: argmax agreement (12 positions)",
                "tiny: max |dlogit| / max |logit|", "tiny: prefill", "tiny: decode",
                "tiny: host reads per decoded token", "tiny: peak memory",
                "expert kernels", "not run: no Metal or CUDA GPU"):
        assert row in table, row
    assert "flash" not in table
    assert "FAIL" not in table and out.rstrip().endswith("verdict: ok")
    assert list(tmp_path.iterdir()) == []  # the test file it wrote is gone
    assert KERNELS_ENV not in os.environ  # the switch does not leak out of the run


def test_a_disagreeing_kernel_set_fails_the_check(gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "agreement", lambda *a: {"argmax": 0.9, "rel": 0.5, "over": 7, "rerouted": 2})
    rc = gpu_check.main([*ARGS, "--workdir", str(tmp_path), "--prefill", "0", "--decode", "0"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "90.0%" in out and "5.00e-01" in out and "7 / 2 of 12" in out
    assert out.rstrip().endswith("verdict: FAIL")


def test_a_part_that_crashes_is_a_failed_row_and_the_others_still_run(gpu_check, tmp_path, capsys, monkeypatch):
    """One config's crash (as the Flash part's first run on a real GPU) fails its row and the
    check goes on to the next config and prints the whole table."""
    real = gpu_check.run_config

    def crash_on_tiny(table, name, *args, **kwargs):
        if name == "tiny":
            raise TypeError("cannot unpack non-iterable NoneType object")
        return real(table, name, *args, **kwargs)

    monkeypatch.setattr(gpu_check, "run_config", crash_on_tiny)
    monkeypatch.setattr(gpu_check, "agreement", lambda *a: {"argmax": 1.0, "rel": 0.0, "over": 0, "rerouted": 0})
    rc = gpu_check.main(["--device", "cpu", "--no-flash", "--configs", "tiny,micro", "--agree-tokens", "4",
                         "--prefill", "0", "--decode", "0", "--workdir", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1
    table = captured.out[captured.out.index(" check "):]
    assert "tiny: crashed" in table and "TypeError: cannot unpack non-iterable NoneType object" in table
    assert "micro: argmax agreement (4 positions)" in table
    assert "Traceback" in captured.err
    assert captured.out.rstrip().endswith("verdict: FAIL")
