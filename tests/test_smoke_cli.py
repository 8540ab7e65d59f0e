import subprocess
import sys


def test_help_lists_every_subcommand_and_agent_flag():
    out = subprocess.run([sys.executable, "-m", "ds4agent.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for word in ("tokens", "dump-logits", "make-test-model", "kv", "info", "convert", "--model", "--ctx", "--permission", "--plain", "--kv-dir"):
        assert word in out


def test_missing_model_exits_2_with_advice(tmp_path, monkeypatch):
    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "-p", "hi"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert "no model found" in r.stderr and "make-test-model" in r.stderr


def test_closed_pipe_is_a_quiet_exit(tmp_path):
    # `ds4agent tokens … | head -1`: the reader goes away; no traceback on stderr.
    text = "word " * 20000
    proc = subprocess.Popen([sys.executable, "-m", "ds4agent.cli", "tokens", "--text", text],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode == 141
