"""Check a model against recorded continuations (ds4's test-vector format): the non-printing core
of `ds4agent verify` (commands/verify.py prints the table).

A vector directory holds
    manifest.json                {"prompts": [{"id", "prompt_file", "official_file", ...}, ...]}
    prompts/ID.txt               the exact user prompt
    official/ID.official.json    {"steps": [{"token": {"text", "bytes"}, "logprob",
                                             "top_logprobs": [{"token": {...}, "logprob"}, ...]}],
                                  "usage": {"prompt_tokens": N, ...}, ...}
captured from DeepSeek's API with greedy decoding, thinking disabled and the top logprobs of each
step. Each prompt is rendered as the API renders a one-message chat with thinking off:
BOS <｜User｜> PROMPT <｜Assistant｜></think> (the prompt is plain text: no special tokens, no
trimming). The prompt's token count is compared with usage.prompt_tokens (the API counts the
whole rendered prompt, BOS included), then the model continues greedily for as many steps as were
recorded, and every step compares the token's bytes and the top-k log-probabilities: the largest
|Δ logprob| over the tokens both top-k lists hold, and the rank of the official token in ours.
A step whose greedy token differs from the recorded one is a mismatch; later steps still run
(on our own tokens) and are reported, but only the first mismatch says where the model left the
recorded path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ds4agent.protocol.tokenizer import ASSISTANT, BOS, END_THINK, USER, Tokenizer

MANIFEST = "manifest.json"
# A vector file larger than this is refused before it is parsed (the real ones are a few KiB).
MAX_VECTOR_BYTES = 16 * 1024 * 1024


class VectorError(Exception):
    """A vector directory or file that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class TopEntry:
    data: bytes
    logprob: float


@dataclass(frozen=True)
class Step:
    data: bytes  # the recorded token's bytes
    logprob: float | None
    top: tuple[TopEntry, ...]


@dataclass(frozen=True)
class Case:
    id: str
    prompt: str
    steps: tuple[Step, ...]
    prompt_tokens: int | None  # usage.prompt_tokens, when recorded


@dataclass(frozen=True)
class StepReport:
    index: int
    official: bytes
    ours: bytes
    match: bool
    rank: int | None  # 1-based rank of the official token in our distribution (None: not in the vocabulary)
    max_delta: float | None  # over the tokens in both top-k lists (None: no common token)
    common: int  # how many tokens both top-k lists hold


@dataclass
class CaseReport:
    id: str
    prompt_tokens: int
    official_prompt_tokens: int | None
    steps: list[StepReport] = field(default_factory=list)

    @property
    def prompt_ok(self) -> bool | None:
        return None if self.official_prompt_tokens is None else self.official_prompt_tokens == self.prompt_tokens

    @property
    def mismatches(self) -> int:
        return sum(1 for s in self.steps if not s.match)


class Decoding(Protocol):
    """What verification needs of a session: sync a prompt, the current logits, one step."""

    @property
    def logits(self) -> Any: ...

    def sync(self, tokens: Sequence[int], **kw: Any) -> int: ...

    def step(self, token: int) -> Any: ...


# ------------------------------------------------------------------------------- reading vectors

def _read_json(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_VECTOR_BYTES:
            raise VectorError(f"{path}: {size} bytes is more than a vector file can be ({MAX_VECTOR_BYTES})")
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise VectorError(f"cannot read {path}: {err.strerror or err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise VectorError(f"{path} is not valid JSON: {err}") from None


def _token_bytes(token: Any, where: str) -> bytes:
    if not isinstance(token, dict):
        raise VectorError(f"{where}: a token must be an object with text/bytes")
    raw = token.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b <= 255 for b in raw):
        return bytes(raw)
    text = token.get("text")
    if isinstance(text, str):
        return text.encode("utf-8")
    raise VectorError(f"{where}: the token has neither bytes nor text")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise VectorError(f"{where}: logprob must be a finite number")
    return float(value)


def _case(root: Path, entry: Any, n: int) -> Case:
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
        raise VectorError(f"{root / MANIFEST}: prompt {n} has no id")
    cid = entry["id"]
    prompt_path = root / str(entry.get("prompt_file") or f"prompts/{cid}.txt")
    official_path = root / str(entry.get("official_file") or f"official/{cid}.official.json")
    for p in (prompt_path, official_path):
        if root.resolve() not in p.resolve().parents:
            raise VectorError(f"{root / MANIFEST}: {p} lies outside the vector directory")
    try:
        if prompt_path.stat().st_size > MAX_VECTOR_BYTES:
            raise VectorError(f"{prompt_path}: too large for a prompt")
        prompt = prompt_path.read_bytes().decode("utf-8")
    except OSError as err:
        raise VectorError(f"cannot read {prompt_path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise VectorError(f"{prompt_path} is not UTF-8: {err}") from None
    record = _read_json(official_path)
    raw_steps = record.get("steps") if isinstance(record, dict) else None
    if not isinstance(raw_steps, list) or not raw_steps:
        raise VectorError(f"{official_path}: no steps")
    steps = []
    for i, s in enumerate(raw_steps):
        where = f"{official_path} step {i}"
        if not isinstance(s, dict):
            raise VectorError(f"{where}: not an object")
        lp = s.get("logprob")
        tops = s.get("top_logprobs") or []
        if not isinstance(tops, list):
            raise VectorError(f"{where}: top_logprobs must be a list")
        top = tuple(TopEntry(_token_bytes(t.get("token") if isinstance(t, dict) else None, where),
                             _number(t.get("logprob"), where)) for t in tops
                    if isinstance(t, dict) and t.get("logprob") is not None)
        steps.append(Step(_token_bytes(s.get("token"), where), None if lp is None else _number(lp, where), top))
    usage = record.get("usage") if isinstance(record, dict) else None
    pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Case(cid, prompt, tuple(steps), pt if isinstance(pt, int) and not isinstance(pt, bool) else None)


def load_vectors(directory: str | Path) -> list[Case]:
    """The cases of a vector directory, in manifest order; VectorError when anything is off."""
    root = Path(directory)
    manifest = _read_json(root / MANIFEST)
    prompts = manifest.get("prompts") if isinstance(manifest, dict) else None
    if not isinstance(prompts, list) or not prompts:
        raise VectorError(f"{root / MANIFEST}: no prompts listed")
    return [_case(root, entry, n) for n, entry in enumerate(prompts)]


# ------------------------------------------------------------------------------- checking

def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """The API's rendering of a one-message chat with thinking disabled."""
    return [BOS, USER, *tok.encode_untrusted(prompt), ASSISTANT, END_THINK]


def log_softmax(logits: Any) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    m = float(np.max(x))
    return x - (m + math.log(float(np.sum(np.exp(x - m)))))


class ByteIndex:
    """Token bytes -> id (the first id with those bytes), for the recorded tokens."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self._ids: dict[bytes, int] | None = None

    def id_of(self, data: bytes) -> int | None:
        if self._ids is None:
            ids: dict[bytes, int] = {}
            for i in range(self._tok.vocab_size):
                ids.setdefault(self._tok.token_bytes(i), i)
            self._ids = ids
        return self._ids.get(data)


def check_case(session: Decoding, tok: Tokenizer, case: Case, index: ByteIndex | None = None,
               should_stop: Callable[[], bool] | None = None) -> CaseReport:
    """Run one case on a fresh session: the prompt, then one greedy step per recorded step."""
    index = index or ByteIndex(tok)
    ids = prompt_ids(tok, case.prompt)
    report = CaseReport(case.id, len(ids), case.prompt_tokens)
    session.sync(ids)
    logits = session.logits
    for n, step in enumerate(case.steps):
        if should_stop is not None and should_stop():
            break
        lp = log_softmax(logits)
        ours_id = int(np.argmax(lp))
        ours = tok.token_bytes(ours_id)
        k = max(len(step.top), 1)
        top_ids = np.argsort(-lp, kind="stable")[:k]
        ours_top = {tok.token_bytes(int(i)): float(lp[int(i)]) for i in top_ids}
        deltas = [abs(ours_top[t.data] - t.logprob) for t in step.top if t.data in ours_top]
        official_id = index.id_of(step.data)
        rank = None if official_id is None else int(np.sum(lp > lp[official_id])) + 1
        report.steps.append(StepReport(n, step.data, ours, ours == step.data, rank,
                                       max(deltas) if deltas else None, len(deltas)))
        if n + 1 < len(case.steps):
            logits = session.step(ours_id)
    return report


def required_ctx(tok: Tokenizer, cases: Sequence[Case]) -> int:
    """The context every case fits in: its prompt plus its steps."""
    return max(len(prompt_ids(tok, c.prompt)) + len(c.steps) for c in cases)
