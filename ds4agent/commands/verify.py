"""`ds4agent verify [MODEL] --vectors DIR`: does this install compute the model right?

Runs the recorded continuations of a vector directory (ds4's format: agent/verify.py) on the
model and prints one table row per step: the recorded token, ours, the rank of the recorded token
in our distribution and the largest |Δ logprob| over the tokens both top-k lists hold. Exit 0 when
every greedy token matches, 1 on a token mismatch, 2 when the vectors or the model cannot be used.
A prompt whose token count differs from the recorded usage.prompt_tokens is reported (the
rendering or the tokenizer differs from the API's), but decides nothing by itself: the tokens do.
"""

from __future__ import annotations

import sys

from ds4agent.agent.verify import ByteIndex, VectorError, check_case, load_vectors, required_ctx
from ds4agent.engine.errors import EngineError
from ds4agent.protocol.tokenizer import Tokenizer

from .settings import VerifySettings


def _show(data: bytes, width: int = 16) -> str:
    text = repr(data.decode("utf-8", "backslashreplace"))[1:-1]
    return text if len(text) <= width else text[: width - 1] + "…"


def main(settings: VerifySettings) -> int:
    from ds4agent.engine import load_engine
    from ds4agent.models.errors import ModelError
    from ds4agent.models.locate import resolve_model_path

    try:
        cases = load_vectors(settings.vectors)
        model = resolve_model_path(settings.model)
    except (VectorError, ModelError) as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    tok = Tokenizer.load()
    try:
        engine = load_engine(model, ctx=settings.ctx or required_ctx(tok, cases))
    except EngineError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    index = ByteIndex(tok)
    failed = 0
    prompt_diffs = 0
    try:
        print(f"{'case':<24} {'step':>4}  {'official':<16} {'ours':<16} {'ok':<3} {'rank':>5} {'max|Δlp|':>9}")
        for case in cases:
            report = check_case(engine.new_session(), tok, case, index)
            if report.prompt_ok is False:
                prompt_diffs += 1
            note = {None: "not recorded", True: "ok", False: "DIFFERENT"}[report.prompt_ok]
            print(f"{case.id:<24} prompt tokens: ours {report.prompt_tokens}, "
                  f"recorded {report.official_prompt_tokens if report.official_prompt_tokens is not None else '-'} ({note})")
            for s in report.steps:
                delta = "-" if s.max_delta is None else f"{s.max_delta:.4f}"
                rank = "-" if s.rank is None else str(s.rank)
                print(f"{'':<24} {s.index:>4}  {_show(s.official):<16} {_show(s.ours):<16} "
                      f"{'ok' if s.match else 'NO':<3} {rank:>5} {delta:>9}")
            failed += report.mismatches
    except EngineError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    steps = sum(len(c.steps) for c in cases)
    summary = f"{len(cases)} case(s), {steps} step(s): {failed} token mismatch(es)"
    if prompt_diffs:
        summary += f", {prompt_diffs} prompt token count(s) differ from the recording"
    print(summary)
    return 1 if failed else 0
