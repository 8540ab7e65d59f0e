"""dump-logits CLI: output shape/dtype, row semantics, chunk invariance, readable errors."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from ds4agent import cli
from ds4agent.engine import load_engine
from ds4agent.testmodels import make_test_model

TOKENS = [3, 17, 250, 9, 9, 41, 100, 7, 300, 2, 5, 77, 12, 501, 64, 33, 1, 8, 90, 91, 92]


@pytest.fixture(scope="module")
def micro_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("dump") / "micro.gguf", "micro", seed=3)


def _dump(path, out, *extra):
    argv = ["dump-logits", "--model", str(path), "--tokens", ",".join(map(str, TOKENS)),
            "--out", str(out), *extra]
    assert cli.main(argv) == 0
    return np.load(out)


def test_shape_rows_and_chunk_invariance(micro_path, tmp_path):
    whole = _dump(micro_path, tmp_path / "whole.npy")
    assert whole.dtype == np.float32 and whole.shape == (len(TOKENS), 512)
    assert np.isfinite(whole).all()
    for chunk in ("1", "3", "8"):
        chunked = _dump(micro_path, tmp_path / f"c{chunk}.npy", "--chunk", chunk)
        assert np.array_equal(chunked, whole), chunk  # bit-exact on CPU (model.md §9)
    # row i = logits after token i, as a session sees them
    s = load_engine(micro_path, ctx=64).new_session()
    for i in (0, 7, len(TOKENS) - 1):
        s.sync(TOKENS[: i + 1])
        assert np.array_equal(s.logits, whole[i])
    assert not list(tmp_path.glob("*.tmp"))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "whole.npy").stat().st_mode) == 0o666 & ~umask


def test_prompt_file_uses_the_rendered_chat_tokenizer(tmp_path):
    from ds4agent.protocol.tokenizer import Tokenizer

    model = make_test_model(tmp_path / "tiny.gguf", "tiny", seed=1)
    prompt = tmp_path / "p.txt"
    prompt.write_text("<｜User｜>hi<｜Assistant｜>")
    out = tmp_path / "p.npy"
    assert cli.main(["dump-logits", "--model", str(model), "--prompt-file", str(prompt),
                     "--out", str(out)]) == 0
    ids = Tokenizer.load().encode_trusted("<｜User｜>hi<｜Assistant｜>")
    assert ids[0] == 128803 and ids[-1] == 128804
    logits = np.load(out)
    assert logits.shape == (len(ids), 129280) and logits.dtype == np.float32


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tokens", "1,x,3"], "'x' is not an integer token id"),
        (["--tokens", "1,2,600"], "token id 600 at position 2 is outside the vocabulary"),
        (["--tokens", "1,2,3", "--chunk", "0"], "--chunk must be at least 1"),
        (["--tokens", "1,2,3", "--ctx", "2"], "3 tokens do not fit --ctx 2"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "cannot read prompt file"),
    ],
)
def test_bad_input_is_one_readable_line(micro_path, tmp_path, capsys, extra, message):
    out = tmp_path / "o.npy"
    assert cli.main(["dump-logits", "--model", str(micro_path), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_missing_model_is_a_usage_error(tmp_path, capsys):
    code = cli.main(["dump-logits", "--model", str(tmp_path / "none.gguf"), "--tokens", "1",
                     "--out", str(tmp_path / "o.npy")])
    assert code == 2 and "no model found" in capsys.readouterr().err
