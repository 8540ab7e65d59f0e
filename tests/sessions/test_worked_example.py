"""kvc-format.md §12.8 end to end: the §13 transcript of prompt-and-dsml.md saved through the store.

Each piece (header, identity, payload header, size formula) has its own unit test; this one checks
that save_session puts them together into exactly the file the spec describes.
"""

from pathlib import Path

import numpy as np

from ds4agent.sessions.payload import FLASH_SHAPE, blank_state
from ds4agent.sessions.store import SessionStore
from tests.sessions.helpers import without_checksum

FOUNDATION_DATA = Path(__file__).resolve().parents[1] / "foundation" / "data"
EXAMPLE_B = bytes.fromhex(
    "4b564301020608008c02000000000000a086010002000000"
    "0078e768000000002c79e76800000000bc05f70100000000")
PAYLOAD_HEAD = bytes.fromhex(
    "44535634020000 00a0860100001000000011000080000000aa6100008c0200002b000000"
    "000200008000000000f9010080000000".replace(" ", ""))


def test_section_12_8_worked_example(tmp_path):
    text = (FOUNDATION_DATA / "worked_example.txt").read_bytes()
    ids = [int(x) for x in (FOUNDATION_DATA / "worked_example_ids.txt").read_text().split()]
    assert (len(text), len(ids)) == (2718, 652)
    state = blank_state(FLASH_SHAPE, len(ids), 100_000)
    state.tokens[:] = ids
    store = SessionStore(tmp_path, clock=lambda: 1_760_000_300)
    saved = store.save_session(text, state, shape=FLASH_SHAPE, quant_bits=2, created_at=1_760_000_000)
    title = b"Which Python files are here, and what is the first line of setup.py?"
    assert saved.title == title and len(title) == 68
    assert saved.path.name == "0f3314bf6aa1439e4d6361e32079d204ea8a5685.kv"
    assert saved.message == "saved session 0f3314bf (652 tokens)"
    data = bytes(without_checksum(saved.path.read_bytes()))  # as ds4 writes it (+12 bytes ours)
    assert len(data) == 32_968_918
    assert data[:48] == EXAMPLE_B
    assert data[48:52] == (2718).to_bytes(4, "little") and data[52:52 + 2718] == text
    payload = data[52 + 2718:-(4 + 68)]
    assert len(payload) == 32_966_076 and payload[:52] == PAYLOAD_HEAD
    assert np.array_equal(np.frombuffer(payload[52:52 + 4 * 652], "<u4"), ids)
    assert data[-(4 + 68):] == bytes.fromhex("44000000") + title
