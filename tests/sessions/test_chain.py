"""Agent load chain 8.3 and trailers (kvc-format.md §5, §8.3): each error, in step order."""

import io
import struct
import tracemalloc

import pytest

from ds4agent.sessions import errors as E
from ds4agent.sessions.errors import (
    KVCError,
    KVCHeaderError,
    KVCIdentityError,
    KVCIOError,
    KVCKindError,
    KVCMismatchError,
    KVCPayloadError,
    KVCSizeError,
    KVCTextError,
    KVCTrailerError,
)
from ds4agent.sessions.kvc import (
    KIND_SESSION,
    KIND_SYSPROMPT,
    KVCHeader,
    load_kvc,
    session_identity,
    sysprompt_name,
    text_sha1,
    verify_kvc,
)
from ds4agent.sessions.payload import write_payload
from ds4agent.sessions.titles import display_text

from .helpers import TINY, random_state, s_layout

CTX = 64
TITLE = "Ünïcode tïtle ✓".encode()
CREATED = 1_760_000_000


def payload_bytes(T=9, seed=0):
    buf = io.BytesIO()
    write_payload(buf, random_state(TINY, T, CTX, seed), TINY)
    return buf.getvalue()


def build(*, reason=6, ext=0x08, model_id=0, quant=2, tokens=9, created=CREATED, text=b"<text>",
          payload=None, title=TITLE, ktm=None, tail=b"", text_len=None, payload_len=None):
    payload = payload_bytes(tokens) if payload is None else payload
    hdr = KVCHeader(quant_bits=quant, reason=reason, ext_flags=ext, model_id=model_id, tokens=tokens, hits=0,
                    ctx_size=CTX, created_at=created, last_used=created, payload_bytes=len(payload)
                    if payload_len is None else payload_len)
    out = hdr.pack() + struct.pack("<I", len(text) if text_len is None else text_len) + text + payload
    if ktm is not None:
        out += ktm
    if title is not None and ext & 0x08:
        out += struct.pack("<I", len(title)) + title
    return out + tail


def put(tmp_path, data, name=None, *, title=TITLE, created=CREATED):
    name = name or f"{session_identity(title, created)}.kv"
    path = tmp_path / name
    path.write_bytes(data)
    return path


def load(path, kind=KIND_SESSION, **kw):
    args = dict(shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    args.update(kw)
    return load_kvc(path, kind, **args)


def ktm_section(entries):
    out = b"KTM\x01" + struct.pack("<I", len(entries))
    for ident, dsml in entries:
        out += struct.pack("<II", len(ident), len(dsml)) + ident + dsml
    return out


def test_a_good_session_loads(tmp_path):
    loaded = load(put(tmp_path, build()))
    assert loaded.envelope.title == TITLE and loaded.envelope.text == b"<text>"
    assert len(loaded.payload.tokens) == 9


def test_step1_missing_file(tmp_path):
    with pytest.raises(KVCIOError, match="No such file or directory"):
        load(tmp_path / "nope.kv")


def test_step2_invalid_header(tmp_path):
    for abi in (1, 3):  # 2 is [L], 0 is [S] (§13); anything else is a fork's layout
        data = bytearray(build())
        data[20] = abi
        with pytest.raises(KVCHeaderError, match=f"^{E.INVALID_HEADER}$"):
            load(put(tmp_path, bytes(data)))
    with pytest.raises(KVCHeaderError):
        load(put(tmp_path, build()[:51]))


def test_s_layout_loads_and_each_layout_needs_its_own_payload_version(tmp_path):
    """[S] (byte 20 = 0) carries payload version 1, [L] version 2 (§13); a file mixing them fails at
    the payload (step 11), not silently."""
    text = b"<text>"
    legacy = build(ext=0, title=None, text=text)
    s_file = put(tmp_path, s_layout(legacy), f"{text_sha1(text)}.kv")
    loaded = load(s_file)
    assert loaded.envelope.header.layout == "[S]" and loaded.envelope.header.payload_version == 1
    assert loaded.envelope.title is None and loaded.envelope.text == text
    assert loaded.payload.tokens.tolist() == load(put(tmp_path, legacy, f"{text_sha1(text)}.kv")).payload.tokens.tolist()
    assert verify_kvc(s_file).ok

    s_header_l_payload = bytearray(legacy)
    s_header_l_payload[20] = 0
    l_header_s_payload = bytearray(s_layout(legacy))
    l_header_s_payload[20] = 2
    for data in (s_header_l_payload, l_header_s_payload):
        path = put(tmp_path, bytes(data), f"{text_sha1(text)}.kv")
        with pytest.raises(KVCPayloadError, match=f"^{E.P_VERSION}$"):
            load(path)
        assert str(verify_kvc(path).error) == E.P_VERSION


def test_step3_kind(tmp_path):
    with pytest.raises(KVCKindError, match=E.NOT_A_SESSION):
        load(put(tmp_path, build(reason=5)))
    with pytest.raises(KVCKindError, match=E.NOT_A_SYSPROMPT):
        load(put(tmp_path, build()), KIND_SYSPROMPT)


def test_step4_huge_text_length_is_refused_before_allocating(tmp_path):
    path = put(tmp_path, build(text_len=0xFFFFFFFF))
    tracemalloc.start()
    with pytest.raises(KVCTextError, match=E.TRUNCATED_TEXT):
        load(path)
    assert tracemalloc.get_traced_memory()[1] < 1 << 20
    tracemalloc.stop()


def test_step5_cut_inside_payload_is_shorter_than_header(tmp_path):
    data = build()
    for cut in (len(data) - 1000, 52 + 6 + 10, len(data) - len(TITLE) - 5):
        with pytest.raises(KVCSizeError, match=E.SHORTER_THAN_HEADER):
            load(put(tmp_path, data[:cut]))


def test_step5_huge_payload_length(tmp_path):
    with pytest.raises(KVCSizeError):
        load(put(tmp_path, build(payload_len=2**63)))


def test_step6_title_trailer_errors(tmp_path):
    full = build()
    body = full[:-(4 + len(TITLE))]
    with pytest.raises(KVCTrailerError, match=f"^{E.MISSING_TITLE}$"):
        load(put(tmp_path, body + b"\x05\x00"))
    with pytest.raises(KVCTrailerError, match=f"^{E.TRUNCATED_TITLE}$"):
        load(put(tmp_path, body + struct.pack("<I", len(TITLE) + 1) + TITLE))
    with pytest.raises(KVCTrailerError, match=f"^{E.TRUNCATED_TITLE}$"):
        load(put(tmp_path, body + struct.pack("<I", 0xFFFFFFFF) + TITLE))
    with pytest.raises(KVCTrailerError, match=f"^{E.EMPTY_TITLE}$"):
        load(put(tmp_path, body + struct.pack("<I", 0)))
    with pytest.raises(KVCTrailerError, match=f"^{E.TRAILING_BYTES}$"):
        load(put(tmp_path, full + b"x"))


def test_step6_trailing_bytes_allowed_when_a_reserved_bit_is_set(tmp_path):
    loaded = load(put(tmp_path, build(ext=0x18, tail=b"unknown future section")))
    assert loaded.envelope.title == TITLE


def test_step6_ktm_is_skipped_by_its_length(tmp_path):
    ktm = ktm_section([(b"call_" + b"a" * 32, b"\n\n<dsml block>"), (b"toolu_" + b"b" * 32, b"x" * 600)])
    loaded = load(put(tmp_path, build(ext=0x09, ktm=ktm)))
    assert loaded.envelope.title == TITLE and loaded.envelope.ktm_entries == 2
    # server checkpoint with only a KTM, named SHA1(text): verifies as a checkpoint
    cp = build(reason=2, ext=0x01, ktm=ktm, title=None)
    assert verify_kvc(put(tmp_path, cp, text_sha1(b"<text>") + ".kv")).ok


@pytest.mark.parametrize("ktm", [
    b"KTN\x01" + struct.pack("<I", 0),
    b"KTM\x02" + struct.pack("<I", 0),
    b"KTM\x01" + struct.pack("<I", 1000),  # 8 * count > bytes left
    b"KTM\x01" + struct.pack("<I", 1) + struct.pack("<II", 5, 2**31) + b"abcde",
    b"KTM",
])
def test_step6_malformed_ktm(tmp_path, ktm):
    with pytest.raises(KVCTrailerError, match=f"^{E.INVALID_KTM}$"):
        load(put(tmp_path, build(ext=0x09, ktm=ktm)))


def test_step7_and_8_model_and_quant(tmp_path):
    with pytest.raises(KVCMismatchError, match=f"^{E.DIFFERENT_MODEL}$"):
        load(put(tmp_path, build(model_id=1)))
    with pytest.raises(KVCMismatchError, match=f"^{E.DIFFERENT_QUANT}$"):
        load(put(tmp_path, build(quant=4)))
    # a stripped session carries no payload: the model checks do not apply
    stripped = load(put(tmp_path, build(model_id=1, quant=4, payload=b"")))
    assert stripped.payload is None


def test_step9_sysprompt_text(tmp_path):
    text = b"<system prefix>"
    data = build(reason=5, ext=0, text=text, title=None)
    path = put(tmp_path, data, sysprompt_name(text))
    assert len(load(path, KIND_SYSPROMPT, expected_text=text).payload.tokens) == 9
    with pytest.raises(KVCTextError, match=f"^{E.SYSPROMPT_MISMATCH}$"):
        load(path, KIND_SYSPROMPT, expected_text=text + b" changed")


def test_step10_identity(tmp_path):
    data = build()
    with pytest.raises(KVCIdentityError, match=f"^{E.IDENTITY_MISMATCH}$"):
        load(put(tmp_path, data, "0" * 40 + ".kv"))
    upper = session_identity(TITLE, CREATED).upper() + ".kv"
    assert load(put(tmp_path, data, upper)).envelope.title == TITLE
    legacy = build(ext=0, title=None, text=b"<legacy text>")
    assert load(put(tmp_path, legacy, text_sha1(b"<legacy text>") + ".kv")).envelope.title is None
    with pytest.raises(KVCIdentityError):
        load(put(tmp_path, legacy, text_sha1(b"other") + ".kv"))
    cache = build(reason=5, ext=0, title=None)
    with pytest.raises(KVCIdentityError):
        load(put(tmp_path, cache, "sysprompt-0123456789abcdef.kv"), KIND_SYSPROMPT)
    # a name without a hash is not checked
    assert load(put(tmp_path, data, "my-session.kv")).envelope.title == TITLE


def test_step11_payload_errors_come_after_identity(tmp_path):
    with pytest.raises(KVCPayloadError, match=E.P_CONTEXT):
        load(put(tmp_path, build()), ctx=9)
    bad = bytearray(payload_bytes())
    bad[0] ^= 1
    with pytest.raises(KVCPayloadError, match=E.P_VERSION):
        load(put(tmp_path, build(payload=bytes(bad))))
    with pytest.raises(KVCIdentityError):  # step 10 wins over step 11
        load(put(tmp_path, build(payload=bytes(bad)), "f" * 40 + ".kv"))


def test_step11_sysprompt_cache_without_payload(tmp_path):
    text = b"<sys>"
    path = put(tmp_path, build(reason=5, ext=0, text=text, title=None, payload=b""), sysprompt_name(text))
    with pytest.raises(KVCPayloadError, match=f"^{E.P_TRUNCATED}$"):
        load(path, KIND_SYSPROMPT, expected_text=text)


def test_step12_token_count(tmp_path):
    data = bytearray(build())
    struct.pack_into("<I", data, 8, 10)
    with pytest.raises(KVCPayloadError, match=f"^{E.TOKEN_COUNT_MISMATCH}$"):
        load(put(tmp_path, bytes(data)))


def test_non_utf8_title_loads_and_displays_with_replacement(tmp_path):
    title = b"caf\xe9 \xff\x01 ok\x7f"
    data = build(title=title)
    loaded = load(put(tmp_path, data, title=title))
    assert loaded.envelope.title == title
    assert display_text(title) == "caf\ufffd \ufffd\ufffd ok\ufffd"


def test_every_error_is_a_kvc_error_with_the_path(tmp_path):
    path = put(tmp_path, build(quant=4))
    with pytest.raises(KVCError) as info:
        load(path)
    assert info.value.path == path and info.value.with_path() == f"{path}: {E.DIFFERENT_QUANT}"


def test_verify_reports_standalone_kinds(tmp_path):
    session = verify_kvc(put(tmp_path, build()))
    assert session.ok and session.kind == "session" and not session.payload.layers_checked
    cp = verify_kvc(put(tmp_path, build(reason=1, ext=0, title=None), text_sha1(b"<text>") + ".kv"))
    assert cp.ok and cp.kind == "checkpoint"
    other = verify_kvc(put(tmp_path, build(reason=6), "copy.kv"))
    assert other.ok
    wrong = verify_kvc(put(tmp_path, build(reason=6), "sysprompt-0123456789abcdef.kv"))
    assert not wrong.ok and str(wrong.error) == E.NOT_A_SYSPROMPT
    stripped = verify_kvc(put(tmp_path, build(payload=b"")))
    assert stripped.ok and stripped.payload is None
    quant = verify_kvc(put(tmp_path, build()), quant_bits=4)
    assert str(quant.error) == E.DIFFERENT_QUANT

