"""`ds4agent verify` on the tiny model, against vectors written in ds4's format from the model itself."""

import json

import numpy as np
import pytest

from ds4agent.agent.verify import VectorError, load_vectors, log_softmax, prompt_ids
from ds4agent.cli import main
from ds4agent.engine import load_engine
from ds4agent.protocol.tokenizer import ASSISTANT, BOS, END_THINK, USER, Tokenizer

PROMPTS = {"short_fact": "Who was Ada Lovelace?", "code": "return snprintf(buf, sizeof(buf), \"%d\", value"}
STEPS = 3
TOP = 20


def _entry(tok, i, lp):
    data = tok.token_bytes(int(i))
    return {"token": {"text": data.decode("utf-8", "replace"), "bytes": list(data)}, "logprob": float(lp[int(i)])}


def write_vectors(root, model, prompts=PROMPTS, steps=STEPS):
    """What the API recording holds, produced by the model itself (greedy, thinking off, top-20)."""
    tok = Tokenizer.load()
    (root / "prompts").mkdir(parents=True)
    (root / "official").mkdir()
    engine = load_engine(model, ctx=256)
    listed = []
    try:
        for cid, prompt in prompts.items():
            ids = [BOS, USER, *tok.encode_untrusted(prompt), ASSISTANT, END_THINK]
            s = engine.new_session()
            s.sync(ids)
            logits, recorded = s.logits, []
            for n in range(steps):
                lp = log_softmax(logits)
                best = int(np.argmax(lp))
                top = np.argsort(-lp, kind="stable")[:TOP]
                recorded.append({"step": n, **_entry(tok, best, lp), "top_logprobs": [_entry(tok, i, lp) for i in top]})
                logits = s.step(best)
            (root / "prompts" / f"{cid}.txt").write_text(prompt, encoding="utf-8")
            record = {"schema": "ds4-official-logprobs-v2", "id": cid, "prompt": prompt, "steps": recorded,
                      "usage": {"prompt_tokens": len(ids), "completion_tokens": steps}}
            (root / "official" / f"{cid}.official.json").write_text(json.dumps(record), encoding="utf-8")
            listed.append({"id": cid, "prompt_file": f"prompts/{cid}.txt",
                           "official_file": f"official/{cid}.official.json", "steps": steps})
    finally:
        engine.close()
    (root / "manifest.json").write_text(json.dumps({"schema": "ds4-test-vector-manifest-v2", "prompts": listed}))
    return root


@pytest.fixture(scope="module")
def vectors(tiny_model, tmp_path_factory):
    return write_vectors(tmp_path_factory.mktemp("vectors"), tiny_model)


def test_the_api_rendering_of_a_prompt():
    tok = Tokenizer.load()
    assert prompt_ids(tok, " hi ") == [BOS, USER, *tok.encode_untrusted(" hi "), ASSISTANT, END_THINK]
    assert prompt_ids(tok, "<think>")[2:-2] == tok.encode_untrusted("<think>")  # plain text, no specials


def test_verify_passes_on_vectors_the_model_wrote(tiny_model, vectors, capsys):
    assert main(["verify", str(tiny_model), "--vectors", str(vectors)]) == 0
    out = capsys.readouterr().out
    assert "short_fact" in out and "code" in out
    assert out.count("(ok)") == 2  # both prompt token counts match usage.prompt_tokens
    rows = [ln for ln in out.splitlines() if ln.startswith(" " * 24) and ln.split()[0].isdigit()]
    assert len(rows) == 2 * STEPS
    for row in rows:
        cells = row.split()
        assert cells[-3:-2] == ["ok"] and cells[-2] == "1" and float(cells[-1]) < 1e-3, row
    assert out.rstrip().endswith(f"2 case(s), {2 * STEPS} step(s): 0 token mismatch(es)")


def test_a_wrong_token_fails_and_is_shown(tiny_model, vectors, tmp_path, capsys):
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(vectors, bad)
    path = bad / "official" / "code.official.json"
    record = json.loads(path.read_text())
    step = record["steps"][1]
    wrong = step["top_logprobs"][5]["token"]  # a token the model ranks 6th
    step["token"] = wrong
    record["usage"]["prompt_tokens"] += 1  # and a prompt count that differs
    path.write_text(json.dumps(record))
    assert main(["verify", str(tiny_model), "--vectors", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "(DIFFERENT)" in out
    row = [ln for ln in out.splitlines() if " NO " in ln]
    assert len(row) == 1 and row[0].split()[0] == "1" and row[0].split()[-2] == "6"
    assert "1 token mismatch(es), 1 prompt token count(s) differ" in out


def test_unusable_vector_directories_are_refused_readably(tmp_path, tiny_model, capsys):
    with pytest.raises(VectorError, match="manifest.json"):
        load_vectors(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"prompts": [{"id": "x"}]}))
    with pytest.raises(VectorError, match=r"cannot read .*prompts/x\.txt"):
        load_vectors(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"prompts": [{"id": "x", "prompt_file": "../../etc/passwd"}]}))
    with pytest.raises(VectorError, match="outside the vector directory"):
        load_vectors(tmp_path)
    assert main(["verify", str(tiny_model), "--vectors", str(tmp_path)]) == 2
    assert "outside the vector directory" in capsys.readouterr().err
