"""Damaged files: truncation at every offset and random byte flips are refused with a KVCError,
or (for flips in data the format does not protect) load values that differ only there."""

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4agent.sessions.errors import KVCError
from ds4agent.sessions.kvc import KIND_SESSION, KVCHeader, load_kvc, session_identity, verify_kvc, write_kvc
from ds4agent.sessions.payload import payload_size, write_payload

from .helpers import MICRO, random_state

CTX = 32
T = 13
TITLE = "fuzz ✓".encode()
TEXT = "<｜User｜>fuzz ✓<｜Assistant｜>".encode()
STATE = random_state(MICRO, T, CTX, seed=7)
NAME = session_identity(TITLE, 1234) + ".kv"


def _good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / NAME
    write_kvc(path, KVCHeader(2, 6, 8, 0, T, 0, CTX, 1234, 5678, 0), TEXT, STATE, MICRO, TITLE)
    return path.read_bytes()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return _good_file(tmp_path_factory)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("scratch") / NAME


def _load(path):
    return load_kvc(path, KIND_SESSION, shape=MICRO, ctx=CTX, model_id=0, quant_bits=2)


def test_fixture_file_is_valid_and_small(good, scratch):
    scratch.write_bytes(good)
    loaded = _load(scratch)
    assert loaded.envelope.title == TITLE
    assert len(good) == 52 + len(TEXT) + payload_size(MICRO, T, CTX) + 4 + len(TITLE) + 12 < 4096  # + checksum


def test_truncation_at_every_offset_is_refused(good, scratch):
    for cut in range(len(good)):
        scratch.write_bytes(good[:cut])
        with pytest.raises(KVCError):
            _load(scratch)
        assert not verify_kvc(scratch).ok


PAYLOAD_AT = 52 + len(TEXT)
P_HEADER_WORDS_LOADABLE = {2, 3, 4, 6}  # h2 (saved ctx, may shrink), h3 (unchecked), h4, h6 (bounds)


def _reserialise(state):
    buf = io.BytesIO()
    write_payload(buf, state, MICRO)
    return buf.getvalue()


ORIG_PAYLOAD = _reserialise(STATE)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_flips(good, scratch, data):
    offset = data.draw(st.integers(0, len(good) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="mask")
    flipped = bytearray(good)
    flipped[offset] ^= mask
    scratch.write_bytes(bytes(flipped))
    assert isinstance(verify_kvc(scratch).ok, bool)  # the validator never raises
    try:
        loaded = _load(scratch)
    except KVCError:
        return
    # It loaded: the flip must be somewhere the format does not protect, and nothing else changed.
    env, state = loaded.envelope, loaded.payload
    orig_hdr = KVCHeader.unpack(good[:48])
    payload_end = PAYLOAD_AT + len(ORIG_PAYLOAD)
    if offset < 48:
        # hits, ctx_size (not compared on a live load), reserved bytes, last_used, ext marker bits
        assert offset in (*range(12, 20), 21, 22, 23, *range(32, 40)) or (offset == 6 and not mask & 0x09)
        assert env.header.tokens == orig_hdr.tokens and env.header.created_at == orig_hdr.created_at
    elif PAYLOAD_AT <= offset < payload_end:
        rel = offset - PAYLOAD_AT
        if rel < 52:
            assert rel // 4 in P_HEADER_WORDS_LOADABLE
            np.testing.assert_array_equal(state.tokens, STATE.tokens)
            np.testing.assert_array_equal(state.logits, STATE.logits)
            return
        again = _reserialise(state)
        expect = bytearray(ORIG_PAYLOAD)
        expect[rel] ^= mask
        # array data: the value read is exactly the flipped one (or a dead frontier row, which the
        # writer canonicalises back to the original filler)
        assert again in (bytes(expect), ORIG_PAYLOAD)
    else:
        assert 52 <= offset < PAYLOAD_AT  # the rendered text is not covered by a session's identity
        assert env.text == bytes(flipped[52:PAYLOAD_AT])
    assert env.title == TITLE
    if not (PAYLOAD_AT <= offset < payload_end):
        assert _reserialise(state) == ORIG_PAYLOAD


def test_s_layout_file_loads_and_truncation_at_every_offset_is_refused(tmp_path):
    """[S] files (byte 20 = 0, payload version 1, kvc-format.md §13) go through the same chain: whole, it loads;
    cut anywhere, it is refused and the validator says so without raising."""
    from ds4agent.sessions.kvc import text_sha1

    from .helpers import s_layout

    path = tmp_path / (text_sha1(TEXT) + ".kv")
    write_kvc(path, KVCHeader(2, 6, 0, 0, T, 0, CTX, 1234, 5678, 0), TEXT, STATE, MICRO)
    data = s_layout(path.read_bytes())
    path.write_bytes(data)
    np.testing.assert_array_equal(_load(path).payload.tokens, STATE.tokens)
    assert verify_kvc(path).ok
    for cut in range(len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(KVCError):
            _load(path)
        assert not verify_kvc(path).ok
