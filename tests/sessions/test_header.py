"""The 48-byte header, names and identities (kvc-format.md §2, §4, §11, §12.3, §12.8)."""

import struct

import pytest

from ds4agent.sessions.errors import KVCHeaderError
from ds4agent.sessions.kvc import (
    KVCHeader,
    classify_name,
    is_scan_name,
    reason_name,
    session_identity,
    sysprompt_name,
    text_sha1,
)

EXAMPLE_A = bytes.fromhex(
    "4b564301020101000028000000000000a086010002000000"
    "0078e768000000000078e768000000008cc5d40900000000")
EXAMPLE_B = bytes.fromhex(
    "4b564301020608008c02000000000000a086010002000000"
    "0078e768000000002c79e76800000000bc05f70100000000")


def test_writer_produces_example_a_and_b():
    a = KVCHeader(quant_bits=2, reason=1, ext_flags=1, model_id=0, tokens=10240, hits=0, ctx_size=100000,
                  created_at=1760000000, last_used=1760000000, payload_bytes=164_939_148)
    b = KVCHeader(quant_bits=2, reason=6, ext_flags=8, model_id=0, tokens=652, hits=0, ctx_size=100000,
                  created_at=1760000000, last_used=1760000300, payload_bytes=32_966_076)
    assert a.pack() == EXAMPLE_A
    assert b.pack() == EXAMPLE_B
    assert KVCHeader.unpack(EXAMPLE_B) == b


def test_reader_round_trips_every_field_including_model_id_and_reserved():
    h = KVCHeader(quant_bits=4, reason=9, ext_flags=0xF3, model_id=7, tokens=0xFFFFFFFF, hits=12345,
                  ctx_size=393216, created_at=2**63 + 5, last_used=17, payload_bytes=2**40 + 3,
                  reserved=b"\x01\x02\x03")
    data = h.pack()
    assert len(data) == 48
    back = KVCHeader.unpack(data)
    assert back == h
    assert back.reason == 9 and back.reason_code == 0 and back.reason_name == "unknown"
    assert data[7] == 7 and data[20] == 2 and data[21:24] == b"\x01\x02\x03"


@pytest.mark.parametrize("offset,value", [
    (0, ord("k")), (2, ord("D")),  # magic
    (3, 2), (3, 0),  # file version
    (20, 1), (20, 3),  # payload ABI (v2 forks; 0 is an [S] file, 2 an [L] file)
    (4, 3), (4, 8), (4, 0),  # quant bits
])
def test_predicate_rejects(offset, value):
    data = bytearray(EXAMPLE_B)
    data[offset] = value
    with pytest.raises(KVCHeaderError, match="^invalid KV header$"):
        KVCHeader.unpack(bytes(data))


def test_predicate_rejects_zero_tokens_and_short_input():
    data = bytearray(EXAMPLE_B)
    struct.pack_into("<I", data, 8, 0)
    with pytest.raises(KVCHeaderError):
        KVCHeader.unpack(bytes(data))
    with pytest.raises(KVCHeaderError):
        KVCHeader.unpack(EXAMPLE_B[:47])


@pytest.mark.parametrize("offset,value", [(7, 1), (21, 0xFF), (22, 1), (23, 9), (6, 0xF8), (5, 200)])
def test_bytes_outside_the_predicate_are_accepted(offset, value):
    data = bytearray(EXAMPLE_B)
    data[offset] = value
    h = KVCHeader.unpack(bytes(data))
    assert h.pack() == bytes(data)  # a rewriter keeps what it does not understand


def test_reason_names_and_key_kinds():
    assert [reason_name(i) for i in range(8)] == [
        "unknown", "cold", "continued", "evict", "shutdown", "agent-system", "agent-session", "unknown"]
    base = KVCHeader.unpack(EXAMPLE_B)
    from dataclasses import replace
    assert replace(base, ext_flags=0x08).key_kind == "token-text"
    assert replace(base, ext_flags=0x02).key_kind == "responses-visible"
    assert replace(base, ext_flags=0x06).key_kind == "responses-visible"
    assert replace(base, ext_flags=0x04).key_kind == "thinking-visible"


def test_scan_name_rule():
    hex40 = "0f3314bf6aa1439e4d6361e32079d204ea8a5685"
    assert is_scan_name(hex40 + ".kv")
    assert is_scan_name(hex40.upper() + ".kv")
    assert classify_name(hex40.upper() + ".kv") == ("hex40", hex40)
    for bad in ("sysprompt.kv", "sysprompt-0123456789abcdef.kv", hex40 + ".kv.tmp.abc123",
                hex40[:39] + ".kv", hex40 + "0.kv", hex40[:39] + "g.kv", hex40 + ".KV", hex40):
        assert not is_scan_name(bad), bad
    assert classify_name("sysprompt-0123456789ABCDEF.kv") == ("sysprompt-hex", "0123456789abcdef")
    assert classify_name("sysprompt.kv") == ("sysprompt", None)
    assert classify_name("notes.txt") == ("other", None)


def test_identity_of_the_worked_example():
    title = b"Which Python files are here, and what is the first line of setup.py?"
    assert len(title) == 68
    assert session_identity(title, 1760000000) == "0f3314bf6aa1439e4d6361e32079d204ea8a5685"


def test_sysprompt_name_is_first_16_hex_of_sha1():
    text = b"<system text>"
    assert sysprompt_name(text) == f"sysprompt-{text_sha1(text)[:16]}.kv"
    assert text_sha1(b"abc") == "a9993e364706816aba3e25717850c26c9cd0d89d"


def test_s_layout_header_is_accepted_and_round_trips():
    """Byte 20 = 0: a file from an earlier ds4 build ([S], §13), read with payload version 1."""
    data = bytearray(EXAMPLE_B)
    data[20] = 0
    h = KVCHeader.unpack(bytes(data))
    assert h.layout == "[S]" and h.payload_version == 1 and h.pack() == bytes(data)
    b = KVCHeader.unpack(EXAMPLE_B)
    assert b.layout == "[L]" and b.payload_version == 2
