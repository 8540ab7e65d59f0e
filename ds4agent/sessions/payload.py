"""DSV4 session payload <-> PayloadState (plain numpy arrays + shape header).

CONTRACT between the engine and the session store (see docs/kvc-format.md §9 and
architecture.md). The engine never imports this module: it produces and consumes objects that
have exactly these attribute names (duck typing), so `engine` and `sessions` stay independent and
the agent connects them.

Public API:
    PayloadShape, LayerPayload, PayloadState      the contract dataclasses (fields fixed)
    FLASH_SHAPE                                    DeepSeek V4 Flash (43 layers, D 512, Di 128, V 129280)
    as_shape(obj) -> PayloadShape                  from any object with PayloadShape's attribute names
    blank_state(shape, T, ctx) -> PayloadState     zero arrays of the right shapes, canonical filler
    PayloadHeader                                  the 13 u32 of §9.1 (pack / unpack / for_state)
    payload_size(shape, T, ctx) -> int             exact payload length (§9.6 on Flash)
    validate_state(state, shape) -> int            raises KVCPayloadError; returns T
    write_payload(f, state, shape) -> int          streams the payload, returns bytes written
    read_payload(f, payload_bytes, shape, ctx, ...) -> PayloadState | PayloadInfo   (§9.5 chain)

Streaming: the writer hands each array's own buffer to the file (no staging copy of the payload);
the reader allocates each array only after its byte size was checked against the payload bytes not
yet consumed, then fills it with readinto. Nothing is memory-mapped (ds4 never maps these files,
and a file truncated underneath a mapping would SIGBUS instead of raising).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from ds4agent import statelayout

from .errors import (
    P_CHUNK,
    P_COMP_CAPACITY,
    P_COMP_ROWS,
    P_CONTEXT,
    P_IMPLAUSIBLE,
    P_INDEX_ROWS,
    P_LAYOUT,
    P_LOGITS,
    P_RAW_RING,
    P_READ_FAILED,
    P_TOKEN_ID,
    P_TRAILING,
    P_TRUNCATED,
    P_VERSION,
    KVCPayloadError,
)

PAYLOAD_MAGIC = 0x34565344  # bytes 44 53 56 34 = "DSV4"
PAYLOAD_VERSION = 2
PAYLOAD_VERSION_S = 1  # in [S] files from earlier ds4 builds; otherwise byte-identical (kvc-format §13)

# Canonical frontier filler (§9.4), as float32 (statelayout says why these values).
FILLER_KV = np.float32(statelayout.FILL_KV)
FILLER_SCORE = np.float32(statelayout.FILL_SCORE)

# Validation without keeping the arrays (kv verify/show) reads tokens and logits in pieces of this
# many items: T and V come from the file, and a sparse file can claim GiBs of them.
_SCAN_ITEMS = 1 << 20

# Limits of a layout read without its model (kv verify/show). A file's size
# bounds nothing real: a sparse file of a few KiB on disk can claim a terabyte, so a count that
# passes every "fits in the bytes left" check may still mean 2^32 layers of Python loops and a
# 32 GiB counts array. Far beyond any model (Flash: 43 layers, D 512, Di 128, V 129280), so no
# real file is refused; every per-layer loop and array then stays small.
MAX_LAYERS = 1024
MAX_HEAD_DIM = 1 << 16
MAX_VOCAB = 1 << 26
MAX_TOKENS = 1 << 24  # 16x Flash's longest context; T < ctx is all a loaded session checks

_PAYLOAD_HEADER = struct.Struct("<13I")
PAYLOAD_HEADER_BYTES = _PAYLOAD_HEADER.size  # 52


@dataclass(frozen=True)
class PayloadShape:
    """The model layout a payload must match (header fields h8..h11 plus per-layer ratios).

    Built by the engine from its ModelConfig (attribute names identical), or by hand in tests.
    """

    n_layers: int  # h8
    head_dim: int  # h9, D (raw/attention rows)
    indexer_dim: int  # h10, Di
    vocab: int  # h11, V
    window: int  # sliding window of the model (128 on Flash); h5 = min(window, ctx)
    ratios: tuple[int, ...]  # compress ratio per layer: 0, 4 (two lanes + indexer) or other (one lane)

    def coff(self, layer: int) -> int:
        """Lanes of the layer's compressor: 2 for ratio 4, 1 for any other non-zero ratio."""
        return statelayout.coff(self.ratios[layer])

    # --- helpers around the fixed fields -------------------------------------------------------

    @property
    def layout_key(self) -> tuple[int, int, int, int]:
        """(h8, h9, h10, h11): what the payload header records of the layout."""
        return (self.n_layers, self.head_dim, self.indexer_dim, self.vocab)

    @property
    def min_ratio(self) -> int:
        """Smallest non-zero ratio; sizes the compressed capacity h6 (4 on Flash: ctx // 4 + 2)."""
        nonzero = [r for r in self.ratios if r]
        return min(nonzero) if nonzero else 4

    def runtime_fields(self, ctx: int) -> tuple[int, int, int, int]:
        """(h3, h4, h5, h6) that a session of context `ctx` writes and expects (§9.1).

        h4 follows ds4's Metal/CUDA ring size: the window plus one prefill chunk, aligned to 256,
        capped at 8192 and ctx, never below the window rows h5. (The spec's literal 128 is Flash's
        window; tiny shapes use their own window so a window-sized ring always fits.)
        """
        h3 = 4096 if ctx > 4096 else ctx
        h5 = min(self.window, ctx)
        h4 = _align_up(min(self.window + h3, ctx), 256)
        h4 = max(min(h4, 8192, ctx), h5)
        h6 = ctx // self.min_ratio + 2
        return h3, h4, h5, h6

    def layer_capacity(self, layer: int, ctx: int) -> int:
        """Compressed rows a layer can hold at context `ctx` (0 on dense layers), §9.5."""
        r = self.ratios[layer]
        return ctx // r + 2 if r else 0

    def layer_arrays(self, layer: int, n_tokens: int, raw_rows: int) -> list[tuple[str, int, int]]:
        """(LayerPayload field, rows, columns) of one layer, in the on-disk order of §9.3.

        The layout is ds4agent/statelayout.py's, the one the engine's LayerState holds in memory:
        this room may not import the engine (nor the engine this room), and reading a file must
        not need a loaded model, so both derive it from that ground-floor module."""
        return statelayout.layer_arrays(self.ratios[layer], self.head_dim, self.indexer_dim, n_tokens,
                                        raw_rows)


def as_shape(shape: object) -> PayloadShape:
    """A PayloadShape from any object with its attribute names (the engine hands out its own
    duck-typed class because it may not import sessions); PayloadShape instances pass through."""
    if isinstance(shape, PayloadShape):
        return shape
    try:
        return PayloadShape(n_layers=int(shape.n_layers), head_dim=int(shape.head_dim),
                            indexer_dim=int(shape.indexer_dim), vocab=int(shape.vocab),
                            window=int(shape.window), ratios=tuple(int(r) for r in shape.ratios))
    except (AttributeError, TypeError, ValueError) as err:
        raise TypeError(f"not a payload shape: {shape!r}") from err


FLASH_SHAPE = PayloadShape(
    n_layers=43,
    head_dim=512,
    indexer_dim=128,
    vocab=129280,
    window=128,
    ratios=tuple(0 if layer < 2 else (4 if layer % 2 == 0 else 128) for layer in range(43)),
)


@dataclass
class LayerPayload:
    """One layer's state, all float32, all row-major 2-D arrays.

    raw:          [R, D]  last R = min(T, window) raw rows in LOGICAL order (positions T-R .. T-1)
    comp:         [T // ratio, D] compressed rows (None on dense layers, ratio 0)
    attn_kv:      [coff*ratio, coff*D] compressor frontier projections (None on dense layers)
    attn_score:   [coff*ratio, coff*D] compressor frontier scores, APE added (None on dense)
    index_comp:   [T // 4, Di] indexer rows (ratio-4 layers only, else None)
    index_kv:     [coff*ratio, coff*Di] indexer compressor frontier (ratio-4 only)
    index_score:  [coff*ratio, coff*Di]
    Frontier rows outside the current partial window hold the canonical filler (kv 0.0,
    score -1e30), kvc-format.md §9.4.
    """

    raw: np.ndarray
    comp: np.ndarray | None = None
    attn_kv: np.ndarray | None = None
    attn_score: np.ndarray | None = None
    index_comp: np.ndarray | None = None
    index_kv: np.ndarray | None = None
    index_score: np.ndarray | None = None


@dataclass
class PayloadState:
    """Everything needed to resume after T tokens (model.md §8), as the payload stores it.

    tokens: uint32 [T]; logits: float32 [V] (logits after token T-1); layers: one LayerPayload per
    layer. ctx is the session context the header records (h2); the other header fields derive from
    ctx and the shape (kvc-format.md §9.1) and are computed by the writer.
    """

    ctx: int
    tokens: np.ndarray
    logits: np.ndarray
    layers: list[LayerPayload]


# ------------------------------------------------------------------------------------------------
# payload header (§9.1)


@dataclass(frozen=True)
class PayloadHeader:
    """The 13 u32 at the start of every payload (h0..h12 of §9.1)."""

    magic: int  # h0
    version: int  # h1
    ctx: int  # h2 saved ctx
    chunk: int  # h3 prefill chunk cap
    raw_capacity: int  # h4 raw ring capacity
    window: int  # h5 raw sliding window
    comp_capacity: int  # h6 compressed capacity
    n_tokens: int  # h7 T
    n_layers: int  # h8
    head_dim: int  # h9
    indexer_dim: int  # h10
    vocab: int  # h11
    raw_rows: int  # h12 R

    def pack(self) -> bytes:
        return _PAYLOAD_HEADER.pack(*(getattr(self, f) for f in self.__dataclass_fields__))

    @classmethod
    def unpack(cls, data: bytes) -> PayloadHeader:
        return cls(*_PAYLOAD_HEADER.unpack(data))

    @classmethod
    def for_state(cls, shape: PayloadShape, ctx: int, n_tokens: int) -> PayloadHeader:
        h3, h4, h5, h6 = shape.runtime_fields(ctx)
        return cls(PAYLOAD_MAGIC, PAYLOAD_VERSION, ctx, h3, h4, h5, h6, n_tokens,
                   shape.n_layers, shape.head_dim, shape.indexer_dim, shape.vocab, min(n_tokens, h5))

    @property
    def layout_key(self) -> tuple[int, int, int, int]:
        return (self.n_layers, self.head_dim, self.indexer_dim, self.vocab)


@dataclass
class PayloadInfo:
    """What a validation pass without array data learnt (kv show / kv verify).

    layers_checked is False when the per-layer ratios were unknown (a non-Flash layout read
    without its model), so only the ratio-free checks ran: see read_payload(shape=None).
    """

    header: PayloadHeader
    n_comp: np.ndarray
    n_index_comp: np.ndarray
    layers_checked: bool


def read_tokens(f: BinaryIO, offset: int, n_tokens: int) -> np.ndarray:
    """The token list of the payload at `offset` (right after its header): n_tokens uint32, read
    alone (a strip compares them with its text without reading the arrays)."""
    f.seek(offset + PAYLOAD_HEADER_BYTES)
    data = f.read(4 * n_tokens)
    if len(data) != 4 * n_tokens:
        raise _refuse("the file ends inside the token list")
    return np.frombuffer(data, dtype="<u4").astype(np.int64)


def _align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def payload_size(shape: PayloadShape, n_tokens: int, ctx: int) -> int:
    """Exact payload length for T tokens at context ctx (§9.6 for FLASH_SHAPE)."""
    shape = as_shape(shape)
    raw_rows = min(n_tokens, shape.runtime_fields(ctx)[2])
    size = PAYLOAD_HEADER_BYTES + 4 * n_tokens + 4 * shape.vocab + 8 * shape.n_layers
    for layer in range(shape.n_layers):
        size += 4 * sum(rows * cols for _, rows, cols in shape.layer_arrays(layer, n_tokens, raw_rows))
    return size


# ------------------------------------------------------------------------------------------------
# writer


def _refuse(detail: str) -> KVCPayloadError:
    return KVCPayloadError(f"cannot save KV state: {detail}")


def validate_state(state: PayloadState, shape: PayloadShape) -> int:
    """Check that `state` matches `shape` exactly, so the written file loads; returns T.

    Runs before any file is created (kvc-format.md §6.1 step 1: compute everything first).
    """
    shape = as_shape(shape)
    tokens = np.asarray(state.tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise _refuse("the token list is empty" if tokens.size == 0 else "tokens must be a 1-D array")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise _refuse("token ids must be integers")
    if int(tokens.min()) < 0 or int(tokens.max()) >= shape.vocab:
        raise _refuse(f"a token id is outside the vocabulary (0..{shape.vocab - 1})")
    n_tokens = int(tokens.size)
    if not isinstance(state.ctx, int | np.integer) or not (0 < state.ctx <= 0xFFFFFFFF) or n_tokens > state.ctx:
        raise _refuse(f"context {state.ctx} cannot hold {n_tokens} tokens")
    logits = np.asarray(state.logits)
    if logits.shape != (shape.vocab,):
        raise _refuse(f"logits have shape {logits.shape}, expected ({shape.vocab},)")
    if not np.isfinite(logits).all():
        raise _refuse("the logits are not all finite")
    if len(state.layers) != shape.n_layers:
        raise _refuse(f"{len(state.layers)} layers, the model has {shape.n_layers}")
    raw_rows = min(n_tokens, shape.runtime_fields(state.ctx)[2])
    for layer, lp in enumerate(state.layers):
        expected = {name: (rows, cols) for name, rows, cols in shape.layer_arrays(layer, n_tokens, raw_rows)}
        for name in LayerPayload.__dataclass_fields__:
            arr = getattr(lp, name)
            if name not in expected:
                if arr is not None:
                    raise _refuse(f"layer {layer} (ratio {shape.ratios[layer]}) has an unexpected {name} array")
                continue
            if arr is None or np.shape(arr) != expected[name]:
                got = None if arr is None else np.shape(arr)
                raise _refuse(f"layer {layer} {name} has shape {got}, expected {expected[name]}")
    return n_tokens


def _write_array(f: BinaryIO, arr: np.ndarray, dtype: str) -> int:
    # No copy when the array already is C-contiguous little-endian of the right type (the normal
    # case): the file receives the array's own buffer.
    arr = np.ascontiguousarray(arr, dtype=dtype)
    if arr.nbytes:
        f.write(memoryview(arr).cast("B"))
    return arr.nbytes


def _canonical_frontier(arr: np.ndarray, filler: np.float32, live_rows: slice) -> np.ndarray:
    """The frontier with every row outside `live_rows` set to the canonical filler (§9.4).

    Frontier arrays are small (at most 2*4 x 2*D or 128 x D floats), so the rare copy is cheap.
    """
    dead = np.ones(arr.shape[0], dtype=bool)
    dead[live_rows] = False
    if not dead.any() or np.all(arr[dead] == filler):
        return arr
    fixed = np.array(arr, dtype=np.float32, copy=True)
    fixed[dead] = filler
    return fixed


def _live_frontier_rows(ratio: int, coff: int, n_tokens: int) -> slice:
    # ratio 4 (two lanes): rows 0..3 are the previous complete group, rows 4..4+T%4-1 the current
    # partial group. One lane: rows 0..T%r-1 are the partial window.
    return slice(0, ratio * (coff - 1) + n_tokens % ratio)


def write_payload(f: BinaryIO, state: PayloadState, shape: PayloadShape) -> int:
    """Stream `state` as a DSV4 payload into `f`; returns the bytes written (== payload_size)."""
    shape = as_shape(shape)
    n_tokens = validate_state(state, shape)
    header = PayloadHeader.for_state(shape, int(state.ctx), n_tokens)
    f.write(header.pack())
    written = PAYLOAD_HEADER_BYTES
    written += _write_array(f, state.tokens, "<u4")
    written += _write_array(f, state.logits, "<f4")
    n_comp = [n_tokens // r if r else 0 for r in shape.ratios]
    n_index = [n if r == 4 else 0 for n, r in zip(n_comp, shape.ratios, strict=True)]
    written += _write_array(f, np.array(n_comp + n_index), "<u4")
    for layer, lp in enumerate(state.layers):
        ratio, coff = shape.ratios[layer], shape.coff(layer)
        for name, _, _ in shape.layer_arrays(layer, n_tokens, header.raw_rows):
            arr = getattr(lp, name)
            if name in ("attn_kv", "index_kv", "attn_score", "index_score"):
                filler = FILLER_KV if name.endswith("_kv") else FILLER_SCORE
                arr = _canonical_frontier(np.asarray(arr), filler, _live_frontier_rows(ratio, coff, n_tokens))
            written += _write_array(f, arr, "<f4")
    return written


# ------------------------------------------------------------------------------------------------
# reader (§9.5)


class _PayloadCursor:
    """Reads from the payload region, checking every size against the bytes not yet consumed."""

    def __init__(self, f: BinaryIO, payload_bytes: int) -> None:
        self.f = f
        self.left = payload_bytes

    def _reserve(self, nbytes: int) -> None:
        if nbytes > self.left:
            raise KVCPayloadError(P_TRUNCATED)
        self.left -= nbytes

    def read_bytes(self, nbytes: int) -> bytes:
        return self.read_array("<u1", (nbytes,)).tobytes()

    def read_array(self, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = np.dtype(dtype).itemsize
        for dim in shape:
            nbytes *= dim
        self._reserve(nbytes)  # before np.empty: a tampered count never allocates beyond the file
        arr = np.empty(shape, dtype=dtype)
        view = memoryview(arr).cast("B") if nbytes else memoryview(b"")
        done = 0
        while done < nbytes:
            try:
                got = self.f.readinto(view[done:])
            except OSError as err:
                raise KVCPayloadError(P_READ_FAILED) from err
            if not got:
                raise KVCPayloadError(P_READ_FAILED)
            done += got
        # Native float32/uint32 arrays for the engine; a no-op on little-endian hosts.
        return arr.astype(dtype[1:], copy=False)

    def scan(self, dtype: str, count: int):
        """The next `count` items as arrays of at most _SCAN_ITEMS (validation without holding them
        all); a shortfall is found before anything is read, as read_array would."""
        if count * np.dtype(dtype).itemsize > self.left:
            raise KVCPayloadError(P_TRUNCATED)
        done = 0
        while done < count:
            n = min(count - done, _SCAN_ITEMS)
            yield self.read_array(dtype, (n,))
            done += n

    def skip(self, nbytes: int) -> None:
        self._reserve(nbytes)
        try:
            self.f.seek(nbytes, 1)
        except OSError as err:
            raise KVCPayloadError(P_READ_FAILED) from err


def _check_plausible(hdr: PayloadHeader) -> None:
    """Refuse a layout beyond any model's before its counts size a loop or an array."""
    for what, value, limit in (("layers", hdr.n_layers, MAX_LAYERS), ("head dimension", hdr.head_dim, MAX_HEAD_DIM),
                               ("indexer dimension", hdr.indexer_dim, MAX_HEAD_DIM),
                               ("vocabulary", hdr.vocab, MAX_VOCAB), ("tokens", hdr.n_tokens, MAX_TOKENS)):
        if value > limit:
            raise KVCPayloadError(f"{P_IMPLAUSIBLE} ({value} {what}, at most {limit})")


def read_payload(
    f: BinaryIO,
    payload_bytes: int,
    shape: PayloadShape | None,
    ctx: int,
    *,
    keep_arrays: bool = True,
    check_chunk: bool = False,
    version: int = PAYLOAD_VERSION,
) -> PayloadState | PayloadInfo:
    """Validate and read a payload of `payload_bytes` from `f` (positioned at its start), §9.5.

    shape/ctx are the running model's layout and context ("current values"); a stand-alone
    validator passes the header's ctx_size. Returns a PayloadState, or with keep_arrays=False a
    PayloadInfo (array data is size-checked and skipped, not read). Nothing is committed anywhere:
    the caller gets a complete state or a KVCPayloadError.

    version: the payload version the file's header layout carries (2, or 1 in an [S] file, §13).

    check_chunk: compare h3 with the current prefill cap. Off by default: ds4agent's engine is
    chunk-invariant (model.md §9), so a file from a build with another chunk size loads exactly;
    the h5 half of step 5 is always checked because the raw window layout depends on it.

    shape=None (stand-alone validation of a non-Flash layout, whose per-layer ratios the file does
    not record): the layout comes from the file itself; steps 4, 5 and the ratio-dependent parts of
    7/9 are skipped, counts are checked against h6 and T, and the array region must be at least
    as large as the raw/compressed/indexer rows the counts imply. keep_arrays must be False then.

    One long function on purpose: it is the format's validation steps in their numbered order (each
    marked `# step N`), and a check split away from its neighbours would hide which step rejects.
    """
    shape = as_shape(shape) if shape is not None else None
    cur = _PayloadCursor(f, payload_bytes)
    if payload_bytes < PAYLOAD_HEADER_BYTES:  # step 1
        raise KVCPayloadError(P_TRUNCATED)
    hdr = PayloadHeader.unpack(cur.read_bytes(PAYLOAD_HEADER_BYTES))
    if hdr.magic != PAYLOAD_MAGIC or hdr.version != version:  # step 2
        raise KVCPayloadError(P_VERSION)
    if hdr.ctx > ctx or hdr.n_tokens >= ctx:  # step 3
        raise KVCPayloadError(P_CONTEXT)
    if shape is not None:
        if hdr.layout_key != shape.layout_key:  # step 4
            raise KVCPayloadError(P_LAYOUT)
        cur_h3, cur_h4, cur_h5, cur_h6 = shape.runtime_fields(ctx)
        if hdr.window != cur_h5 or (check_chunk and hdr.chunk != cur_h3):  # step 5
            raise KVCPayloadError(P_CHUNK)
    else:
        if keep_arrays:
            raise ValueError("read_payload(shape=None) can only validate (keep_arrays=False)")
        cur_h4 = cur_h6 = None
    if not keep_arrays:
        # A stand-alone validation: ctx is the file's own and the shape maybe too, so nothing
        # live bounds the counts the scan below walks through.
        _check_plausible(hdr)
    if (hdr.raw_capacity == 0 or hdr.raw_rows != min(hdr.n_tokens, hdr.window)  # step 6
            or hdr.raw_rows > hdr.raw_capacity or (cur_h4 is not None and hdr.raw_rows > cur_h4)):
        raise KVCPayloadError(P_RAW_RING)
    if cur_h6 is not None and hdr.comp_capacity > cur_h6:  # step 7
        raise KVCPayloadError(P_COMP_CAPACITY)

    T, V, L = hdr.n_tokens, hdr.vocab, hdr.n_layers
    if keep_arrays:  # step 8
        tokens = cur.read_array("<u4", (T,))
        logits = cur.read_array("<f4", (V,))
        bad_token = T > 0 and int(tokens.max()) >= V
        bad_logit = not np.isfinite(logits).all()
    else:
        # Checked piecewise and dropped: every piece is read (no early exit) so the cursor ends
        # where the counts start, and the errors keep their order (token ids, then logits).
        bad_token = bad_logit = False
        for piece in cur.scan("<u4", T):
            bad_token |= int(piece.max()) >= V
        for piece in cur.scan("<f4", V):
            bad_logit |= not np.isfinite(piece).all()
    if bad_token:
        raise KVCPayloadError(P_TOKEN_ID)
    if bad_logit:
        raise KVCPayloadError(P_LOGITS)
    counts = cur.read_array("<u4", (2 * L,)).astype(np.int64)
    n_comp, n_index = counts[:L], counts[L:]

    def expect_comp(layer: int) -> int:
        r = shape.ratios[layer]
        return T // r if r else 0

    for layer in range(L):  # step 9: every n_comp first, then every n_index_comp
        n = int(n_comp[layer])
        if shape is None:
            ok = n <= hdr.comp_capacity and n <= T
        else:
            ok = n <= hdr.comp_capacity and n <= shape.layer_capacity(layer, ctx) and n == expect_comp(layer)
        if not ok:
            raise KVCPayloadError(P_COMP_ROWS)
    for layer in range(L):
        n = int(n_index[layer])
        if shape is None:
            ok = n <= hdr.comp_capacity and n in (0, int(n_comp[layer]))
        else:
            want = int(n_comp[layer]) if shape.ratios[layer] == 4 else 0
            ok = n <= hdr.comp_capacity and n <= shape.layer_capacity(layer, ctx) and n == want
        if not ok:
            raise KVCPayloadError(P_INDEX_ROWS)

    if shape is None:
        # Lower bound of the array region: raw rows on every layer plus the counted compressed
        # and indexer rows (frontier sizes depend on the unknown ratios, so they are not counted).
        floor = 4 * (L * hdr.raw_rows * hdr.head_dim + int(n_comp.sum()) * hdr.head_dim
                     + int(n_index.sum()) * hdr.indexer_dim)
        if floor > cur.left:
            raise KVCPayloadError(P_TRUNCATED)
        return PayloadInfo(hdr, n_comp, n_index, layers_checked=False)

    layers: list[LayerPayload] = []
    for layer in range(L):  # step 10
        arrays = {}
        for name, rows, cols in shape.layer_arrays(layer, T, hdr.raw_rows):
            if keep_arrays:
                arrays[name] = cur.read_array("<f4", (rows, cols))
            else:
                cur.skip(4 * rows * cols)
        if keep_arrays:
            layers.append(LayerPayload(**arrays))
    if cur.left:  # step 11
        raise KVCPayloadError(P_TRAILING)
    if not keep_arrays:
        return PayloadInfo(hdr, n_comp, n_index, layers_checked=True)
    return PayloadState(ctx=hdr.ctx, tokens=tokens, logits=logits, layers=layers)


def blank_state(shape: PayloadShape, n_tokens: int, ctx: int) -> PayloadState:
    """A state of the right shapes for T tokens: zero tokens/logits/rows, canonical frontier filler.

    For tests, benchmarks and engines that fill arrays in place (e.g. before a readinto).
    """
    shape = as_shape(shape)
    raw_rows = min(n_tokens, shape.runtime_fields(ctx)[2])
    layers = []
    for layer in range(shape.n_layers):
        arrays = {}
        for name, rows, cols in shape.layer_arrays(layer, n_tokens, raw_rows):
            fill = FILLER_SCORE if name.endswith("_score") else FILLER_KV
            arrays[name] = np.full((rows, cols), fill, dtype=np.float32)
        layers.append(LayerPayload(**arrays))
    return PayloadState(ctx=ctx, tokens=np.zeros(n_tokens, dtype=np.uint32),
                        logits=np.zeros(shape.vocab, dtype=np.float32), layers=layers)
