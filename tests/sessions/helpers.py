"""Shared fixtures for the sessions tests: tiny shapes and deterministic random states."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ds4agent.sessions.payload import (
    FILLER_KV,
    FILLER_SCORE,
    PayloadShape,
    PayloadState,
    blank_state,
)

T = TypeVar("T")

# A test-model-like layout: the real vocab, a dense pair, a ratio-4 layer (indexer) and ratio 16.
TINY = PayloadShape(n_layers=4, head_dim=8, indexer_dim=4, vocab=129280, window=8, ratios=(0, 0, 4, 16))
# Smaller still for byte-level fuzzing (small vocab keeps the file ~3 KB).
MICRO = PayloadShape(n_layers=3, head_dim=4, indexer_dim=2, vocab=16, window=4, ratios=(0, 4, 8))

USER = "<｜User｜>".encode()
ASSISTANT = "<｜Assistant｜>".encode()


def random_state(shape: PayloadShape, n_tokens: int, ctx: int, seed: int = 0) -> PayloadState:
    """Random f16-representable rows, random frontier rows inside the live window, canonical filler
    outside it (what the engine produces), random tokens < vocab and finite logits."""
    rng = np.random.default_rng(seed)
    state = blank_state(shape, n_tokens, ctx)
    state.tokens[:] = rng.integers(0, shape.vocab, n_tokens, dtype=np.uint32)
    state.logits[:] = rng.standard_normal(shape.vocab, dtype=np.float32)
    for layer, lp in enumerate(state.layers):
        ratio, coff = shape.ratios[layer], shape.coff(layer)
        live = ratio * (coff - 1) + n_tokens % ratio if ratio else 0
        for name in ("raw", "comp", "index_comp"):
            arr = getattr(lp, name)
            if arr is not None:
                arr[:] = rng.standard_normal(arr.shape, dtype=np.float32).astype(np.float16)
        for name in ("attn_kv", "attn_score", "index_kv", "index_score"):
            arr = getattr(lp, name)
            if arr is not None:
                arr[:live] = rng.standard_normal((live, arr.shape[1]), dtype=np.float32)
    return state


def assert_states_equal(a: PayloadState, b: PayloadState) -> None:
    assert a.ctx == b.ctx
    assert a.tokens.dtype == b.tokens.dtype == np.uint32
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logits, b.logits)
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=True):
        for name in la.__dataclass_fields__:
            x, y = getattr(la, name), getattr(lb, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert y.dtype == np.float32 and x.shape == y.shape, name
                np.testing.assert_array_equal(x, y, err_msg=name)


def filler_ok(state: PayloadState, shape: PayloadShape) -> bool:
    """True when every frontier row outside the live window holds the canonical filler."""
    T = len(state.tokens)
    for layer, lp in enumerate(state.layers):
        ratio, coff = shape.ratios[layer], shape.coff(layer)
        if not ratio:
            continue
        live = ratio * (coff - 1) + T % ratio
        for name in ("attn_kv", "index_kv", "attn_score", "index_score"):
            arr = getattr(lp, name)
            if arr is not None:
                fill = FILLER_KV if name.endswith("_kv") else FILLER_SCORE
                if not np.all(arr[live:] == fill):
                    return False
    return True


def session_text(first_user: str, *more: str) -> bytes:
    """Rendered-looking text: BOS-ish prefix, then user/assistant turns."""
    out = b"<\xef\xbd\x9cbegin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>system" + USER + first_user.encode()
    out += ASSISTANT + b"ok"
    for m in more:
        out += USER + m.encode() + ASSISTANT + b"ok"
    return out


def s_layout(data: bytes) -> bytes:
    """An [L] file without a title trailer turned into the [S] layout of earlier ds4 builds
    (kvc-format.md §13): header byte 20 = 0 and DSV4 payload version 1; every other byte is the
    same (checked against files ds4 itself wrote)."""
    out = without_checksum(data) if data[6] & 0x80 else bytearray(data)
    assert out[20] == 2 and not out[6] & 0x08, "an [L] file without a title trailer"
    out[20] = 0
    text_bytes = int.from_bytes(out[48:52], "little")
    version_at = 52 + text_bytes + 4  # payload word h1
    assert out[version_at:version_at + 4] == b"\x02\0\0\0"
    out[version_at:version_at + 4] = b"\x01\0\0\0"
    return bytes(out)


def without_checksum(data: bytes) -> bytearray:
    """A file ds4agent wrote, as ds4 would have written it: its checksum trailer (the last 12
    bytes, ext bit 0x80) removed. For tests that build another writer's file by editing ours."""
    out = bytearray(data)
    assert out[6] & 0x80 and out[-12:-8] == b"DS4C"
    out[6] &= 0x7F
    return out[:-12]


def peak_memory(fn: Callable[[], T]) -> tuple[T, int]:
    """fn()'s result and the most memory Python allocated while it ran (tracemalloc, bytes)."""
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
