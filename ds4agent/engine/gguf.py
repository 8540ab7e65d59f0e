"""GGUF v3 reading, memory-mapped and lazy (model.md §6.1).

`GGUFFile.open(path)` parses only the header, the metadata and the tensor directory; tensor bytes
stay in the page cache until someone asks for them (an 81 GB file opens in milliseconds and costs
no resident memory for tensors never touched). The public surface is deliberately small:

    gf = GGUFFile.open(path)                  # or `with open_gguf(path) as gf:`
    gf.metadata["deepseek4.block_count"]      # plain Python values; numeric arrays as lists
    gf.value_types["deepseek4.block_count"]   # ValueType.UINT32 (arrays: ValueType.ARRAY)
    gf.array_types[key]                       # element ValueType of an array value
    gf.tensors["output.weight"]               # TensorInfo(name, ggml_type, dims, shape, offset, nbytes)
    gf.raw("output.weight")                   # zero-copy uint8 view of the tensor's bytes
    gf.numpy("output_norm.weight")            # zero-copy typed view (F32/F16/I32/... plain types)
    gf.load("output_norm.weight", shape=(64,), types=("F32",))   -> mx.array, validated
    quant.load_q8_0(gf, "output.weight", shape=(V, E))  -> (wq, scales, biases) for mx.quantized_matmul

Shapes: GGML lists dims ne0-first (`TensorInfo.dims`); `TensorInfo.shape` is the row-major array
shape (reversed dims), which is what every validation and every array here uses.

We read the container ourselves (not with `gguf.GGUFReader`) because the reader builds numpy
views of every field and tensor up front; ours touches only the bytes it parses, and string
arrays (the 129,280 tokenizer entries) are decoded on first access.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .errors import MissingTensorError, ModelFileError, TensorShapeError, TensorTypeError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Bounds on what the header may claim, checked before anything is looped over or allocated. The
# file's size alone bounds nothing real: a sparse file of a few KiB on disk can be a terabyte
# long, and every "fits in the file" check passes while a 67M-entry array asks for gigabytes of
# Python objects and minutes of parsing. Each bound is far beyond any real model (DeepSeek V4
# Flash: ~50 keys, ~1,300 tensors, a 129,280-token vocabulary, ~5 MB of metadata and directory).
MAX_HEADER_BYTES = 64 << 20  # the metadata and the tensor directory together
MAX_METADATA_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_ARRAY_ITEMS = 1 << 22  # all metadata array elements together (a string array's included)


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Scalar value types: struct format and size (all little-endian).
_SCALAR: dict[int, tuple[str, int]] = {
    ValueType.UINT8: ("<B", 1), ValueType.INT8: ("<b", 1), ValueType.UINT16: ("<H", 2),
    ValueType.INT16: ("<h", 2), ValueType.UINT32: ("<I", 4), ValueType.INT32: ("<i", 4),
    ValueType.FLOAT32: ("<f", 4), ValueType.BOOL: ("<?", 1), ValueType.UINT64: ("<Q", 8),
    ValueType.INT64: ("<q", 8), ValueType.FLOAT64: ("<d", 8),
}
_NUMPY_SCALAR: dict[int, str] = {
    ValueType.UINT8: "<u1", ValueType.INT8: "<i1", ValueType.UINT16: "<u2", ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4", ValueType.INT32: "<i4", ValueType.FLOAT32: "<f4", ValueType.BOOL: "<u1",
    ValueType.UINT64: "<u8", ValueType.INT64: "<i8", ValueType.FLOAT64: "<f8",
}

class GGMLType(NamedTuple):
    name: str
    block: int  # weights per block (1 for the plain types)
    nbytes: int  # bytes per block


# GGML tensor types: id -> (name, elements per block, bytes per block). The ids and block sizes
# are ggml's; a type outside this table cannot be sized, so the file is refused at open. The one
# block table: quant.py, the directory check, the memory plan and the test-model writers read it.
_TABLE: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 39: ("MXFP4", 32, 17),
}
GGML_TYPES: dict[int, GGMLType] = {tid: GGMLType(*row) for tid, row in _TABLE.items()}
GGML_TYPE_IDS: dict[str, int] = {t.name: tid for tid, t in GGML_TYPES.items()}


def block_of(type_name: str) -> GGMLType:
    """The block layout of a GGML type by name ("Q8_0", "F16", ...)."""
    return GGML_TYPES[GGML_TYPE_IDS[type_name]]

# Plain (one element per block) types that `numpy()` can view directly.
_PLAIN_DTYPES: dict[str, str] = {
    "F32": "<f4", "F16": "<f2", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8",
}



@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # GGML order, ne0 (contiguous) first
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major array shape: the GGML dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


class LazyStrings(Sequence[str]):
    """A GGUF string array decoded on first access (tokenizer vocabularies are 100k+ entries)."""

    def __init__(self, buf: memoryview, offsets: np.ndarray, lengths: np.ndarray):
        self._buf = buf
        self._offsets = offsets
        self._lengths = lengths
        self._decoded: list[str] | None = None

    def __len__(self) -> int:
        return len(self._offsets)

    def _all(self) -> list[str]:
        if self._decoded is None:
            buf = self._buf
            self._decoded = [
                bytes(buf[o : o + n]).decode("utf-8", errors="replace")
                for o, n in zip(self._offsets.tolist(), self._lengths.tolist(), strict=True)
            ]
        return self._decoded

    def __getitem__(self, i):
        return self._all()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"LazyStrings(<{len(self)} strings>)"


class _Cursor:
    """Bounds-checked little-endian parser over the mapped file's header (errors name what was
    cut). Every read is bounded by the end of the file and by MAX_HEADER_BYTES, so no length the
    file claims (a string's, an array's) can make the parser copy or walk more than that."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path
        self.items_left = MAX_ARRAY_ITEMS

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF file (while reading {what})")
        if self.pos + n > MAX_HEADER_BYTES:
            raise ModelFileError(f"{self.path}: GGUF header too large (while reading {what}: its metadata "
                                 f"and tensor directory would exceed {MAX_HEADER_BYTES >> 20} MiB)")

    def take_items(self, count: int, what: str) -> None:
        """Account for `count` array elements before they are parsed or allocated."""
        if count > self.items_left:
            raise ModelFileError(f"{self.path}: GGUF metadata array {what} has {count} elements, more than "
                                 f"the {MAX_ARRAY_ITEMS} all arrays together may hold")
        self.items_left -= count

    def unpack(self, fmt: str, size: int, what: str):
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.unpack("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")


class GGUFFile:
    """An open, memory-mapped GGUF v3 file. Keep it alive while views from `raw()` are in use."""

    def __init__(self, path: Path, mm: mmap.mmap | None, buf: memoryview):
        self.path = path
        self._mm = mm
        self._buf = buf
        self.version = 0
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, ValueType] = {}
        self.array_types: dict[str, ValueType] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.file_size = len(buf)

    # ---------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GGUFFile:
        path = Path(path)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < 24:
                    raise ModelFileError(f"{path}: not a GGUF file (only {size} bytes)")
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as err:
            raise ModelFileError(f"cannot open model file {path}: {err.strerror or err}") from None
        gf = cls(path, mm, memoryview(mm))
        try:
            gf._parse()
        except BaseException:
            gf.close()
            raise
        return gf

    def _parse(self) -> None:
        cur = _Cursor(self._buf, self.path)
        cur.need(4, "magic")
        if bytes(self._buf[0:4]) != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (bad magic)")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version != 3:
            raise ModelFileError(f"{self.path}: GGUF version {self.version} is not supported (need 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # Each metadata entry takes at least 12 bytes, each tensor info at least 28: refuse absurd
        # counts before looping over them (a corrupt header must not spin for hours).
        if n_kv * 12 + n_tensors * 28 > self.file_size:
            raise ModelFileError(f"{self.path}: truncated GGUF file (header counts exceed the file)")
        if n_kv > MAX_METADATA_KEYS or n_tensors > MAX_TENSORS:
            raise ModelFileError(f"{self.path}: GGUF header claims {n_kv} metadata keys and {n_tensors} tensors "
                                 f"(at most {MAX_METADATA_KEYS} and {MAX_TENSORS})")
        for _ in range(n_kv):
            key = cur.string("metadata key")
            vtype = cur.u32(f"type of {key!r}")
            self.metadata[key] = self._read_value(cur, vtype, key)
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ModelFileError(f"{self.path}: general.alignment {align!r} is not a power of two")
        self.alignment = align

        infos: list[tuple[str, int, tuple[int, ...], int]] = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.u32(f"dims of tensor {name!r}")
            if not 1 <= n_dims <= 8:
                raise ModelFileError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            cur.need(8 * n_dims, f"dims of tensor {name!r}")
            dims = struct.unpack_from(f"<{n_dims}Q", self._buf, cur.pos)
            cur.pos += 8 * n_dims
            ttype = cur.u32(f"type of tensor {name!r}")
            rel = cur.u64(f"offset of tensor {name!r}")
            infos.append((name, ttype, tuple(int(d) for d in dims), rel))
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment

        for name, ttype, dims, rel in infos:
            if ttype not in GGML_TYPES:
                raise ModelFileError(f"{self.path}: tensor {name!r} has unknown GGML type {ttype}")
            tname, block, bsize = GGML_TYPES[ttype]
            if dims[0] % block:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} ({tname}) row length {dims[0]} is not a "
                    f"multiple of its block size {block}"
                )
            n = 1
            for d in dims:
                n *= d
            nbytes = n // block * bsize
            start = self.data_offset + rel
            if rel % self.alignment:
                raise ModelFileError(f"{self.path}: tensor {name!r} is not aligned to {self.alignment}")
            if start + nbytes > self.file_size:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} extends past the end of the file (truncated?)"
                )
            if name in self.tensors:
                raise ModelFileError(f"{self.path}: tensor {name!r} appears twice")
            self.tensors[name] = TensorInfo(name, ttype, dims, start, nbytes)

    def _value_type(self, code: int, what: str) -> ValueType:
        try:
            return ValueType(code)
        except ValueError:
            raise ModelFileError(f"{self.path}: {what} {code}") from None

    def _read_value(self, cur: _Cursor, vtype: int, key: str) -> Any:
        vt = self._value_type(vtype, f"metadata {key!r} has unknown value type")
        self.value_types[key] = vt
        if vt == ValueType.STRING:
            return cur.string(key)
        if vt != ValueType.ARRAY:
            fmt, size = _SCALAR[vt]
            return cur.unpack(fmt, size, key)
        etype = cur.u32(f"element type of {key!r}")
        count = cur.u64(f"length of {key!r}")
        et = self._value_type(etype, f"array {key!r} has unknown element type")
        self.array_types[key] = et
        if et == ValueType.STRING:
            return self._read_string_array(cur, count, key)
        if et == ValueType.ARRAY:
            raise ModelFileError(f"{self.path}: nested array {key!r} is not supported")
        size = _SCALAR[et][1]
        cur.need(count * size, key)
        cur.take_items(count, repr(key))
        arr = np.frombuffer(self._buf, dtype=_NUMPY_SCALAR[et], count=count, offset=cur.pos)
        cur.pos += count * size
        if et == ValueType.BOOL:
            return [bool(v) for v in arr.tolist()]
        return arr.tolist()

    def _read_string_array(self, cur: _Cursor, count: int, key: str) -> LazyStrings:
        # Walk the length prefixes only; decoding waits until someone reads the strings.
        cur.need(count * 8, key)  # each string takes at least its 8-byte length
        cur.take_items(count, repr(key))
        offsets = np.empty(count, dtype=np.int64)
        lengths = np.empty(count, dtype=np.int64)
        buf, pos, end = self._buf, cur.pos, min(len(self._buf), MAX_HEADER_BYTES)
        unpack = struct.Struct("<Q").unpack_from
        for i in range(count):
            if pos + 8 > end:
                cur.pos = pos
                cur.need(8, key)  # raises: truncated, or past the header bound
            (n,) = unpack(buf, pos)
            pos += 8
            if n > end - pos:  # checked before storing: a corrupt length may exceed int64
                cur.pos = pos
                cur.need(n, key)
            offsets[i] = pos
            lengths[i] = n
            pos += n
        cur.pos = pos
        return LazyStrings(buf, offsets, lengths)

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Release the mapping. Views handed out keep it alive until they are gone."""
        # Lazy string arrays read from the mapping: decode them now so metadata stays usable.
        for value in self.metadata.values():
            if isinstance(value, LazyStrings):
                value._all()
        buf, self._buf = self._buf, memoryview(b"")
        mm, self._mm = self._mm, None
        try:
            buf.release()
        except BufferError:
            return  # exported views still reference it; the GC unmaps later
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- tensors
    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(name, str(self.path)) from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping (no copy, no read)."""
        ti = self.info(name)
        if self._mm is None:
            raise ModelFileError(f"{self.path}: the model file is closed (reading {name!r})")
        return np.frombuffer(self._mm, dtype=np.uint8, count=ti.nbytes, offset=ti.offset)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process's resident set (madvise MADV_DONTNEED).

        Why: reading a tensor through the mapping makes its file pages part of our RSS, and a
        loader that converts every tensor into MLX memory would otherwise hold each weight twice
        (the converted copy plus the mapped file pages: 21.6 GB for an 8.2 GiB Flash non-expert
        set). On a read-only file mapping DONTNEED only unmaps: the page cache keeps the data, a
        later read faults it back in, so this is never a correctness question, only memory.
        Ranges are widened to whole pages; neighbouring tensors that share a page just refault.
        """
        ti = self.info(name)
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED") or ti.nbytes == 0:
            return
        page = mmap.PAGESIZE
        start = ti.offset // page * page
        end = min(self.file_size, -(-(ti.offset + ti.nbytes) // page) * page)
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            pass  # advisory only (e.g. a platform that refuses it): memory, not correctness

    def numpy(self, name: str) -> np.ndarray:
        """A zero-copy typed view with the row-major shape, for plain (unquantised) types."""
        ti = self.info(name)
        dt = _PLAIN_DTYPES.get(ti.type_name)
        if dt is None:
            raise TensorTypeError(name, ti.type_name, tuple(_PLAIN_DTYPES))
        return self.raw(name).view(dt).reshape(ti.shape)

    def check(self, name: str, *, shape: Sequence[int] | None = None,
              types: Sequence[str] | None = None) -> TensorInfo:
        """Validate a tensor's presence, type and row-major shape; errors name the tensor."""
        ti = self.info(name)
        if types is not None and ti.type_name not in types:
            raise TensorTypeError(name, ti.type_name, tuple(types))
        if shape is not None and tuple(ti.shape) != tuple(int(s) for s in shape):
            raise TensorShapeError(name, tuple(shape), ti.shape)
        return ti

    def load(self, name: str, *, shape: Sequence[int] | None = None,
             types: Sequence[str] = ("F32", "F16", "I32"), dtype=None):
        """Load a plain tensor into an MLX array (F32/F16/I32 values exactly as stored).

        `dtype` converts after loading (e.g. mx.float32 for F16 weights used in f32 math; the
        conversion is exact).
        """
        import mlx.core as mx

        self.check(name, shape=shape, types=types)
        arr = mx.array(self.numpy(name))
        if dtype is not None and arr.dtype != dtype:
            arr = arr.astype(dtype)
        return arr


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile.open(path)
