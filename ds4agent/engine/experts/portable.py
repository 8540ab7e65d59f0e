"""The MLX expert backends (experts/base.py has the interface and chooses among them).

  * `DenseExperts`   float weights [n_experts, d_out, d_in] (test models, dequantised refs);
  * `MxExperts`      MLX microscaled formats (`mxfp4`, from `ds4agent convert`; experts/mxfp4.py
                     re-lays a GGUF's MXFP4 experts into it);
  * `QuantExperts`   raw GGUF blocks [n_experts, d_out, row_bytes] (Q2_K, Q4_K, IQ2_XXS, Q8_0) kept
                     quantised; only the experts a call selects are read. On a CPU, compiled
                     kernels (experts/cpu.py) decode and multiply them block by block, the output
                     rows split over one worker thread per core; on a GPU, MLX ops dequantise a
                     bounded group of whole experts at a time. experts/gpu.py subclasses it.

Exactness contract (chunk invariance, model.md §9): every (row, slot) product is computed as its
own 1-row matrix product (`mx.gather_mm` with M = 1 per batch element), so a row's result does
not depend on which other rows share the call (chunk size, token-by-token decode) nor on how
experts are grouped. The quantised backend dequantises bit-exactly (quant.py), so it gives the
same bits as `DenseExperts` over the dequantised float32 weights. (Its CPU kernels compute every
output as the in-order float32 dot product, which is what the CPU BLAS computes for a 1-row
product; the tests hold it to `DenseExperts` bit for bit.)
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

from ds4agent.engine import device, quant
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts import cpu
from ds4agent.engine.hostread import to_host


def check_call(ex: Any, x: mx.array, ids: mx.array) -> tuple[int, int]:
    """(N, k) of a `gather_matmul` call on `ex` (any backend: it reads d_in), or EngineError."""
    if ids.ndim != 2:
        raise EngineError(f"expert_ids must be [N, k], got shape {list(ids.shape)}")
    n, k = ids.shape
    ok = (x.ndim == 2 and tuple(x.shape) == (n, ex.d_in)) or (
        x.ndim == 3 and tuple(x.shape) == (n, k, ex.d_in)
    )
    if not ok:
        raise EngineError(
            f"expert input must be [{n}, {ex.d_in}] or [{n}, {k}, {ex.d_in}], got {list(x.shape)}"
        )
    return n, k


def _slot_inputs(x: mx.array, n: int, k: int) -> mx.array:
    """x as [N, 1 or k, 1, d_in] for gather_mm (batch dims broadcast against ids [N, k])."""
    x = x.astype(mx.float32)
    return x[:, None, None, :] if x.ndim == 2 else x[:, :, None, :]


class DenseExperts:
    """Float expert weights [n_experts, d_out, d_in], multiplied in float32."""

    def __init__(self, w: mx.array):
        if w.ndim != 3:
            raise EngineError(f"dense expert weights must be [n_experts, d_out, d_in], got {list(w.shape)}")
        # f16 weights are widened once here: the product must be f32 (and identical to a dequantised
        # reference); widening per call would copy the whole tensor every step. On the CPU device
        # stored as contiguous [E, d_in, d_out] (`w` is a view of it): gather_mm on a contiguous
        # right-hand side is ~2.3x faster with the Linux wheel's reference BLAS, with bit-identical
        # results (see weights.Linear); a GPU keeps [E, d_out, d_in].
        if device.cpu_layout():
            self._wt = mx.contiguous(mx.swapaxes(w.astype(mx.float32), -1, -2))
            self.w = mx.swapaxes(self._wt, -1, -2)
        else:
            self.w = w.astype(mx.float32)
            self._wt = mx.swapaxes(self.w, -1, -2)
        self.n_experts, self.d_out, self.d_in = (int(s) for s in w.shape)

    def describe(self) -> tuple[str, str]:
        return "dense float32", "via MLX gather_mm"

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        n, k = check_call(self, x, expert_ids)
        out = mx.gather_mm(_slot_inputs(x, n, k), self._wt, rhs_indices=expert_ids.astype(mx.uint32))
        return out.reshape(n, k, self.d_out)


class MxExperts:
    """Experts in MLX's microscaled formats (`mxfp4`, from `ds4agent convert`): packed codes
    [n_experts, d_out, d_in*bits/32] uint32 + E8M0 scales [n_experts, d_out, d_in/32], multiplied
    with `mx.gather_qmm` (one 1-row product per (row, slot), like the other backends)."""

    def __init__(self, wq: mx.array, scales: mx.array, *, mode: str = "mxfp4", bits: int = 4):
        if wq.ndim != 3 or scales.ndim != 3 or wq.shape[:2] != scales.shape[:2]:
            raise EngineError(f"{mode} experts need [E, out, packed] codes and [E, out, groups] scales, got "
                              f"{list(wq.shape)} and {list(scales.shape)}")
        self.wq, self.scales, self.mode, self.bits = wq, scales, mode, bits
        self.n_experts, self.d_out = int(wq.shape[0]), int(wq.shape[1])
        self.d_in = int(wq.shape[2]) * 32 // bits
        if self.d_in != int(scales.shape[2]) * 32:
            raise EngineError(f"{mode} experts: {self.d_in} inputs do not match {scales.shape[2]} scale groups of 32")

    def describe(self) -> tuple[str, str]:
        return self.mode, "via MLX gather_qmm"

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        n, k = check_call(self, x, expert_ids)
        out = mx.gather_qmm(_slot_inputs(x, n, k), self.wq, self.scales, rhs_indices=expert_ids.astype(mx.uint32),
                            transpose=True, group_size=32, bits=self.bits, mode=self.mode)
        return out.reshape(n, k, self.d_out)


# Device (non-CPU) path: dequantised float32 bytes one call may hold at a time (a prefill chunk
# can select every expert: 256 Flash experts of 2048 x 4096 would be 8 GiB as f32). Decode
# (6 experts, 32 MiB each) fits in one group.
DEFAULT_GROUP_BYTES = 256 << 20
# Output rows per `cpu.products` call on the CPU path. The kernel reads a row's blocks in
# place (a memory-mapped expert is paged in as it is read); a range only bounds one call's work.
TILE_ROWS = 1024


def quant_how(cpu: bool, fallback: str | None = None) -> str:
    """How `QuantExperts` multiplies, in words: on the CPU (`cpu`: the reference kernel set's host
    ids) the exact compiled CPU kernels, else MLX ops; `fallback`: why it runs where GPU kernels
    were meant to."""
    if fallback is not None:
        return f"portable MLX ({fallback})"
    if cpu:
        return "exact CPU kernels"
    return "portable MLX dequantise + gather_mm"


def resident_blocks(raw) -> mx.array:
    """Raw expert blocks (numpy, or a view of the file's memory map) copied into one evaluated
    MLX array: what a backend that keeps its blocks resident holds."""
    out = mx.array(np.ascontiguousarray(raw))
    mx.eval(out)
    return out


class QuantExperts:
    """Portable backend over raw GGUF blocks: dequantise only the selected experts, then multiply.

    `raw` is [n_experts, d_out, row_bytes] uint8 (a numpy array / memmap, or an mx.array). A numpy
    memmap stays on disk: a call reads only the selected experts' bytes (an expert's rows are
    contiguous in the GGUF tensor, ne2 being the outermost dimension).

    Two ways to run, fixed when the backend is made (device.kernel_set):
      * CPU kernel set: the ids are read on the host (the compiled kernels run there anyway) and
        the products come from the memory map, bit for bit (`_tiled`);
      * GPU kernel set: the raw blocks are one resident device array (as the Metal backend holds
        them) and a call takes the router's ids as a device array, never reading them: a call
        of at most `group` (row, slot) pairs, i.e. decode, gathers each pair's expert blocks by
        id, dequantises them on the device and multiplies (one graph, no host round trip).
        Larger calls (prefill chunks) read the ids once to dequantise each distinct expert once,
        a bounded group at a time (`_grouped`). No per-call range check: the router cannot give
        an out-of-range id (top-k over n_experts scores; hash tables are checked at load).
    """

    # Why this portable backend runs where a faster one was meant to (set by base.quant_experts
    # when the Metal kernels fail their self-check), for `describe`.
    fallback: str | None = None

    def __init__(self, raw, qtype: int, shape, *, group_bytes: int = DEFAULT_GROUP_BYTES):
        if qtype not in quant.EXPERT_TYPES:
            raise EngineError(f"routed experts of type {quant.type_name(qtype)} are not supported")
        self.qtype = int(qtype)
        self.n_experts, self.d_out, self.d_in = (int(s) for s in shape)
        rb = quant.row_bytes(self.qtype, self.d_in)
        want = (self.n_experts, self.d_out, rb)
        if int(np.prod(raw.shape)) != int(np.prod(want)):
            raise EngineError(
                f"{quant.type_name(qtype)} expert data of shape {list(raw.shape)} does not hold "
                f"{self.n_experts} experts of [{self.d_out}, {self.d_in}]"
            )
        self.expert_bytes = self.d_out * rb
        self.group = max(1, group_bytes // (self.d_out * self.d_in * 4))
        self.host_ids = device.cpu_layout()
        if self.keeps_resident() and not isinstance(raw, mx.array):
            # Resident once, instead of copying the selected experts from the map every call.
            raw = resident_blocks(raw)
        self.raw = raw.reshape(want)

    @classmethod
    def keeps_resident(cls) -> bool:
        """Whether this backend holds its blocks as one device array (made at construction from
        a numpy or memory-mapped `raw`) instead of reading them from the map: the GPU kernel set
        does, the CPU one reads the selected experts' rows in place."""
        return not device.cpu_layout()

    @property
    def nbytes(self) -> int:
        return self.n_experts * self.expert_bytes

    def maps_file(self) -> bool:
        """Whether calls read the blocks from the file's mapping (then its pages must stay)."""
        return not isinstance(self.raw, mx.array)

    def describe(self) -> tuple[str, str]:
        return quant.type_name(self.qtype), quant_how(self.host_ids, self.fallback)

    def _raw_of(self, experts: np.ndarray | mx.array) -> mx.array:
        if isinstance(experts, mx.array):
            return self.raw[experts.astype(mx.uint32)]
        if isinstance(self.raw, mx.array):
            return self.raw[mx.array(experts.astype(np.uint32))]
        return mx.array(np.take(self.raw, experts, axis=0))

    def _rows_of(self, expert: int, r0: int, r1: int) -> np.ndarray:
        """Raw rows r0..r1 of one expert, [r1-r0, row_bytes] (a memmap reads only those bytes)."""
        return np.asarray(self.raw[expert, r0:r1])

    def dequantize(self, experts) -> mx.array:
        """float32 [len(experts), d_out, d_in] of the given experts (bit-exact, quant.py);
        `experts` may be a device array (nothing is read back)."""
        if not isinstance(experts, mx.array):
            experts = np.asarray(experts, dtype=np.int64).reshape(-1)
        else:
            experts = experts.reshape(-1)
        return quant.dequantize(self._raw_of(experts), self.qtype, (int(experts.size), self.d_out, self.d_in),
                                on_device=not self.host_ids)

    def gather_matmul(self, x: mx.array, expert_ids: mx.array) -> mx.array:
        n, k = check_call(self, x, expert_ids)
        if not self.host_ids and n * k <= self.group:
            return self._device_pairs(x, expert_ids, n, k)
        ids = to_host(expert_ids).astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_experts):
            raise EngineError(f"expert id out of range 0..{self.n_experts - 1}")
        if self.host_ids:
            return self._tiled(x, ids, n, k)
        a = _slot_inputs(x, n, k)
        used = np.unique(ids)
        if len(used) <= self.group:  # decode and small chunks: one dequantisation, one product
            local = np.searchsorted(used, ids).astype(np.uint32)
            wt = mx.swapaxes(self.dequantize(used), -1, -2)
            return mx.gather_mm(a, wt, rhs_indices=mx.array(local)).reshape(n, k, self.d_out)
        # Large chunks: a group of experts at a time (bounded dequantised memory).
        groups = [used[start : start + self.group] for start in range(0, len(used), self.group)]
        return self._grouped(x, ids, n, k, groups)

    def gather_matmul_with(self, other: Any, x: mx.array, expert_ids: mx.array) -> tuple[mx.array, mx.array] | None:
        """(self.gather_matmul(x, ids), other.gather_matmul(x, ids)) from one dequantisation of
        both tensors' selected experts (the gate and up projections of a decoded token: same
        format, same ids), or None where that does not apply (then call each). The same
        per-pair products as two calls, bit for bit, in half the ops."""
        if type(self) is not QuantExperts or type(other) is not QuantExperts or self.host_ids \
                or other.host_ids or (self.qtype, self.d_out, self.d_in) != (other.qtype, other.d_out, other.d_in):
            return None
        n, k = check_call(self, x, expert_ids)
        if 2 * n * k > self.group:
            return None
        return _pairs2_fn(self.qtype, self.d_out, self.d_in, not self.host_ids)(x, expert_ids, self.raw, other.raw)

    def _device_pairs(self, x: mx.array, expert_ids: mx.array, n: int, k: int) -> mx.array:
        """The GPU kernel set's small call: pair p's expert dequantised from the resident blocks
        by its device id, then one 1-row product per pair (an expert chosen twice in a call is
        dequantised twice: at most `group` pairs, so bounded, and nothing is read back)."""
        return _pairs_fn(self.qtype, self.d_out, self.d_in, not self.host_ids)(x, expert_ids, self.raw)

    def _tiled(self, x: mx.array, ids: np.ndarray, n: int, k: int) -> mx.array:
        """The CPU path: `cpu.products` straight from the selected experts' blocks (a
        memory-mapped tensor is read row range by row range, only the selected experts), in the
        dense product's order, bit for bit; nothing is dequantised as a whole expert.

        The output rows are split into `device.cpu_parts()` ranges, each served by its own worker thread
        (the kernels release the GIL), TILE_ROWS rows at a time. A row's bits do not depend on the
        range, the split or the other rows sharing its expert (experts/cpu.py), so neither does
        the result.
        """
        src = to_host(x.astype(mx.float32), np.float32).reshape(-1, self.d_in)
        flat = ids.reshape(-1)
        used, slot_expert = np.unique(flat, return_inverse=True)
        order = np.argsort(slot_expert, kind="stable")  # pairs grouped by expert, in pair order
        bounds = np.concatenate([[0], np.cumsum(np.bincount(slot_expert, minlength=len(used)))])
        pairs = [order[b0:b1] for b0, b1 in zip(bounds, bounds[1:], strict=False)]  # by expert
        inputs = [np.ascontiguousarray(src[p // k if x.ndim == 2 else p]) for p in pairs]
        out = np.empty((n * k, self.d_out), np.float32)  # the workers fill disjoint column ranges
        parts = max(1, min(device.cpu_parts(), self.d_out))
        cuts = [self.d_out * i // parts for i in range(parts + 1)]
        jobs = [functools.partial(self._part, used, inputs, pairs, out, cuts[i], cuts[i + 1]) for i in range(parts)]
        if parts == 1:
            jobs[0]()
        else:
            cpu.workers(parts).run(jobs)
        return mx.array(out).reshape(n, k, self.d_out)

    def _part(self, used: np.ndarray, inputs: list, pairs: list, out: np.ndarray, r0: int, r1: int) -> None:
        """Output rows r0..r1 of every selected expert, for the pairs that use it, into `out`."""
        for e, expert in enumerate(used):
            for t0 in range(r0, r1, TILE_ROWS):
                t1 = min(t0 + TILE_ROWS, r1)
                out[pairs[e], t0:t1] = cpu.products(self._rows_of(int(expert), t0, t1), self.qtype, self.d_in, inputs[e])

    def _grouped(self, x: mx.array, ids: np.ndarray, n: int, k: int, groups: list[np.ndarray]) -> mx.array:
        """Flatten to (row, slot) pairs and serve them one group of experts at a time.

        Pair p = row p // k, slot p % k; a shared input row is gathered per pair, never broadcast
        to all N*k pairs up front (that would be N*k*d_in floats at once). Each group is
        evaluated before the next is dequantised; the last is left lazy, like the single-group
        product (decode keeps one graph).
        """
        xf = x.astype(mx.float32)
        src = xf if x.ndim == 2 else xf.reshape(n * k, self.d_in)
        flat = ids.reshape(-1)
        outs, order = [], []
        for i, grp in enumerate(groups):
            pairs = np.nonzero((flat >= grp[0]) & (flat <= grp[-1]))[0]
            local = np.searchsorted(grp, flat[pairs]).astype(np.uint32)
            sel = pairs // k if x.ndim == 2 else pairs
            wt = mx.swapaxes(self.dequantize(grp), -1, -2)
            rows = mx.take(src, mx.array(sel.astype(np.uint32)), axis=0)[:, None, :]
            out = mx.gather_mm(rows, wt, rhs_indices=mx.array(local))
            if i < len(groups) - 1:
                mx.eval(out)  # free this group's dequantised weights before the next ones
            outs.append(out)
            order.append(pairs)
        inverse = np.empty(n * k, dtype=np.uint32)
        inverse[np.concatenate(order)] = np.arange(n * k, dtype=np.uint32)
        return mx.take(mx.concatenate(outs, axis=0), mx.array(inverse), axis=0).reshape(n, k, self.d_out)


@functools.lru_cache(maxsize=64)
def _pairs_fn(qtype: int, d_out: int, d_in: int, compiled: bool):
    """`_device_pairs` as one compiled function per expert tensor format: the dequantisation's
    bit arithmetic fuses into a few kernels instead of a few dozen small ops per call (the raw
    blocks are an input, not a captured constant, so one function serves every layer). Plain
    where the dequantiser reads back (the whole-expert path on the CPU kernel set: a compiled
    function may not evaluate)."""

    def pairs(x: mx.array, expert_ids: mx.array, raw: mx.array) -> mx.array:
        n, k = expert_ids.shape
        flat = expert_ids.reshape(-1).astype(mx.uint32)
        w = quant.dequantize(raw[flat], qtype, (n * k, d_out, d_in), on_device=compiled)
        pair = mx.arange(n * k, dtype=mx.uint32).reshape(n, k)
        out = mx.gather_mm(_slot_inputs(x, n, k), mx.swapaxes(w, -1, -2), rhs_indices=pair)
        return out.reshape(n, k, d_out)

    return mx.compile(pairs) if compiled else pairs


@functools.lru_cache(maxsize=64)
def _pairs2_fn(qtype: int, d_out: int, d_in: int, compiled: bool):
    """Two tensors' `_device_pairs` over the same inputs and ids, dequantised as one batch."""

    def pairs2(x: mx.array, expert_ids: mx.array, raw_a: mx.array, raw_b: mx.array) -> tuple[mx.array, mx.array]:
        n, k = expert_ids.shape
        flat = expert_ids.reshape(-1).astype(mx.uint32)
        both = mx.concatenate([raw_a[flat], raw_b[flat]], axis=0)
        w = quant.dequantize(both, qtype, (2 * n * k, d_out, d_in), on_device=compiled)
        pair = mx.arange(2 * n * k, dtype=mx.uint32).reshape(2, n, k)
        out = mx.gather_mm(_slot_inputs(x, n, k), mx.swapaxes(w, -1, -2), rhs_indices=pair)
        out = out.reshape(2, n, k, d_out)
        return out[0], out[1]

    return mx.compile(pairs2) if compiled else pairs2
