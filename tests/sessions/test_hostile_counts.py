"""Counts in a KVC header are bounded before they size a loop or an allocation: what `kv verify`,
`kv show` and `kv ls` read (verify_kvc, the store's listing) refuses a hostile file at once.

The files are sparse (f.truncate): a few KiB on disk, any apparent size. Memory is measured with
tracemalloc as an upper bound on what the check allocates; nothing here times anything."""

from __future__ import annotations

import struct

from ds4agent.sessions import errors as E
from ds4agent.sessions.kvc import KTM_MAX_ENTRIES, KVCHeader, read_envelope, verify_kvc, write_kvc
from ds4agent.sessions.payload import PAYLOAD_MAGIC, PayloadHeader
from ds4agent.sessions.store import SessionStore

from .helpers import TINY, peak_memory, random_state, session_text, without_checksum

TEXT = b"<text>"


def claimed_layout_file(path, *, layers, size, vocab=1, head_dim=1, tokens=1):
    """A checkpoint whose payload header claims `layers` layers, the file `size` bytes long (all
    but the first ~110 bytes a hole), payload_bytes filling the file exactly."""
    ctx = max(2, tokens + 1)
    payload = PayloadHeader(PAYLOAD_MAGIC, 2, ctx, 2, 1, 1, 0, tokens, layers, head_dim, 1, vocab, 1)
    header = KVCHeader(2, 1, 0, 0, tokens, 0, ctx, 1, 1, size - 52 - len(TEXT))
    with open(path, "wb") as f:
        f.write(header.pack() + struct.pack("<I", len(TEXT)) + TEXT + payload.pack() + struct.pack("<I", 0))
        f.truncate(size)
    return path


def test_a_4_kib_file_claiming_2_to_the_32_layers_is_refused_at_once(tmp_path):
    path = claimed_layout_file(tmp_path / "cp.kv", layers=0xFFFFFFFF, size=4096)
    result, peak = peak_memory(lambda: verify_kvc(path))
    assert not result.ok and str(result.error).startswith(E.P_IMPLAUSIBLE)
    assert "4294967295 layers, at most 1024" in str(result.error)
    assert peak < 1 << 20


def test_a_sparse_terabyte_claiming_2_to_the_32_layers_is_refused_before_its_counts_are_read(tmp_path):
    # Every "fits in the bytes left" check passes here: only the layout bound stops a 32 GiB
    # counts array and 2^32 rounds of per-layer checks.
    path = claimed_layout_file(tmp_path / "cp.kv", layers=0xFFFFFFFF, size=1 << 40)
    assert path.stat().st_blocks * 512 < 1 << 20
    result, peak = peak_memory(lambda: verify_kvc(path))
    assert not result.ok and str(result.error).startswith(E.P_IMPLAUSIBLE)
    assert peak < 1 << 20


def test_a_huge_claimed_vocabulary_or_head_dimension_is_refused_too(tmp_path):
    path = claimed_layout_file(tmp_path / "a.kv", layers=4, vocab=1 << 30, size=1 << 40)
    result, peak = peak_memory(lambda: verify_kvc(path))
    assert "1073741824 vocabulary" in str(result.error) and peak < 1 << 20
    path = claimed_layout_file(tmp_path / "b.kv", layers=4, head_dim=1 << 20, size=1 << 40)
    assert "1048576 head dimension" in str(verify_kvc(path).error)
    # 2^32 - 2 tokens would be 16 GiB of token ids to scan through the hole.
    path = claimed_layout_file(tmp_path / "c.kv", layers=4, tokens=0xFFFFFFFE, size=1 << 40)
    assert "4294967294 tokens, at most 16777216" in str(verify_kvc(path).error)


def test_a_plausible_layout_in_a_short_file_is_still_just_truncated(tmp_path):
    path = claimed_layout_file(tmp_path / "cp.kv", layers=1000, size=4096, vocab=1000)
    result = verify_kvc(path)
    assert str(result.error) == E.P_TRUNCATED


def _with_ktm_trailer(path, entries: int, size: int):
    """A valid session file with bit0 set and a KTM trailer claiming `entries` entries after its
    payload, the rest of the `size`-byte file a hole (so every entry reads as two zero lengths)."""
    data = without_checksum(path.read_bytes())  # as ds4-server writes it
    data[6] |= 0x01  # ext_flags: KTM
    with open(path, "wb") as f:
        f.write(bytes(data) + b"KTM\x01" + struct.pack("<I", entries))
        f.truncate(size)


def test_a_ktm_trailer_claiming_billions_of_entries_is_refused_without_walking_them(tmp_path):
    store = SessionStore(tmp_path)
    saved = store.save_session(session_text("ktm"), random_state(TINY, 5, 64), shape=TINY, quant_bits=2,
                               now=1_760_000_000)
    # The title trailer would follow the KTM: drop it (bit3) so the KTM is the file's last section.
    plain = tmp_path / "plain.kv"
    write_kvc(plain, KVCHeader(2, 1, 0, 0, 5, 0, 64, 1, 1, 0), TEXT, random_state(TINY, 5, 64), TINY)
    _with_ktm_trailer(plain, 0xFFFFFFFF, 1 << 40)
    result, peak = peak_memory(lambda: verify_kvc(plain, shape=TINY))
    assert str(result.error) == E.INVALID_KTM and peak < 1 << 20
    # The listing (kv ls) skips it the same way.
    _with_ktm_trailer(saved.path, 0xFFFFFFFF, 1 << 40)
    (sessions, unreadable), peak = peak_memory(store.scan_sessions)
    assert sessions == [] and [u.path for u in unreadable] == [saved.path] and peak < 1 << 20
    assert E.INVALID_KTM in unreadable[0].reason


def test_a_ktm_trailer_at_the_servers_own_entry_limit_is_still_skipped(tmp_path):
    path = tmp_path / "cp.kv"
    write_kvc(path, KVCHeader(2, 1, 0, 0, 5, 0, 64, 1, 1, 0), TEXT, random_state(TINY, 5, 64), TINY)
    data = without_checksum(path.read_bytes())  # as ds4-server writes it
    data[6] |= 0x01
    path.write_bytes(bytes(data) + b"KTM\x01" + struct.pack("<I", KTM_MAX_ENTRIES) + bytes(8 * KTM_MAX_ENTRIES))
    env = read_envelope(path)
    assert env.ktm_entries == KTM_MAX_ENTRIES
