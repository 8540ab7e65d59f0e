import os
import subprocess
import sys


def test_help_lists_every_subcommand_and_agent_flag():
    out = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for word in ("tokens", "dump-logits", "make-test-model", "kv", "info", "convert", "--model", "--ctx", "--permission", "--plain", "--kv-dir", "/load [prefix]", "/compact", "--edit-upto", "--think-level", "/think [N]", "--notify", "--notify-after", "/plan", "plan"):
        assert word in out


def test_missing_model_exits_2_with_advice(tmp_path, monkeypatch):
    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    monkeypatch.setenv("DS4AGENT_MODEL_DIR", str(tmp_path / "models"))  # not the user's pulled models
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "-p", "hi"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert "no model found" in r.stderr and "make-test-model" in r.stderr


def test_closed_pipe_is_a_quiet_exit(tmp_path):
    # `ds4agent … | head -1`: when the reader goes away mid-output the command ends quietly with
    # 141 (128 + SIGPIPE) and no traceback. A stand-in subcommand raises the error deterministically
    # (how much a real pipe buffers before EPIPE depends on the kernel).
    (tmp_path / "boom.py").write_text("def main(args):\n    raise BrokenPipeError(32, 'Broken pipe')\n")
    code = ("import sys; from ds4agent import cli; cli.SUBCOMMANDS['info'] = 'boom'; "
            "sys.exit(cli.main(['info', 'x']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 141
    assert r.stderr == ""


def test_reference_short_flags_and_defaults():
    from ds4agent.cli import build_parser

    args = build_parser().parse_args(["-c", "4096", "-n", "7", "-sys", "be brief"])
    assert (args.ctx, args.round_tokens, args.system) == (4096, 7, "be brief")
    defaults = build_parser().parse_args([])
    assert (defaults.ctx, defaults.round_tokens, defaults.min_p, defaults.think_mode) == (100_000, 50_000, 0.05, "think")


def test_power_flag_reaches_the_agent_settings():
    from ds4agent.cli import parse

    assert parse(["--power", "35"]).settings.power == 35
    assert parse([]).settings.power == 100


def test_process_entry_flushes_output_before_its_hard_exit(tmp_path):
    # entry() leaves through os._exit (see its docstring); buffered output written to a pipe must
    # still arrive in full, and the status must be main()'s.
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "tokens", "--text", "hello world " * 300],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[:3] == ["33310\thello", "2058\t world", "44388\t hello"]
    assert len(lines) > 600 and r.stderr.strip() == f"{len(lines)} tokens"
    missing = subprocess.run([sys.executable, "-m", "ds4agent.cli", "tokens", "--file", "nope.txt"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode == 2 and "nope.txt" in missing.stderr


def test_bad_agent_flags_are_one_line_usage_errors_before_any_model_work(tmp_path, monkeypatch, capsys):
    # No model exists here: each bad value must be reported for itself (exit 2, one line), not as
    # "no model found", "startup failed" or "context full" later.
    from ds4agent.cli import MAX_CTX, main

    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    cases = {
        ("--ctx", "0"): "--ctx must be between 1 and",
        ("--ctx", "-1"): "--ctx must be between 1 and",
        ("--ctx", str(MAX_CTX + 1)): "--ctx must be between 1 and",
        ("--ctx", str(2**32)): "--ctx must be between 1 and",
        ("--tokens", "0"): "--tokens must be at least 1",
        ("--temp", "nan"): "--temp must be a number >= 0",
        ("--temp", "-1"): "--temp must be a number >= 0",
        ("--temp", "inf"): "--temp must be a number >= 0",
        ("--top-p", "0"): "--top-p must be greater than 0 and at most 1",
        ("--top-p", "1.5"): "--top-p must be greater than 0 and at most 1",
        ("--min-p", "-0.1"): "--min-p must be between 0 and 1",
        ("--power", "0"): "--power must be a whole number from 1 to 100",
        ("--power", "101"): "--power must be a whole number from 1 to 100",
    }
    for flag, expected in cases.items():
        assert main([*flag, "-p", "hi"]) == 2, flag
        err = capsys.readouterr().err
        assert err.startswith(f"ds4agent: {expected}"), (flag, err)
        assert err.count("\n") == 1, err
    # In range: the flags pass and the next problem (no model here) is the one reported.
    assert main(["--ctx", str(MAX_CTX), "--tokens", "1", "--temp", "0", "--top-p", "1", "-p", "hi"]) == 2
    assert "no model found" in capsys.readouterr().err


def test_help_fits_an_80_column_terminal():
    env = {**__import__("os").environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--help"], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "  /save [title]        save the session, optionally under a new title" in out
    assert "Ctrl+O" in out  # the keys are listed too


def test_flags_behave_like_other_tools(tmp_path, monkeypatch, capsys):
    """--version; -p "" and --json without -p are usage errors (exit 2, one line), as is
    --pipeline 0, all before any model work (no model exists here)."""
    import pytest

    from ds4agent.cli import main

    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("ds4agent ") and out.strip() != "ds4agent"
    cases = {
        ("-p", ""): "-p needs a prompt (got an empty one)",
        ("-p", "  "): "-p needs a prompt (got an empty one)",
        ("--json",): "--json needs -p PROMPT",
        ("--pipeline", "0", "-p", "hi"): "--pipeline must be at least 1 process (got 0)",
    }
    for flags, expected in cases.items():
        assert main(list(flags)) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith(f"ds4agent: {expected}") and err.count("\n") == 1, (flags, err)


def test_the_agent_never_imports_from_the_working_directory(tmp_path):
    # `python -m ds4agent` puts the working tree first on the import path: a module a job wrote
    # there (`zipapp.py`, `numpy.py`) would be run, unconfined, by the agent's next lazy import.
    tree, mods = tmp_path / "tree", tmp_path / "mods"
    tree.mkdir()
    mods.mkdir()
    (tree / "planted_by_a_job.py").write_text("open('PLANTED_RAN', 'w').close()\n")
    (mods / "probe.py").write_text(
        "def main(args):\n    try:\n        import planted_by_a_job  # noqa: F401\n    except ImportError:\n"
        "        print('not imported')\n    return 0\n")
    code = ("import sys; sys.path.insert(0, ''); from ds4agent import cli; cli.SUBCOMMANDS['info'] = 'probe'; "
            "sys.argv = ['ds4agent', 'info', 'x']; cli.entry()")
    env = {**__import__("os").environ, "PYTHONPATH": os.pathsep.join([str(mods), *sys.path])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "not imported" and not (tree / "PLANTED_RAN").exists()
