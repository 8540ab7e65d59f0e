"""DSV4 payload writer/reader (kvc-format.md §9): header values, sizes, round trips, §9.5 errors."""

import io
import struct

import numpy as np
import pytest

from ds4agent.sessions import errors as E
from ds4agent.sessions.errors import KVCPayloadError
from ds4agent.sessions.kvc import KIND_SESSION, KVCHeader, load_kvc, write_kvc
from ds4agent.sessions.payload import (
    FILLER_SCORE,
    FLASH_SHAPE,
    PayloadHeader,
    PayloadInfo,
    payload_size,
    read_payload,
    write_payload,
)

from .helpers import TINY, assert_states_equal, filler_ok, random_state

SPEC_SIZES = {1: 12_811_664, 127: None, 128: 25_757_580, 129: None, 511: None, 512: 31_042_956,
              652: 32_966_076, 653: 32_966_080, 10_000: 161_630_668, 10_240: 164_939_148,
              30_000: 436_900_428, 100_000: 1_400_385_548}


def formula(T):
    R = min(T, 128)
    return 12_723_596 + 4 * T + 2048 * 43 * R + 53_760 * (T // 4) + 40_960 * (T // 128)


@pytest.mark.parametrize("T", sorted(SPEC_SIZES))
def test_size_formula_matches_spec_values(T):
    size = payload_size(FLASH_SHAPE, T, 200_000)
    assert size == formula(T)
    if SPEC_SIZES[T] is not None:
        assert size == SPEC_SIZES[T]


def test_size_formula_has_no_ctx_term_for_loadable_files():
    for T, ctx in ((5, 6), (100, 101), (127, 128), (300, 4096)):
        assert payload_size(FLASH_SHAPE, T, ctx) == formula(T)


def test_payload_header_of_worked_example():
    h = PayloadHeader.for_state(FLASH_SHAPE, 100_000, 652)
    assert h.pack().hex() == (
        "44535634020000 00a0860100001000000011000080000000aa6100008c0200002b000000"
        "000200008000000000f9010080000000").replace(" ", "")


@pytest.mark.parametrize("ctx,h3,h4,h5,h6", [
    (100_000, 4096, 4352, 128, 25_002),
    (4096, 4096, 4096, 128, 1026),
    (300, 300, 300, 128, 77),
    (100, 100, 100, 100, 27),
    (1_000_000, 4096, 4352, 128, 250_002),
])
def test_runtime_fields(ctx, h3, h4, h5, h6):
    assert FLASH_SHAPE.runtime_fields(ctx) == (h3, h4, h5, h6)


def _payload_bytes(state, shape):
    buf = io.BytesIO()
    n = write_payload(buf, state, shape)
    data = buf.getvalue()
    assert n == len(data) == payload_size(shape, len(state.tokens), state.ctx)
    return data


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 50])
def test_tiny_round_trip(T):
    state = random_state(TINY, T, 64, seed=T)
    data = _payload_bytes(state, TINY)
    back = read_payload(io.BytesIO(data), len(data), TINY, 64)
    assert_states_equal(state, back)
    assert filler_ok(back, TINY)
    # counts as §9.4 says: n_comp = T // ratio, indexer rows only on ratio-4 layers
    off = 52 + 4 * T + 4 * TINY.vocab
    counts = struct.unpack_from("<8I", data, off)
    assert counts == (0, 0, T // 4, T // 16, 0, 0, T // 4, 0)


@pytest.mark.parametrize("T", [1, 127, 128, 129, 4099])
def test_flash_round_trip_through_a_file(tmp_path, T):
    ctx = 100_000
    state = random_state(FLASH_SHAPE, T, ctx, seed=T)
    text = b"x" * 37
    path = tmp_path / "flash.kv"
    hdr = KVCHeader(quant_bits=2, reason=6, ext_flags=0, model_id=0, tokens=T, hits=0, ctx_size=ctx,
                    created_at=1, last_used=2, payload_bytes=0)
    written = write_kvc(path, hdr, text, state, FLASH_SHAPE, title=b"t")
    assert written.payload_bytes == formula(T)
    assert path.stat().st_size == 52 + len(text) + formula(T) + 4 + 1 + 12  # title, checksum
    loaded = load_kvc(path, KIND_SESSION, shape=FLASH_SHAPE, ctx=ctx, model_id=0, quant_bits=2)
    assert loaded.envelope.header == written
    assert loaded.envelope.text == text and loaded.envelope.title == b"t"
    assert_states_equal(state, loaded.payload)
    del state, loaded


def test_writer_canonicalises_stale_frontier_rows():
    T = 6  # ratio 4: rows 0..3 previous group, rows 4,5 live, rows 6,7 stale; ratio 16: rows 0..5 live
    state = random_state(TINY, T, 64, seed=1)
    lp2, lp3 = state.layers[2], state.layers[3]
    live2 = lp2.attn_kv[:6].copy()
    lp2.attn_kv[6:] = 7.0
    lp2.index_score[7] = 3.0
    lp3.attn_score[6:] = 1.0
    data = _payload_bytes(state, TINY)
    back = read_payload(io.BytesIO(data), len(data), TINY, 64)
    assert filler_ok(back, TINY)
    np.testing.assert_array_equal(back.layers[2].attn_kv[:6], live2)
    assert np.all(back.layers[2].attn_kv[6:] == 0.0)
    assert np.all(back.layers[2].index_score[6:] == FILLER_SCORE)
    assert np.all(back.layers[3].attn_score[6:] == FILLER_SCORE)
    assert lp2.attn_kv[7, 0] == 7.0  # the caller's arrays are not modified


def test_writer_streams_array_buffers_without_copies():
    """The file receives the arrays' own memory: the writer allocates no payload-sized buffer."""
    import tracemalloc

    state = random_state(FLASH_SHAPE, 300, 4096, seed=3)
    size = payload_size(FLASH_SHAPE, 300, 4096)

    class Sink:
        n = 0

        def write(self, b):
            self.n += memoryview(b).nbytes

    tracemalloc.start()
    write_payload(Sink(), state, FLASH_SHAPE)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < size // 20


@pytest.mark.parametrize("mutate,detail", [
    (lambda s: setattr(s, "tokens", s.tokens[:0]), "empty"),
    (lambda s: s.tokens.__setitem__(0, TINY.vocab), "outside the vocabulary"),
    (lambda s: s.logits.__setitem__(3, np.nan), "not all finite"),
    (lambda s: setattr(s, "logits", s.logits[:-1]), "logits have shape"),
    (lambda s: s.layers.pop(), "layers"),
    (lambda s: setattr(s.layers[2], "comp", s.layers[2].comp[:-1]), "layer 2 comp"),
    (lambda s: setattr(s.layers[0], "comp", np.zeros((1, 8), np.float32)), "unexpected comp"),
    (lambda s: setattr(s.layers[3], "index_comp", np.zeros((0, 4), np.float32)), "unexpected index_comp"),
    (lambda s: setattr(s, "ctx", 5), "context 5"),
])
def test_writer_refuses_states_that_would_not_load(mutate, detail):
    state = random_state(TINY, 9, 64)
    mutate(state)
    with pytest.raises(KVCPayloadError, match=detail):
        write_payload(io.BytesIO(), state, TINY)


# --- §9.5: one crafted payload per error -------------------------------------------------------

T0, CTX0 = 9, 64


@pytest.fixture(scope="module")
def good():
    return _payload_bytes(random_state(TINY, T0, CTX0, seed=5), TINY)


def _set_word(data, idx, value):
    b = bytearray(data)
    struct.pack_into("<I", b, 4 * idx, value)
    return bytes(b)


def _read(data, *, ctx=CTX0, nbytes=None, **kw):
    return read_payload(io.BytesIO(data), len(data) if nbytes is None else nbytes, TINY, ctx, **kw)


COUNTS = 52 + 4 * T0 + 4 * TINY.vocab


@pytest.mark.parametrize("edit,message", [
    (lambda d: d[:51], E.P_TRUNCATED),
    (lambda d: _set_word(d, 0, 0x34565345), E.P_VERSION),
    (lambda d: _set_word(d, 1, 1), E.P_VERSION),
    (lambda d: _set_word(d, 2, CTX0 + 1), E.P_CONTEXT),
    (lambda d: _set_word(d, 7, CTX0), E.P_CONTEXT),
    (lambda d: _set_word(d, 8, 5), E.P_LAYOUT),
    (lambda d: _set_word(d, 9, 16), E.P_LAYOUT),
    (lambda d: _set_word(d, 10, 8), E.P_LAYOUT),
    (lambda d: _set_word(d, 11, 129281), E.P_LAYOUT),
    (lambda d: _set_word(d, 5, 7), E.P_CHUNK),
    (lambda d: _set_word(d, 4, 0), E.P_RAW_RING),
    (lambda d: _set_word(d, 12, 7), E.P_RAW_RING),
    (lambda d: _set_word(_set_word(_set_word(d, 4, 4), 5, 8), 12, 8), E.P_RAW_RING),
    (lambda d: _set_word(d, 6, 64 // 4 + 3), E.P_COMP_CAPACITY),
    (lambda d: _set_word(d, 13 + 4, TINY.vocab), E.P_TOKEN_ID),
    (lambda d: d[:52 + 4 * T0] + struct.pack("<f", float("nan")) + d[56 + 4 * T0:], E.P_LOGITS),
    (lambda d: d[:60 + 4 * T0] + struct.pack("<f", float("-inf")) + d[64 + 4 * T0:], E.P_LOGITS),
    (lambda d: d[:COUNTS] + struct.pack("<I", 1) + d[COUNTS + 4:], E.P_COMP_ROWS),  # dense layer
    (lambda d: d[:COUNTS + 8] + struct.pack("<I", 3) + d[COUNTS + 12:], E.P_COMP_ROWS),  # != T//4
    (lambda d: d[:COUNTS + 8] + struct.pack("<I", 10**9) + d[COUNTS + 12:], E.P_COMP_ROWS),  # > capacity
    (lambda d: d[:COUNTS + 24] + struct.pack("<I", 1) + d[COUNTS + 28:], E.P_INDEX_ROWS),  # != n_comp
    (lambda d: d[:COUNTS + 28] + struct.pack("<I", 1) + d[COUNTS + 32:], E.P_INDEX_ROWS),  # ratio 16
    (lambda d: d[:-4], E.P_TRUNCATED),
    (lambda d: d + b"\0\0\0\0", E.P_TRAILING),
])
def test_each_payload_error(good, edit, message):
    with pytest.raises(KVCPayloadError) as info:
        _read(edit(good))
    assert str(info.value) == message


def test_comp_counts_are_checked_before_indexer_counts(good):
    d = bytearray(good)
    struct.pack_into("<I", d, COUNTS + 4 * 6, 7)  # indexer row count of layer 2 wrong
    struct.pack_into("<I", d, COUNTS + 4 * 3, 5)  # and the compressed count of layer 3
    with pytest.raises(KVCPayloadError, match=E.P_COMP_ROWS):
        _read(bytes(d))


def test_short_read_reports_read_failure(good):
    with pytest.raises(KVCPayloadError, match=E.P_READ_FAILED):
        read_payload(io.BytesIO(good[:-100]), len(good), TINY, CTX0)


def test_chunk_cap_is_only_checked_on_request(good):
    d = _set_word(good, 3, 2048)
    assert len(_read(d).tokens) == T0
    with pytest.raises(KVCPayloadError, match=E.P_CHUNK):
        _read(d, check_chunk=True)


def test_larger_running_context_loads_and_cpu_backend_ring_is_accepted(good):
    assert _read(good, ctx=4096).ctx == CTX0
    d = _set_word(good, 4, 8)  # ds4's CPU backend writes h4 = h5
    assert len(_read(d).tokens) == T0


def test_huge_counts_never_allocate(good):
    import tracemalloc

    d = _set_word(good, 7, CTX0 - 1)  # T claims 63 tokens: token array no longer fits the bytes read
    d2 = _set_word(_set_word(good, 11, 0xFFFFFFF0), 8, 4)
    tracemalloc.start()
    for data, ctx in ((d, CTX0), (d2, CTX0)):
        with pytest.raises(KVCPayloadError):
            read_payload(io.BytesIO(data), 200, TINY, ctx)
    with pytest.raises(KVCPayloadError, match=E.P_TRUNCATED):
        read_payload(io.BytesIO(_set_word(good, 7, 10**9)), len(good), TINY, 2**31)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # What the claims would cost if believed: gigabytes. A few MiB is the reader's own buffers plus
    # whatever else the process happens to allocate meanwhile (the bound must not be flaky under xdist).
    assert peak < 8 << 20


def test_validation_without_arrays_reports_counts(good):
    info = _read(good, keep_arrays=False)
    assert isinstance(info, PayloadInfo) and info.layers_checked
    assert list(info.n_comp) == [0, 0, 2, 0] and list(info.n_index_comp) == [0, 0, 2, 0]
    unknown = read_payload(io.BytesIO(good), len(good), None, CTX0, keep_arrays=False)
    assert not unknown.layers_checked and unknown.header.n_tokens == T0
    with pytest.raises(KVCPayloadError, match=E.P_TRUNCATED):
        read_payload(io.BytesIO(good[:COUNTS + 40]), COUNTS + 40, None, CTX0, keep_arrays=False)


def test_validation_scans_tokens_and_logits_without_holding_them(tmp_path):
    """kv verify/show (keep_arrays=False) take T and V from the file: a sparse file claiming a
    256 MiB logits row is checked piecewise, never allocated whole."""
    import tracemalloc

    from ds4agent.sessions.payload import PAYLOAD_MAGIC

    V = 1 << 26
    hdr = PayloadHeader(PAYLOAD_MAGIC, 2, 2, 2, 1, 1, 0, 1, 1, 1, 1, V, 1)
    path = tmp_path / "p.bin"
    with open(path, "wb") as f:
        f.write(hdr.pack() + struct.pack("<I", 5))  # token 5 < V
        f.seek(52 + 4 + 4 * V + 8 + 4)  # logits (0.0: finite), counts, one raw row: a hole
        f.truncate()
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with open(path, "rb", buffering=0) as f:
            info = read_payload(f, size, None, 2, keep_arrays=False)
            at = f.tell()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.header.vocab == V and not info.layers_checked
    assert at == 52 + 4 + 4 * V + 8  # every piece was read: the cursor is where the arrays start
    assert peak < 16 << 20
    with open(path, "r+b") as f:  # a non-finite logit in the last piece is still found
        f.seek(52 + 4 + 4 * (V - 1))
        f.write(struct.pack("<f", float("nan")))
    with open(path, "rb", buffering=0) as f, pytest.raises(KVCPayloadError, match=f"^{E.P_LOGITS}$"):
        read_payload(f, size, None, 2, keep_arrays=False)
