"""bench/peers.py reads its peers' output: ds4's rate line and token dump, llama-bench's JSON (the
peers themselves are never run in the suite)."""

from __future__ import annotations

import json

import pytest

from bench import peers


def test_ds4_rates_and_tokens_are_read_from_its_output():
    err = "ds4: loading…\nds4: prefill: 0.17 t/s, generation: 0.16 t/s\n"
    assert peers.parse_ds4_rates(err) == (0.17, 0.16)
    with pytest.raises(RuntimeError, match="no 'prefill"):
        peers.parse_ds4_rates("ds4: out of memory\n")
    out = "[0, 128803, 1502]\n     0  <｜begin▁of▁sentence｜>\n128803  <｜User｜>\n  1502  hello\n"
    assert peers.parse_ds4_tokens(out) == [0, 128803, 1502]


def test_llama_bench_json_gives_prefill_and_decode_rates():
    rows = [{"n_prompt": 64, "n_gen": 0, "avg_ts": 4.47}, {"n_prompt": 0, "n_gen": 4, "avg_ts": 1.13}]
    assert peers.parse_llama_bench(json.dumps(rows)) == (4.47, 1.13)
    with pytest.raises(RuntimeError):
        peers.parse_llama_bench("[]")


def test_the_prompt_is_a_rendered_chat_with_the_words_asked_for():
    text = peers.prompt_text(64)
    assert text.startswith("<｜begin▁of▁sentence｜><｜User｜>") and text.endswith("<｜Assistant｜></think>")
    assert len(text.split("<｜User｜>")[1].split("<｜Assistant｜>")[0].split()) == 64


def test_the_best_prefill_and_the_best_decode_of_the_rounds_are_compared():
    # rounds on a drifting machine: the fastest prefill came in one round, the fastest decode in
    # another
    assert peers.best_rates([(8.2, 2.3), (9.1, 1.9), (8.7, 2.1)]) == (9.1, 2.3)
    assert peers.best_rates([(4.0, 1.0)]) == (4.0, 1.0)


def test_ds4_output_that_is_not_utf8_is_still_read(tmp_path):
    # ds4 prints the tokens it generates; a random-weight model's bytes need not be UTF-8
    stub = tmp_path / "ds4"
    stub.write_bytes(b"#!/bin/sh\nprintf 'gen \\303\\050 \\377\\n'\n"
                     b"printf 'ds4: prefill: 0.37 t/s, generation: 0.31 t/s\\n' >&2\n")
    stub.chmod(0o755)
    done = peers.run_ds4(str(stub), tmp_path / "model.gguf", 2, "text", 16)
    assert peers.parse_ds4_rates(done.stderr) == (0.37, 0.31)
    assert done.stdout.startswith("gen ") and "\ufffd" in done.stdout


def _dump_step(ids_logits):
    return {"selected": {"id": ids_logits[0][0]},
            "top_logprobs": [{"token": {"id": i}, "logit": v} for i, v in ids_logits]}


def test_agreement_counts_equal_choices_and_gives_each_sides_margin_where_they_differ():
    steps = [_dump_step([(7, 4.0), (3, 3.9), (9, 1.0)]), _dump_step([(5, 2.0), (7, 1.5), (3, 1.0)]),
             _dump_step([(1, 3.0), (2, 2.0), (4, 1.0)])]
    theirs = peers.step_logits(steps)
    assert theirs[0] == (7, {7: 4.0, 3: 3.9, 9: 1.0})
    # ours, teacher-forced on the same steps: per step our argmax (id, logit) and our logits at
    # ds4's ids; step 1 picks another of ds4's ids, step 2 an id outside ds4's top list
    run = {"argmax": [[7, 4.05], [7, 1.8], [8, 3.5]],
           "top": [[4.05, 3.8, 1.1], [1.7, 1.8, 0.9], [3.25, 2.0, 1.0]]}
    ours = peers.step_logits(steps, run)
    assert ours[2] == (8, {1: 3.25, 2: 2.0, 4: 1.0, 8: 3.5})
    agree, median, misses = peers.agreement(theirs, ours)
    assert agree == 1
    # max |dlogit| per step over the ids both hold: 0.1, 0.3 (ids 5, 7), 0.25 (id 1)
    assert median == pytest.approx(0.25)
    assert misses[0][0] == 1 and misses[0][1:] == pytest.approx((0.5, 0.1))
    # ds4 holds no logit for our choice 8: its margin over it is unknown
    assert misses[1][0] == 2 and misses[1][1] is None and misses[1][2] == pytest.approx(0.25)
    # a run against itself agrees everywhere, to the bit
    assert peers.agreement(ours, ours) == (3, 0.0, [])


def test_later_files_are_set_against_the_first_files_ratios_to_the_peer():
    ratios = [("flash_q2.gguf", (1.25, 1.00)), ("flash_q4.gguf", (1.30, 0.90)), ("flash_mxfp4.gguf", (1.50, 1.20))]
    rel = peers.relative_to_first(ratios)
    assert [name for name, _, _ in rel] == ["flash_q4.gguf", "flash_mxfp4.gguf"]
    assert rel[0][1] == pytest.approx(1.04) and rel[0][2] == pytest.approx(0.90)
    assert rel[1][1] == pytest.approx(1.20) and rel[1][2] == pytest.approx(1.20)
    assert peers.relative_to_first(ratios[:1]) == []


def test_two_free_running_dumps_share_a_context_through_their_first_differing_choice():
    same = [_dump_step([(7, 4.0), (3, 3.9)]), _dump_step([(5, 2.0), (7, 1.5)])]
    a = peers.step_logits(same + [_dump_step([(1, 3.0), (2, 2.99)]), _dump_step([(4, 1.0), (6, 0.5)])])
    b = peers.step_logits(same + [_dump_step([(2, 3.0), (1, 2.98)]), _dump_step([(6, 1.0), (4, 0.5)])])
    # steps 0-1 alike, step 2 the first different choice (same context, compared), step 3 a new context
    assert peers.shared_context(a, b) == 3
    assert peers.shared_context(a, a) == 4
    agree, _, misses = peers.agreement(a[:3], b[:3])
    assert agree == 2 and misses[0][0] == 2 and misses[0][1:] == pytest.approx((0.01, 0.02))
