"""A GGUF header cannot make the reader allocate or loop without bound: array lengths, string
lengths and key/tensor counts are bounded before they are used, even in a sparse file whose size
passes every "fits in the file" check. Memory is measured with tracemalloc as an upper bound on
what opening allocates; nothing here times anything."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from ds4agent.engine import gguf
from ds4agent.engine.errors import ModelFileError
from ds4agent.engine.gguf import GGUFFile, ValueType

UINT32, UINT8, STRING, ARRAY = (int(ValueType.UINT32), int(ValueType.UINT8), int(ValueType.STRING),
                                int(ValueType.ARRAY))
BOUND = 100 << 20


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def sparse_gguf(path, head: bytes, size: int, *, n_kv: int = 1, n_tensors: int = 0):
    """`head` after the 24-byte GGUF preamble, the rest of the `size`-byte file a hole."""
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + head)
        f.truncate(size)
    assert path.stat().st_blocks * 512 < len(head) + (1 << 20)  # really sparse
    return path


def refused(path) -> tuple[str, int]:
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError) as info:
            GGUFFile.open(path)
        return str(info.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("etype", [UINT32, UINT8, STRING])
def test_a_67m_entry_array_in_a_sparse_file_is_refused(tmp_path, etype):
    head = _key("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, etype, 1 << 26)
    path = sparse_gguf(tmp_path / "m.gguf", head, 4 << 30)
    message, peak = refused(path)
    assert "GGUF header too large (while reading tokenizer.ggml.tokens" in message and peak < BOUND


def test_arrays_within_the_header_bound_still_share_one_element_budget(tmp_path):
    # Two 3M-element byte arrays: 6 MB of header, fine in bytes, but 6M Python objects.
    n = 3 << 20
    head = (_key("a") + struct.pack("<IIQ", ARRAY, UINT8, n) + bytes(n)
            + _key("b") + struct.pack("<IIQ", ARRAY, UINT8, n))
    path = sparse_gguf(tmp_path / "m.gguf", head, 1 << 30, n_kv=2)
    message, peak = refused(path)
    assert f"array 'b' has {n} elements, more than the {gguf.MAX_ARRAY_ITEMS}" in message and peak < BOUND


def test_a_gigabyte_string_is_refused_before_it_is_copied(tmp_path):
    head = _key("general.name") + struct.pack("<IQ", STRING, 1 << 30)
    message, peak = refused(sparse_gguf(tmp_path / "m.gguf", head, 2 << 30))
    assert "GGUF header too large (while reading general.name" in message and peak < BOUND
    # The same inside a string array: one huge element among short ones.
    head = _key("t") + struct.pack("<IIQ", ARRAY, STRING, 3) + _key("ab") + struct.pack("<Q", 1 << 30)
    message, peak = refused(sparse_gguf(tmp_path / "n.gguf", head, 2 << 30))
    assert "GGUF header too large (while reading t" in message and peak < BOUND


def test_key_and_tensor_counts_beyond_any_model_are_refused_before_the_loop(tmp_path):
    path = sparse_gguf(tmp_path / "k.gguf", b"", 1 << 40, n_kv=1 << 32)
    message, peak = refused(path)
    assert f"claims {1 << 32} metadata keys and 0 tensors" in message and peak < BOUND
    path = sparse_gguf(tmp_path / "t.gguf", b"", 1 << 40, n_kv=0, n_tensors=1 << 30)
    message, _ = refused(path)
    assert f"0 metadata keys and {1 << 30} tensors" in message


def test_a_small_real_header_is_unaffected(tmp_path):
    head = (_key("deepseek4.block_count") + struct.pack("<II", UINT32, 43)
            + _key("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2)
            + _key("ab") + _key("c"))
    path = tmp_path / "ok.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + head)
    with GGUFFile.open(path) as gf:
        assert gf.metadata["deepseek4.block_count"] == 43
        assert list(gf.metadata["tokenizer.ggml.tokens"]) == ["ab", "c"]
