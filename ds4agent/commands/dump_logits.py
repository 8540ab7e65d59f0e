"""`ds4agent dump-logits`: the engine checked from outside (ds4's --dump-logprobs idea).

    ds4agent dump-logits --model M --tokens 1,2,3 [--chunk N] [--ctx N] --out F.npy
    ds4agent dump-logits --model M --prompt-file P.txt ... --out F.npy
    ds4agent dump-logits ... --pipeline 2      (or --hosts FILE: the model split over ranks)

Writes float32 [n_tokens, vocab]: row i = the logits after token i (i.e. the distribution of
token i+1), prefilled in chunks of N on the absolute grid (default: one chunk holding every
token). Chunk invariance means any N gives the same file on CPU; comparing two N is a cheap
end-to-end check of that property on a real model. --prompt-file text is tokenised with the
rendered-chat rules (the seven protocol specials recognised), as a saved transcript would be.
The .npy is written atomically (ds4agent.fsutil: temp beside the target, fsync, rename).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ds4agent.commands.settings import DumpLogitsSettings
from ds4agent.engine.errors import EngineError
from ds4agent.fsutil import atomic_file

from .boundary import run_file_command


class DumpError(EngineError):
    """Bad dump-logits input (token list, prompt file, sizes)."""


def parse_token_list(text: str) -> list[int]:
    parts = [p.strip() for p in text.replace("\n", ",").split(",")]
    parts = [p for p in parts if p]
    if not parts:
        raise DumpError("--tokens needs at least one token id (e.g. --tokens 0,1,2)")
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise DumpError(f"--tokens: {p!r} is not an integer token id") from None
    return out


def prompt_file_tokens(path: str | os.PathLike[str]) -> list[int]:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise DumpError(f"cannot read prompt file {path}: {err.strerror or err}") from None
    from ds4agent.protocol.tokenizer import Tokenizer, TokenizerError

    try:
        ids = Tokenizer.load().encode_trusted(data)
    except TokenizerError as err:
        raise DumpError(f"cannot tokenise prompt file {path}: {err}") from None
    if not ids:
        raise DumpError(f"prompt file {path} is empty")
    return ids


def dump_logits(model_path: str | os.PathLike[str], tokens: list[int], *, chunk: int | None = None,
                ctx: int | None = None, ranks: int | None = None, hosts=None,
                split: list[int] | None = None) -> np.ndarray:
    """Logits after every token, float32 [len(tokens), vocab] (with `ranks` or `hosts`: on a
    pipeline, engine/pipeline/; the same bits)."""
    from ds4agent.engine import load_engine

    if chunk is not None and chunk < 1:
        raise DumpError(f"--chunk must be at least 1 (got {chunk})")
    n = len(tokens)
    ctx = ctx if ctx is not None else max(n, 1)
    if ctx < n:
        raise DumpError(f"{n} tokens do not fit --ctx {ctx}")
    # Default: one chunk holding every token (--chunk's documented default), whatever the ctx
    # grid says.
    engine = load_engine(model_path, ctx=ctx, chunk=chunk or max(n, 1), ranks=ranks, hosts=hosts,
                         split=split)
    try:
        return engine.new_session().forward_all(tokens)
    finally:
        engine.close()


def save_npy_atomic(path: str | os.PathLike[str], array: np.ndarray) -> None:
    with atomic_file(path) as fh:
        np.save(fh, array)


def main(settings: DumpLogitsSettings) -> int:
    from ds4agent.models.errors import ModelError
    from ds4agent.models.locate import resolve_model_path

    def action() -> str:
        # Whether the model fits this machine is load_engine's first check (memory.check_fits),
        # made from the tensor directory before any weight is read.
        try:
            model = resolve_model_path(settings.model)
        except ModelError as err:
            raise DumpError(str(err)) from None
        if settings.token_list is not None:
            tokens = parse_token_list(settings.token_list)
        else:
            tokens = prompt_file_tokens(settings.prompt_file)
        split = list(settings.split) if settings.split is not None else None
        logits = dump_logits(model, tokens, chunk=settings.chunk, ctx=settings.ctx, ranks=settings.ranks,
                             hosts=settings.hosts, split=split)
        save_npy_atomic(settings.out, logits.astype(np.float32, copy=False))
        return f"wrote {settings.out}: float32 {logits.shape[0]} x {logits.shape[1]}"

    return run_file_command(action, failure=f"cannot write {settings.out}")
