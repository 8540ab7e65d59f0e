"""`ds4agent tokens`: one `ID<TAB>TEXT` line per token, rendered-chat rules by default."""

import subprocess
import sys

from ds4agent.cli import main


def test_rendered_chat_rules_by_default(capsys):
    assert main(["tokens", "--text", "<｜User｜>hi\n<think>"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["128803\t<｜User｜>", "6366\thi", "201\t\\n", "128821\t<think>"]
    assert out.err.strip() == "4 tokens"


def test_plain_text_gives_no_special(capsys):
    assert main(["tokens", "--plain-text", "--text", "<｜User｜>"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split("\t")[0]) for line in lines] == [30, 28217, 6756, 28217, 32]


def test_file_with_invalid_utf8(tmp_path, capsys):
    f = tmp_path / "x.bin"
    f.write_bytes(b"\xe2\x96b")
    assert main(["tokens", "--file", str(f)]) == 0
    assert capsys.readouterr().out.splitlines() == ["161\t\\xe2", "247\t\\x96", "68\tb"]


def test_missing_file_is_a_readable_error():
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "tokens", "--file", "/no/such/file"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "cannot read /no/such/file" in r.stderr and "Traceback" not in r.stderr
