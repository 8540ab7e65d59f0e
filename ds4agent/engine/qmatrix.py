"""The fast CPU kernel set's matrices: quantised activations, integer dot products, every core.

    m = QuantMatrix.from_blocks(raw, ggml_type, rows, cols)   # GGUF bytes (an mmap view is fine)
    m = QuantMatrix.from_dense(w)                              # F16/F32 [rows, cols]
    y = m.matmul(x)                                            # x [n, cols] f32 -> [n, rows] f32
    e = ExpertMatrix.from_blocks(raw, ggml_type, n_experts, rows, cols)
    y = e.matmul(x, ids)                # x [n, cols] or [n, k, cols], ids [n, k] -> [n, k, rows]
    g, u = gate.matmul_pair(up, x, ids)  # two tensors, one activation rounding
    y = routed_ffn(gate, up, down, x, ids, weights, clamp)  # a layer's routed experts -> [n, dim]

A grouped product (attention's output projection A: group g's rows take group g's input) is an
ExpertMatrix with one "expert" per group: matmul(x [n, G, cols], ids = [[0, 1, ..., G-1]] * n).

The exact float32 path (weights.Linear, experts/cpu.py) stays the reference; this is the fast
set. docs/numerics-fast-cpu.md is its contract; in short:
  * activations are rounded per block to 8 bits as ds4's CPU path rounds them (Q8_0-style blocks
    of 32 for Q8_0 and MXFP4 weights, Q8_K-style blocks of 256 for Q2_K, Q4_K and IQ2_XXS), and
    each block product is an exact integer sum scaled by one float multiply (qkernels.py and
    fp4kernels.py have the formulas);
  * deterministic, and independent of the thread count, the row split and the batch: row r of
    token t is computed by the same code in the same order whatever else shares the call, so
    decode equals a one-token prefill bit for bit and a chunked prefill equals an unchunked one
    (chunk invariance holds for the products);
  * F16/F32 matrices are multiplied in float32 (no activation rounding), in a fixed lane order;
  * agreement with the dequantised float32 product: within `activation_error_bound` for every
    output (about 1 % of the largest output with gaussian activations), held by
    tests/engine/test_qmatrix.py on random blocks and on the test models' tensors.
Memory: Q8_0 repacked (34 bytes per 32 weights, as in the file); the other block types (MXFP4
included) used in place from the caller's bytes (the file's map); F16 kept as F16.

Threads: a product's output rows are split into `device.cpu_parts()` contiguous ranges, one per
thread of numba's pool (qkernels' *_split kernels, prange). Small products run as one range
(the result is the same).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ds4agent.engine import device, quant
from ds4agent.engine.errors import EngineError

F32, F16 = 0, 1
BLOCK_TYPES = (quant.Q8_0, quant.Q2_K, quant.Q4_K, quant.IQ2_XXS, quant.MXFP4)
# Multiply-adds below which a product runs as one range: a split costs about a microsecond
# (numba's pool), which a product this small would not win back.
_PARALLEL_MIN_MACS = 1 << 16
# One split product at a time in the process: numba's pool is shared, and its portable layer
# (workqueue, where OpenMP is missing, e.g. macOS without libomp) aborts the process on two
# concurrent launches. Products are milliseconds; two engines in one process take turns.
SPLIT_LOCK = threading.Lock()
_ONE_EXPERT = np.zeros(1, np.int64)  # expert_rows_split's `used` for a plain matrix


class QuantMatrixError(EngineError):
    """A matrix or an input that the fast kernels cannot take (type, shape, dtype)."""


# The kernel modules once imported: a decode step asks for them ~1,800 times, and an import
# statement run again still goes through the import machinery (about a microsecond each).
_LOADED: dict[str, ModuleType] = {}


def _kernels(ggml_type: int) -> ModuleType:
    """The kernel module of a GGML type, imported on first use (numba loads its cached machine
    code then): q8kernels (Q8_0, and the activations' rounding), fp4kernels (MXFP4) or qkernels
    (the K-quants and IQ2_XXS). Each has expert_rows_split with the same signature."""
    name = {quant.Q8_0: "q8kernels", quant.MXFP4: "fp4kernels"}.get(ggml_type, "qkernels")
    try:
        return _LOADED[name]
    except KeyError:
        pass
    if ggml_type == quant.Q8_0:
        from ds4agent.engine import q8kernels

        _LOADED[name] = q8kernels
    elif ggml_type == quant.MXFP4:
        from ds4agent.engine import fp4kernels

        _LOADED[name] = fp4kernels
    else:
        from ds4agent.engine import qkernels

        _LOADED[name] = qkernels
    return _LOADED[name]


def float_kernels() -> ModuleType:
    """fkernels (the float products and host-step loops), imported on first use like qkernels:
    the one loader the engine's modules call."""
    try:
        return _LOADED["fkernels"]
    except KeyError:
        from ds4agent.engine import fkernels

        _LOADED["fkernels"] = fkernels
        return fkernels


@functools.lru_cache(maxsize=1)
def _grid() -> np.ndarray:
    """The IQ2_XXS grid as the kernels read it where they load rows one by one: 256 rows of 8
    magnitudes, one uint64 each."""
    grid, _ = quant.iq2xxs_tables()
    return np.ascontiguousarray(grid.astype(np.uint8).reshape(256, 8)).view(np.uint64).reshape(-1)


def _as_blocks(raw: Any, qtype: int, n_rows: int, cols: int) -> np.ndarray:
    """raw GGUF bytes -> a uint8 [n_rows, row_bytes] view (no copy when raw is contiguous)."""
    if qtype not in BLOCK_TYPES:
        raise QuantMatrixError(f"no fast CPU kernel for {quant.type_name(qtype)}")
    try:
        rb = quant.row_bytes(qtype, cols)
    except quant.QuantError as err:
        raise QuantMatrixError(str(err)) from None
    buf = np.asarray(raw)
    if buf.dtype != np.uint8 or buf.size != n_rows * rb:
        raise QuantMatrixError(f"{quant.type_name(qtype)} data for {n_rows} rows of {cols} must be "
                               f"{n_rows * rb} uint8 bytes, got {buf.size} ({buf.dtype})")
    return np.ascontiguousarray(buf.reshape(n_rows, rb))


def _repack_q8_0(blocks: np.ndarray, n_mats: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rows [n_mats * rows, nb * 34] -> qkernels' interleaved Q8_0 layout per matrix: codes + 128
    as uint8 [n_mats, groups, nb * 512] (groups of 16 rows; a last partial group padded with
    zero weights), the f16 scales as their bits, uint16 [n_mats, groups, nb * 16] (widened to f32 in
    the kernel, exactly: kept at 2 bytes, since a token's Q8_0 products read at the memory's speed
    and f32 scales were a twentieth more to read, and to hold)."""
    nb, groups = cols // 32, -(-rows // 16)
    b = blocks.reshape(n_mats, rows, nb, 34)
    codes = np.full((n_mats, groups * 16, nb, 32), 0x80, np.uint8)
    codes[:, :rows] = b[..., 2:] ^ np.uint8(0x80)  # + 128: unsigned codes times signed activations
    scales = np.zeros((n_mats, groups * 16, nb), np.uint16)  # +0.0 for the padding rows
    scales[:, :rows] = np.ascontiguousarray(b[..., :2]).view(np.uint16)[..., 0]
    # [m, g, 16 rows, nb, 8 runs, 4] -> [m, g, nb, 8 runs, 16 rows, 4]
    runs = codes.reshape(n_mats, groups, 16, nb, 8, 4).transpose(0, 1, 3, 4, 2, 5)
    by_block = scales.reshape(n_mats, groups, 16, nb).transpose(0, 1, 3, 2)
    return (np.ascontiguousarray(runs).reshape(n_mats, groups, nb * 512),
            np.ascontiguousarray(by_block).reshape(n_mats, groups, nb * 16))


def _check_input(x: Any, cols: int) -> np.ndarray:
    xa = np.asarray(x)
    if xa.ndim != 2 or xa.shape[1] != cols:
        raise QuantMatrixError(f"input must be [n, {cols}], got {list(xa.shape)}")
    return np.ascontiguousarray(xa, dtype=np.float32)


class Activations:
    """One call's inputs rounded once for every row of the product (see q8kernels): xq int8 codes,
    xd f32 block scales, xs int32 sums (Q8_0: per block of 32; Q8_K: per 16); `x` the float
    inputs (dense matrices use them as they are)."""

    __slots__ = ("kind", "x", "xq", "xd", "xs")

    def __init__(self, x: np.ndarray, kind: str):
        n, cols = x.shape
        self.kind, self.x = kind, x
        self.xq = np.empty((n, cols), np.int8)
        if kind == "f32":
            return
        if kind == "q8_0":
            self.xd = np.empty((n, cols // 32), np.float32)
            self.xs = np.empty((n, cols // 32), np.int32)
        else:
            self.xd = np.empty((n, cols // 256), np.float32)
            self.xs = np.empty((n, cols // 16), np.int32)
        q8 = _kernels(quant.Q8_0)
        one = q8.quantize_q8_0 if kind == "q8_0" else q8.quantize_q8_k
        by_rows(n, x.size, lambda: one(x, self.xq, self.xd, self.xs),
                lambda cuts: q8.quantize_split(0 if kind == "q8_0" else 1, x, self.xq, self.xd, self.xs, cuts))

    def take(self, rows: np.ndarray) -> Activations:
        """The activations of input rows `rows` (a gather: rounding again would give the same)."""
        out = Activations.__new__(Activations)
        out.kind = self.kind
        if self.kind == "f32":
            out.x = self.x[rows]
        else:  # the rounded codes are what the kernels read: the float rows are not copied
            out.x = self.x[:0]
            out.xq, out.xd, out.xs = self.xq[rows], self.xd[rows], self.xs[rows]
        return out


def _activation_kind(qtype: int) -> str:
    if qtype in (quant.Q8_0, quant.MXFP4):  # blocks of 32 weights: activations in blocks of 32
        return "q8_0"
    if qtype in (quant.Q2_K, quant.Q4_K, quant.IQ2_XXS):
        return "q8_k"
    return "f32"


def row_cuts(rows: int, work: int, align: int = 1) -> np.ndarray:
    """Where [0, rows) is split into one contiguous range per thread (int64 [parts + 1]; each
    range starting at a multiple of `align`): one range when `work` (multiply-adds) is small."""
    units = -(-rows // align)
    parts = 1 if work < _PARALLEL_MIN_MACS else max(1, min(device.cpu_parts(), units))
    return _cuts(rows, units, parts, align)


def by_rows(rows: int, work: int, one: Callable[[], Any], split: Callable[[np.ndarray], Any]) -> None:
    """A row-local host step: split(cuts) over the cores (under SPLIT_LOCK) when `work` is large
    enough to pay for it (row_cuts), else one() on this thread (a decoded token's small calls:
    no parallel launch). Each row's result is the same either way."""
    cuts = row_cuts(rows, work)
    if cuts.shape[0] > 2:
        with SPLIT_LOCK:
            split(cuts)
    else:
        one()


@functools.lru_cache(maxsize=256)
def _all_tokens(n: int) -> np.ndarray:
    """expert_rows_split's `starts` for one expert taking all n tokens (shared; only read)."""
    return np.array([0, n], np.int64)


@functools.lru_cache(maxsize=1024)
def _cuts(rows: int, units: int, parts: int, align: int) -> np.ndarray:
    # A decoded token asks for the same few hundred splits every time; the array is shared, and
    # the kernels only read it.
    return np.array([min(rows, units * i // parts * align) for i in range(parts + 1)], np.int64)


def activation_error_bound(ggml_type: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The contract's bound on |fast product - x @ w.T| (float64 [n, rows]) for dequantised
    weights w [rows, cols] and inputs x [n, cols] (computed in numpy, independently of the kernels).

    Rounding an activation block of the type's size (32 for Q8_0, 256 otherwise) with step
    d = max|x|/127 moves each element by at most d/2, so the integer product is the exact product
    of w with an x' where |x - x'| <= d/2 element-wise: |w| @ (d/2) bounds that part. The float
    steps (the per-block scale multiplies and the in-order accumulation, and the weights' own
    rounding in the dequantiser) add at most (blocks + 8) * 2^-23 * (|w| @ |x|) with a factor of
    two to spare. Dense (F16/F32) matrices round no activation: only the float part applies.
    """
    w64 = np.abs(np.asarray(w, dtype=np.float64))
    x64 = np.asarray(x, dtype=np.float64)
    n, cols = x64.shape
    if ggml_type in BLOCK_TYPES:
        size = 32 if ggml_type in (quant.Q8_0, quant.MXFP4) else 256
        amax = np.abs(x64).reshape(n, cols // size, size).max(axis=2)
        step = np.repeat(amax / 127.0, size, axis=1) * (0.5 * (1 + 2.0 ** -20))
        blocks = cols // size
    else:
        step = np.zeros_like(x64)
        blocks = cols // 16
    return step @ w64.T + (blocks + 8) * 2.0 ** -23 * (np.abs(x64) @ w64.T) + 1e-30


class QuantMatrix:
    """A [rows, cols] weight matrix for the fast CPU products (see the module docstring).

    Storage: Q8_0 is repacked at load into groups of 16 interleaved rows (codes + 128, uint8) and
    the f16 scales (34 bytes per 32 weights, as in the file, and a last group padded to 16 rows;
    nbytes counts it); Q2_K, Q4_K and IQ2_XXS are
    used in place (a view of `raw`: the file's pages, nbytes 0); F16/F32 are held as they are.
    """

    def __init__(self, ggml_type: int, rows: int, cols: int, w: np.ndarray, aux: np.ndarray, nbytes: int):
        self.ggml_type, self.rows, self.cols = int(ggml_type), int(rows), int(cols)
        self.w, self.aux = w, aux  # see qkernels.expert_rows
        # the matrix as expert_rows_split's one expert, made once (a decode step has ~650 products)
        self._as_expert, self._aux_as_expert = (w[None],), (aux[None],)
        self.nbytes = int(nbytes)
        self.kind = _activation_kind(self.ggml_type)
        self.align = 16 if self.ggml_type == quant.Q8_0 else 1  # Q8_0 rows come in groups of 16

    @classmethod
    def from_blocks(cls, raw: Any, ggml_type: int, rows: int, cols: int) -> QuantMatrix:
        """raw: the tensor's GGUF bytes (uint8, e.g. a view of the file's memory map)."""
        blocks = _as_blocks(raw, ggml_type, rows, cols)
        if ggml_type == quant.Q8_0:
            codes, scales = _repack_q8_0(blocks, 1, rows, cols)
            return cls(ggml_type, rows, cols, codes[0], scales[0], codes.nbytes + scales.nbytes)
        return cls(ggml_type, rows, cols, blocks, np.zeros((1, 1), np.float32), 0)

    @classmethod
    def from_dense(cls, w: Any) -> QuantMatrix:
        """w: f16 or f32 [rows, cols]; multiplied in float32 (f16 widened exactly in the kernel).
        Kept as given (nbytes counts it: 2 or 4 bytes per weight; a view when already C-contiguous)."""
        wa = np.asarray(w)
        if wa.ndim != 2 or wa.dtype not in (np.float16, np.float32):
            raise QuantMatrixError(f"a dense matrix must be f16/f32 [rows, cols], got {list(wa.shape)} ({wa.dtype})")
        if wa.dtype == np.float16:  # kept as f16 (its bits as uint16), widened in the kernel
            w = np.ascontiguousarray(wa).view(np.uint16)
            return cls(F16, wa.shape[0], wa.shape[1], w, np.zeros((1, 1), np.float32), w.nbytes)
        w = np.ascontiguousarray(wa)
        return cls(F32, wa.shape[0], wa.shape[1], w, np.zeros((1, 1), np.float32), w.nbytes)

    def matmul(self, x: Any) -> np.ndarray:
        """x [n, cols] float32 -> [n, rows] float32."""
        xa = _check_input(x, self.cols)
        out = np.empty((xa.shape[0], self.rows), np.float32)
        if xa.shape[0]:
            act = Activations(xa, self.kind)
            cuts = row_cuts(self.rows, out.size * self.cols, self.align)
            with SPLIT_LOCK:
                if self.kind == "f32":
                    float_kernels().dense_rows_split(self.w, act.x, out, cuts)
                else:  # one expert taking every token
                    _kernels(self.ggml_type).expert_rows_split(self.ggml_type, self._as_expert, self._aux_as_expert,
                                                 (out,), _ONE_EXPERT, _all_tokens(out.shape[0]), act.xq, act.xd,
                                                 act.xs, cuts, _grid())
        return out


class ExpertMatrix:
    """Routed experts [n_experts, rows, cols]. K-quant and IQ2_XXS blocks are used in place (a
    view of `raw`: only the experts a call selects are read; nbytes 0, the file's pages); Q8_0
    experts are repacked as QuantMatrix does (nbytes counts the copy)."""

    def __init__(self, ggml_type: int, n_experts: int, rows: int, cols: int, w: np.ndarray, aux: np.ndarray,
                 nbytes: int):
        self.ggml_type, self.n_experts, self.rows, self.cols = int(ggml_type), int(n_experts), int(rows), int(cols)
        self.w, self.aux = w, aux  # [n_experts, ...] each (aux [n_experts, 1, 1] where unused)
        self.nbytes = int(nbytes)
        self.kind = _activation_kind(self.ggml_type)
        self.align = 16 if self.ggml_type == quant.Q8_0 else 1

    @classmethod
    def from_blocks(cls, raw: Any, ggml_type: int, n_experts: int, rows: int, cols: int) -> ExpertMatrix:
        blocks = _as_blocks(raw, ggml_type, n_experts * rows, cols)
        if ggml_type == quant.Q8_0:
            codes, scales = _repack_q8_0(blocks, n_experts, rows, cols)
            return cls(ggml_type, n_experts, rows, cols, codes, scales, codes.nbytes + scales.nbytes)
        return cls(ggml_type, n_experts, rows, cols, blocks.reshape(n_experts, rows, -1),
                   np.zeros((n_experts, 1, 1), np.float32), 0)

    def expert(self, e: int) -> QuantMatrix:
        """Expert e as a QuantMatrix (a view of its part of the storage)."""
        aux = self.aux[e] if self.ggml_type == quant.Q8_0 else self.aux[0]
        return QuantMatrix(self.ggml_type, self.rows, self.cols, self.w[e], aux, 0)

    def matmul(self, x: Any, ids: Any) -> np.ndarray:
        """x [n, cols] (one input per token) or [n, k, cols] (one per slot) float32, ids [n, k]
        -> [n, k, rows]: out[t, j] = W[ids[t, j]] @ x[t] (or x[t, j])."""
        return self.matmul_many((self,), x, ids)[0]

    def matmul_pair(self, other: ExpertMatrix, x: Any, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(self.matmul(x, ids), other.matmul(x, ids)), bit for bit, from one rounding of x and
        one split over the threads (a layer's gate and up projections)."""
        a, b = self.matmul_many((self, other), x, ids)
        return a, b

    def matmul_many(self, mats: tuple[ExpertMatrix, ...], x: Any, ids: Any) -> list[np.ndarray]:
        """matmul of each of `mats` (same type and shape as self) over the same x and ids."""
        if any((m.ggml_type, m.rows, m.cols) != (self.ggml_type, self.rows, self.cols) for m in mats):
            raise QuantMatrixError("matrices multiplied together must share type and shape")
        ida, xa = self.checked(x, ids)
        n, k = ida.shape
        if not ida.size:
            return [np.empty((n, k, self.rows), np.float32) for _ in mats]
        pairs = ExpertPairs(ida, per_slot_input=xa.ndim == 3)
        act = pairs.gathered(Activations(np.ascontiguousarray(xa.reshape(-1, self.cols), dtype=np.float32), self.kind))
        return [pairs.scattered(out).reshape(n, k, self.rows) for out in self.grouped_products(mats, act, pairs)]

    def checked(self, x: Any, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, k], integers naming experts of this matrix; x [n, cols] or [n, k, cols]) as
        arrays, or a QuantMatrixError that says what is wrong."""
        ida = np.asarray(ids)
        if ida.ndim != 2 or not np.issubdtype(ida.dtype, np.integer):
            raise QuantMatrixError(f"expert ids must be integer [n, k], got {list(ida.shape)} ({ida.dtype})")
        n, k = ida.shape
        xa = np.asarray(x)
        if xa.shape not in ((n, self.cols), (n, k, self.cols)):
            raise QuantMatrixError(f"expert input must be [{n}, {self.cols}] or [{n}, {k}, {self.cols}], "
                                   f"got {list(xa.shape)}")
        if ida.size and (ida.min() < 0 or ida.max() >= self.n_experts):
            raise QuantMatrixError(f"expert id out of range 0..{self.n_experts - 1}")
        return ida, xa

    def grouped_products(self, mats: tuple[ExpertMatrix, ...], act: Activations,
                         pairs: ExpertPairs) -> list[np.ndarray]:
        """Each of `mats` (self's type and shape) times the pairs' activations, act's rows in
        grouped order (pairs.gathered): [pairs, rows] each, in that order."""
        grouped = [np.empty((pairs.count, self.rows), np.float32) for _ in mats]
        cuts = row_cuts(self.rows, len(mats) * pairs.count * self.rows * self.cols, self.align)
        with SPLIT_LOCK:
            _kernels(self.ggml_type).expert_rows_split(self.ggml_type, tuple(m.w for m in mats), tuple(m.aux for m in mats),
                                         tuple(grouped), pairs.used, pairs.starts, act.xq, act.xd, act.xs, cuts, _grid())
        return grouped


class ExpertPairs:
    """The (token, slot) pairs of ids [n, k] (not empty) grouped by expert, as the kernels take
    them: expert used[i] takes the grouped pairs starts[i]..starts[i + 1]; order[g] is the pair
    (t * k + j) at grouped place g (None: the grouping is the pairs' own order); rows_of[g] the
    input row of that pair (per_slot_input: one input per pair, else one per token)."""

    def __init__(self, ida: np.ndarray, per_slot_input: bool):
        k = ida.shape[1]
        flat = ida.reshape(-1).astype(np.int64)
        self.count = flat.size
        self.order: np.ndarray | None
        if flat.size <= 64 and len(set(flat.tolist())) == flat.size:
            # Every pair its own expert (a decoded token's k experts): the pairs are the groups,
            # in pair order; the kernels take the experts in any order, each row's result the same.
            self.used, self.order = flat, None
            self.starts = np.arange(flat.size + 1, dtype=np.int64)
            pairs = np.arange(flat.size)
            self.rows_of = pairs if per_slot_input else pairs // k
        else:
            self.used, inverse = np.unique(flat, return_inverse=True)
            self.order = np.argsort(inverse, kind="stable")  # pairs grouped by expert, in pair order
            self.starts = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(self.used)))]
                                         ).astype(np.int64)
            self.rows_of = self.order if per_slot_input else self.order // k

    def gathered(self, act: Activations) -> Activations:
        """The activations of the grouped pairs' input rows, in grouped order."""
        rows_of = self.rows_of
        if len(rows_of) != act.x.shape[0] or np.any(rows_of != np.arange(len(rows_of))):
            return act.take(rows_of)
        return act

    def grouped(self, per_pair: np.ndarray) -> np.ndarray:
        """Values in pair order [pairs, ...] -> grouped order."""
        return per_pair if self.order is None else per_pair[self.order]

    def scattered(self, grouped: np.ndarray) -> np.ndarray:
        """Results in grouped order [pairs, ...] -> pair order."""
        if self.order is None:
            return grouped
        out = np.empty_like(grouped)
        out[self.order] = grouped
        return out


def routed_ffn(gate: ExpertMatrix, up: ExpertMatrix, down: ExpertMatrix, x: Any, ids: Any, weights: Any,
               clamp: float) -> np.ndarray:
    """A layer's routed experts in one call: x [n, dim] f32, ids [n, k], weights [n, k] f32 ->
    [n, dim] f32 = sum over slots j (in selection order) of
    down[ids[:, j]] @ (swiglu(gate[ids[:, j]] @ x, up[ids[:, j]] @ x, clamp) * weights[:, j]),
    the SwiGLU and the weighting in float32 on the host (fkernels.swiglu_weighted: ops.swiglu's
    formula, ds4's sigmoid; as an MLX graph over a 64-token chunk's [64, 6, 2048] values it cost
    a tenth of the call). Gate and up share one rounding of x and one split over the threads."""
    if (gate.ggml_type, gate.rows, gate.cols) != (up.ggml_type, up.rows, up.cols) or down.cols != gate.rows:
        raise QuantMatrixError("routed experts: gate and up must share type and shape, and down take their rows")
    ida, xa = gate.checked(x, ids)
    n, k = ida.shape
    if xa.ndim != 2:
        raise QuantMatrixError(f"routed experts take one input per token [{n}, {gate.cols}], got {list(xa.shape)}")
    if not ida.size:
        return np.zeros((n, down.rows), np.float32)
    # The pairs stay in grouped order from gate and up through the SwiGLU to down (one grouping,
    # one scatter at the end, where each product regrouped its input and scattered its output):
    # every pair's row is computed as a product of its own computes it.
    pairs = ExpertPairs(ida, per_slot_input=False)
    g, u = gate.grouped_products((gate, up), pairs.gathered(Activations(np.ascontiguousarray(xa, dtype=np.float32),
                                                                         gate.kind)), pairs)
    w = np.ascontiguousarray(pairs.grouped(np.asarray(weights, dtype=np.float32).reshape(-1)))
    mid = np.empty_like(g)
    with SPLIT_LOCK:  # a parallel kernel too: one launch at a time in the process
        P, F = g.shape  # each grouped pair a token of one slot
        float_kernels().swiglu_weighted(g.reshape(P, 1, F), u.reshape(P, 1, F), w.reshape(P, 1), float(clamp),
                                        mid.reshape(P, 1, F))
    down_rows = down.grouped_products((down,), Activations(mid, down.kind), pairs)[0]
    per_slot = pairs.scattered(down_rows).reshape(n, k, down.rows)
    total = per_slot[:, 0].copy()
    for j in range(1, per_slot.shape[1]):
        total += per_slot[:, j]
    return total
