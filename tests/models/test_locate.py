"""The default-model lookup order, the model directory, and the memory fit check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ds4agent.models import catalog, fit, locate
from ds4agent.models.errors import ModelNotFoundError


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """A working directory and a model directory that hold nothing; no model variables."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    monkeypatch.setenv("DS4AGENT_MODEL_DIR", str(tmp_path / "models"))
    return tmp_path


def _file(path, size=16, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_model_dir_order(tmp_path, monkeypatch):
    monkeypatch.delenv("DS4AGENT_MODEL_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert locate.model_dir() == tmp_path / "home" / ".ds4" / "models"
    monkeypatch.setenv("DS4AGENT_MODEL_DIR", str(tmp_path / "env"))
    assert locate.model_dir() == tmp_path / "env"
    assert locate.model_dir(str(tmp_path / "flag")) == tmp_path / "flag"


def test_lookup_order_flag_env_local_pulled(clean_env, monkeypatch):
    models = clean_env / "models"
    q2 = _file(models / catalog.FLAVOURS[0].filename, mtime=1_000)
    q4 = _file(models / catalog.FLAVOURS[1].filename, mtime=2_000)
    _file(models / "x.gguf.part", mtime=3_000)  # an unfinished download is never run
    _file(models / catalog.flavour("mtp").filename, mtime=4_000)  # not a model to run alone
    # newest pulled model
    assert locate.resolve_model_path(None) == q4
    os.utime(q2, (5_000, 5_000))  # pulled again: now the newest
    assert locate.resolve_model_path(None) == q2
    # ./ds4flash.gguf beats the model directory
    local = _file(clean_env / "work" / "ds4flash.gguf")
    assert locate.resolve_model_path(None).resolve() == local.resolve()
    # $DS4AGENT_MODEL beats ./ds4flash.gguf
    env_model = _file(clean_env / "env.gguf")
    monkeypatch.setenv("DS4AGENT_MODEL", str(env_model))
    assert locate.resolve_model_path(None) == env_model
    # --model beats everything
    flag_model = _file(clean_env / "flag.gguf")
    assert locate.resolve_model_path(str(flag_model)) == flag_model


def test_named_model_that_is_missing_is_an_error_not_a_fallback(clean_env, monkeypatch):
    _file(clean_env / "models" / catalog.FLAVOURS[0].filename)
    with pytest.raises(ModelNotFoundError, match=r"no model found at .*nope.gguf \(--model\)"):
        locate.resolve_model_path(str(clean_env / "nope.gguf"))
    monkeypatch.setenv("DS4AGENT_MODEL", str(clean_env / "gone.gguf"))
    with pytest.raises(ModelNotFoundError, match=r"gone.gguf \(\$DS4AGENT_MODEL\)"):
        locate.resolve_model_path(None)


def test_no_model_anywhere_says_what_to_run(clean_env):
    with pytest.raises(ModelNotFoundError) as err:
        locate.resolve_model_path(None)
    text = str(err.value)
    assert "ds4agent pull q2-imatrix" in text and "81 GB" in text and "96 GB of RAM" in text
    assert "make-test-model" in text and str(clean_env / "models") in text


def test_cli_without_model_exits_2_with_pull_advice(clean_env):
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "-p", "hi"], capture_output=True, text=True,
                       cwd=clean_env / "work", env={**os.environ})
    assert r.returncode == 2
    assert "ds4agent pull q2-imatrix" in r.stderr and "Traceback" not in r.stderr


def test_fit_problem_gives_the_numbers():
    assert fit.fit_problem(80 * catalog.GB, 96 * catalog.GB, what="q2") is None  # fits
    assert fit.fit_problem(80 * catalog.GB, None, what="q2") is None  # unknown RAM: never refuse on a guess
    assert fit.fit_problem(81 * catalog.GB, 64 * catalog.GB, what="q2") == (
        "q2 needs about 81 GB of memory and this machine has 64 GB of RAM")


def test_startup_refuses_a_model_larger_than_ram_before_loading(clean_env, monkeypatch, capsys, tmp_path):
    """The refusal is the engine's, from the tensor directory, before any weight is read."""
    from ds4agent import cli
    from ds4agent.engine import weights
    from ds4agent.testmodels import make_test_model

    model = make_test_model(tmp_path / "m.gguf", "micro")
    monkeypatch.setattr(fit, "machine_ram", lambda: 1000)  # bytes
    monkeypatch.setattr(weights, "load_weights", lambda *a, **k: pytest.fail("weights were read"))
    out = tmp_path / "o.npy"
    assert cli.main(["dump-logits", "--model", str(model), "--tokens", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the model needs about" in err and "but this machine has 1000 B" in err
    assert not out.exists()


def test_machine_ram_is_a_plausible_number():
    ram = fit.machine_ram()
    assert ram is None or ram > 64 * 1024 * 1024
