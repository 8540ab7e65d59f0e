"""Golden bytes: a small session file checked into tests/sessions/data/ (MICRO layout).

If this test fails after an intentional format change, regenerate with
`python -m tests.sessions.test_golden` and review the diff of the header/trailer bytes; an
unintentional failure means files stopped being byte-compatible.
"""

from pathlib import Path

import numpy as np

from ds4agent.sessions.kvc import KIND_SESSION, KVCHeader, load_kvc, session_identity, write_kvc
from ds4agent.sessions.payload import PayloadState, blank_state

from .helpers import MICRO, assert_states_equal, without_checksum

GOLDEN = Path(__file__).parent / "data" / "micro_session.kv"
TITLE = "golden ✓ title".encode()
CREATED, LAST_USED, CTX, T = 1_760_000_000, 1_760_000_300, 32, 6
TEXT = "<｜User｜>golden ✓ title<｜Assistant｜>ok".encode()


def golden_state() -> PayloadState:
    """Deterministic values (no RNG): arange-based rows, live frontier rows, filler elsewhere."""
    state = blank_state(MICRO, T, CTX)
    state.tokens[:] = np.arange(T, dtype=np.uint32) * 2 + 1
    state.logits[:] = np.arange(MICRO.vocab, dtype=np.float32) * 0.25 - 2.0
    for layer, lp in enumerate(state.layers):
        lp.raw[:] = np.arange(lp.raw.size, dtype=np.float32).reshape(lp.raw.shape) / 8 + layer
        if lp.comp is not None:
            lp.comp[:] = -np.arange(lp.comp.size, dtype=np.float32).reshape(lp.comp.shape) / 4
            ratio, coff = MICRO.ratios[layer], MICRO.coff(layer)
            live = ratio * (coff - 1) + T % ratio
            lp.attn_kv[:live] = 0.5
            lp.attn_score[:live] = np.arange(live * lp.attn_score.shape[1], dtype=np.float32).reshape(live, -1)
        if lp.index_comp is not None:
            lp.index_comp[:] = 3.0
            lp.index_kv[:live] = 1.5
            lp.index_score[:live] = -7.0
    return state


def golden_bytes(tmp: Path) -> bytes:
    path = tmp / (session_identity(TITLE, CREATED) + ".kv")
    write_kvc(path, KVCHeader(2, 6, 8, 0, T, 0, CTX, CREATED, LAST_USED, 0), TEXT, golden_state(), MICRO, TITLE)
    return path.read_bytes()


def test_writer_reproduces_the_golden_file(tmp_path):
    # The golden file is what ds4 writes; ds4agent adds its checksum trailer (kvc.EXT_CHECKSUM).
    written = golden_bytes(tmp_path)
    assert without_checksum(written) == GOLDEN.read_bytes()
    assert written[6] == 0x88 and written[-12:-8] == b"DS4C"


def test_golden_file_reads_back(tmp_path):
    path = tmp_path / (session_identity(TITLE, CREATED) + ".kv")
    path.write_bytes(GOLDEN.read_bytes())
    loaded = load_kvc(path, KIND_SESSION, shape=MICRO, ctx=CTX, model_id=0, quant_bits=2)
    assert_states_equal(golden_state(), loaded.payload)
    assert loaded.envelope.text == TEXT and loaded.envelope.title == TITLE


def test_golden_spot_bytes():
    data = GOLDEN.read_bytes()
    assert data[:8] == bytes.fromhex("4b56430102060800")  # KVC v1, q2, reason 6, ext title, model 0
    assert data[20] == 2 and data[21:24] == b"\0\0\0"
    p = 52 + len(TEXT)
    assert data[p:p + 8] == bytes.fromhex("4453563402000000")  # DSV4, payload version 2
    assert data[-(4 + len(TITLE)):] == len(TITLE).to_bytes(4, "little") + TITLE


if __name__ == "__main__":  # regenerate
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        GOLDEN.write_bytes(golden_bytes(Path(d)))
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
