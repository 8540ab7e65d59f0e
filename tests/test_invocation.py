"""The program name in printed hints: what the user can type here to run ds4agent again."""

from __future__ import annotations

import os
import subprocess
import sys

from ds4agent.invocation import program


def _script(directory) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ds4agent"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_a_venv_program_not_on_path_is_printed_as_run(tmp_path):
    run = _script(tmp_path / ".venv/bin")
    assert program(run, path=str(tmp_path / "elsewhere")) == run


def test_the_plain_name_when_it_runs_this_very_program(tmp_path):
    run = _script(tmp_path / ".venv/bin")
    assert program(run, path=str(tmp_path / ".venv/bin")) == "ds4agent"


def test_another_ds4agent_on_path_does_not_count(tmp_path):
    run = _script(tmp_path / ".venv/bin")
    _script(tmp_path / "other")
    assert program(run, path=str(tmp_path / "other")) == run


def test_python_dash_m_keeps_the_plain_name():
    assert program("/src/ds4agent/cli.py", path="") == "ds4agent"


def test_the_no_model_message_names_the_program_as_run(tmp_path):
    # The venv's console script run by its path, with no venv on PATH: the hints must be
    # runnable as printed (the README's install line leaves `ds4agent` off PATH until activate).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ds4agent"
    script.write_text(f"#!{sys.executable}\nfrom ds4agent.cli import entry\nentry()\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS4AGENT_")}
    env.update(PATH="/usr/bin:/bin", HOME=str(tmp_path), DS4AGENT_MODEL_DIR=str(tmp_path / "models"))
    r = subprocess.run([str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{script} pull q2-imatrix" in r.stderr
    assert f"{script} make-test-model tiny.gguf && {script} --model tiny.gguf" in r.stderr
    assert f"{script} --demo" in r.stderr


def test_the_exit_line_names_the_program_as_run_and_the_demo(monkeypatch, tmp_path):
    from ds4agent.ui import fmt

    run = _script(tmp_path / ".venv/bin")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setattr(sys, "argv", [run])
    assert fmt.resume_hint("3f2a9c1e") == f"{run} --resume 3f2a9c1e"
    monkeypatch.setattr(sys, "argv", [run, "--demo"])
    assert fmt.resume_hint("3f2a9c1e") == f"{run} --demo --resume 3f2a9c1e"
