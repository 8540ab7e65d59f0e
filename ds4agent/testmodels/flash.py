"""Flash-shape test files: ds4's exact tensor table, random weights, shared data regions.

    layout = plan_layout(flash_config(), "q2")      # tensor table, offsets, sizes; writes nothing
    write_flash_model(path, flash_config(), experts="q2", seed=0)

The file has exactly the tensor names, shapes and types of ds4's files of one flavour (model.md
§6.3: q2 = IQ2_XXS gate/up and Q2_K down routed experts, q4 = Q4_K for all three, mxfp4 = MXFP4
for all three (the FP4 experts as DeepSeek released them); Q8_0 attention,
shared experts and output head; F16 embedding, hyper-connection mixers, compressors, indexer and
router; F32 norms and vectors; I32 tid2eid), the real `deepseek4.*` metadata of the config, the
DeepSeek V4 tokenizer (protocol/gguf_vocab.py) and NO test-model marker: a Flash-config file takes the
engine's strict path, exactly as a real file does.

Why it fits on an ordinary disk (about 4.5 GiB for q2, 6.4 GiB for q4, against 81 / 153 GB for the
real files): GGUF tensor offsets are free, so tensors may share bytes.

* routed experts: every layer's `ffn_gate_exps` points at one random region, likewise `ffn_up_exps`
  and `ffn_down_exps` (the 256 experts inside a region all differ);
* the large per-layer matrices (attention projections, shared experts, compressor and indexer
  projections) cycle through POOL variants of each (role, shape): the k-th layer having that
  tensor uses variant k % POOL;
* everything small and layer-specific is distinct: norms, hyper-connection mixers, scales and
  bases, sinks, compressor positions (ape), the router (`ffn_gate_inp`, so each layer picks its own
  experts), the selection bias and tid2eid.

The tensor directory, and so `ds4agent info`'s per-group sizes, describe the full 81 GB model; the
key FLASH_TEST_KEY (which no validation reads) says what the file is.

Values follow values.py's scaling rules (N(0, 1/fan_in) matrices, half-scale experts, norms ~1,
small hyper-connection mixers), so activations stay finite and varied through any depth. Quantised
expert blocks are valid blocks of their type with random codes and small f16 scales chosen so the
dequantised weights are zero-mean with the expert scale 0.5/sqrt(fan_in) (see `_expert_blocks`).
Every region is generated from its own seeded stream in chunks of about CHUNK_ELEMS values and
written at its offset, so the writer holds a few tens of MB whatever the model size; the same
(config, experts, seed) always gives the same bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from ds4agent.engine.config import FLASH_TEST_KEY, ModelConfig
from ds4agent.engine.errors import EngineError
from ds4agent.engine.gguf import block_of
from ds4agent.engine.layout import ARCH, TensorSpec, tensor_table
from ds4agent.fsutil import atomic_path

from .values import add_config_metadata, encode, fill_kind, random_values

POOL = 4  # variants of each large per-layer matrix
ALIGN = 32  # GGUF default alignment (the file writes no general.alignment, like ds4's)
CHUNK_ELEMS = 1 << 23  # values generated per step (32 MB of f32)
HEADER_RESERVE = 64 << 20  # metadata (tokenizer ~5 MB) + tensor directory, with room to spare
MAX_FILE_BYTES = 12 << 30  # the disk budget of a Flash-config file: it must fit an ordinary disk

_EXPERT_QUANTS = ("IQ2_XXS", "Q2_K", "Q4_K", "MXFP4")
# Per-layer matrices that are pooled (the large ones); the router stays per layer.
_POOLED_KINDS = ("linear", "expert")
_LAYER_PREFIX = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Region:
    """A run of bytes in the data section, filled from its own random stream."""

    index: int  # seed stream and file order
    offset: int  # relative to the data start, ALIGN-aligned
    nbytes: int
    spec: TensorSpec  # what fills it: type, shape and value kind (the first tensor placed there)


@dataclass(frozen=True)
class Placement:
    spec: TensorSpec  # the tensor's name, row-major shape and GGML type
    region: Region

    @property
    def offset(self) -> int:
        return self.region.offset

    @property
    def nbytes(self) -> int:
        return self.region.nbytes


@dataclass(frozen=True)
class Layout:
    config: ModelConfig
    experts: str
    tensors: tuple[Placement, ...]  # in file (directory) order
    regions: tuple[Region, ...]  # in offset order
    data_bytes: int  # size of the data section

    @property
    def directory_bytes(self) -> int:
        """What the tensors would take without sharing (the size of a real file's data)."""
        return sum(p.nbytes for p in self.tensors)

    @property
    def max_file_bytes(self) -> int:
        """An upper bound of the file size (data + HEADER_RESERVE for metadata and directory)."""
        return self.data_bytes + HEADER_RESERVE


def tensor_bytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    _, block, size = block_of(ggml_type)
    n = int(np.prod(shape))
    if shape[-1] % block:
        raise EngineError(f"a {ggml_type} row needs a multiple of {block} values, got {shape[-1]}")
    return n // block * size


def plan_layout(cfg: ModelConfig, experts: str = "q2") -> Layout:
    """Where every tensor of `cfg` lives in the data section (see the module docstring)."""
    regions: dict[object, Region] = {}
    seen: dict[tuple, int] = {}
    tensors: list[Placement] = []
    end = 0
    for spec in tensor_table(cfg, experts):  # refuses an unknown flavour
        m = _LAYER_PREFIX.match(spec.name)
        role = _LAYER_PREFIX.sub("", spec.name)
        key: object
        if m and "_exps." in spec.name:
            key = ("shared", role)
        elif m and fill_kind(spec.name) in _POOLED_KINDS and not role.startswith("ffn_gate_inp"):
            k = seen.get((role, spec.shape), 0)
            seen[(role, spec.shape)] = k + 1
            key = ("pool", role, spec.shape, k % POOL)
        else:
            key = ("own", spec.name)
        region = regions.get(key)
        if region is None:
            nbytes = tensor_bytes(spec.ggml_type, spec.shape)
            region = Region(len(regions), end, nbytes, spec)
            regions[key] = region
            end += -(-nbytes // ALIGN) * ALIGN
        tensors.append(Placement(spec, region))
    return Layout(cfg, experts, tuple(tensors), tuple(regions.values()), end)


# ---- values ----------------------------------------------------------------------------------


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _raw_expert_blocks(qtype: str, n: int, base: float, rng: np.random.Generator) -> np.ndarray:
    """n valid blocks of `qtype`: random codes, per-block scale d = base·U(0.75, 1.25).

    The scales are chosen so every block's weights are symmetric around zero:
    IQ2_XXS   all 64 code bytes random (grid indices, sign codes, 4-bit scales); signs are
              symmetric by construction.
    Q2_K      sub-block scale s in 1..15 and min m = s with dmin = 1.5·d: w = d·s·(q - 1.5).
    Q4_K      6-bit scale s in 4..31, min m = 2s with dmin = 3.75·d: w = d·s·(q - 7.5).
    MXFP4     random E2M1 codes (sign-symmetric); the E8M0 scale is d rounded to a power of two.
    """
    size = block_of(qtype).nbytes
    out = rng.integers(0, 256, (n, size), dtype=np.uint8)  # the codes
    d = np.float32(base) * rng.uniform(0.75, 1.25, n).astype(np.float32)
    if qtype == "IQ2_XXS":
        out[:, 0:2] = _f16_bytes(d)
    elif qtype == "Q2_K":
        s = rng.integers(1, 16, (n, 16), dtype=np.uint8)
        out[:, 0:16] = s | (s << 4)
        out[:, 80:82] = _f16_bytes(d)
        out[:, 82:84] = _f16_bytes(np.float32(1.5) * d)
    elif qtype == "Q4_K":
        s = rng.integers(4, 32, (n, 8), dtype=np.uint8)
        mn = 2 * s
        # 12 packed bytes (quant.py's layout): bytes 0-3 scale 0-3 + high bits of scale 4-7,
        # 4-7 min 0-3 + high bits of min 4-7, 8-11 low nibbles of scale/min 4-7.
        out[:, 4:8] = s[:, :4] | ((s[:, 4:] >> 4) << 6)
        out[:, 8:12] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
        out[:, 12:16] = (s[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
        out[:, 0:2] = _f16_bytes(d)
        out[:, 2:4] = _f16_bytes(np.float32(3.75) * d)
    elif qtype == "MXFP4":
        out[:, 0] = np.clip(np.rint(np.log2(d)) + 127, 1, 254).astype(np.uint8)
    else:
        raise AssertionError(qtype)
    return out


@cache
def _unit_rms(qtype: str) -> float:
    """RMS of dequantised weights at base scale 1 (measured once with the reference dequantiser)."""
    import gguf

    blocks = _raw_expert_blocks(qtype, 1024, 1.0, np.random.default_rng(0))
    w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
    return float(np.sqrt(np.mean(np.square(w.astype(np.float64)))))


def expert_scale(qtype: str, fan_in: int) -> float:
    """Base block scale giving weights of RMS 0.5/sqrt(fan_in) (values.py's expert scale)."""
    return 0.5 * fan_in**-0.5 / _unit_rms(qtype)


def _chunks(region: Region, cfg: ModelConfig, seed: int) -> Iterator[np.ndarray]:
    """The region's bytes, in chunks, from the seeded stream (seed, region index)."""
    rng = np.random.default_rng([seed, region.index])
    spec = region.spec
    if spec.ggml_type in _EXPERT_QUANTS:
        _, block, size = block_of(spec.ggml_type)
        n_blocks = region.nbytes // size
        base = expert_scale(spec.ggml_type, spec.shape[-1])
        step = max(1, CHUNK_ELEMS // block)
        for b0 in range(0, n_blocks, step):
            yield _raw_expert_blocks(spec.ggml_type, min(step, n_blocks - b0), base, rng)
        return
    rows, rest = spec.shape[0], spec.shape[1:]
    # tid2eid draws n_experts keys per row; everything else draws one value per element
    per_row = cfg.n_experts if fill_kind(spec.name) == "tid2eid" else int(np.prod(rest, dtype=np.int64))
    step = rows if not rest else max(1, CHUNK_ELEMS // max(1, per_row))
    for r0 in range(0, rows, step):
        part = replace(spec, shape=(min(step, rows - r0), *rest)) if rest else spec
        yield np.ascontiguousarray(encode(part, random_values(part, cfg, rng)))


# ---- writing ---------------------------------------------------------------------------------


def describe(experts: str, seed: int) -> str:
    """The FLASH_TEST_KEY value: what the file is, for `ds4agent info`."""
    return (f"random-weight test file with shared data regions ({experts} experts, seed {seed}): "
            f"every layer's routed experts share one region per tensor, large matrices cycle "
            f"through {POOL} variants")


def _directory(layout: Layout) -> bytes:
    """The GGUF tensor infos (model.md §6.1) with the planned, possibly shared, offsets."""
    from gguf import GGMLQuantizationType

    out = bytearray()
    for p in layout.tensors:
        name = p.spec.name.encode("utf-8")
        dims = tuple(reversed(p.spec.shape))  # GGML lists ne0 first
        out += struct.pack("<Q", len(name)) + name
        out += struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        out += struct.pack("<IQ", int(GGMLQuantizationType[p.spec.ggml_type]), p.offset)
    return bytes(out)


def check_free_space(path: Path, needed: int) -> None:
    parent = path.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise EngineError(
            f"not enough free disk space for {path}: the file needs up to {needed / (1 << 30):.1f} GiB, "
            f"{parent} has {free / (1 << 30):.1f} GiB free"
        )


def write_flash_model(path: str | os.PathLike[str], cfg: ModelConfig, *, experts: str = "q2",
                      seed: int = 0) -> Path:
    """Write a Flash-layout test file for `cfg` (see the module docstring); returns the path.

    Written atomically: a failed write (or Ctrl+C) leaves no half file and keeps an old one.
    """
    from gguf import GGMLQuantizationType, GGUFWriter

    from ds4agent.protocol.gguf_vocab import tokenizer_metadata

    if not isinstance(seed, int) or seed < 0:
        raise EngineError(f"--seed must be a non-negative integer (got {seed})")
    layout = plan_layout(cfg, experts)
    path = Path(path)
    check_free_space(path, layout.max_file_bytes)
    with atomic_path(path, make_parents=True) as tmp:
        writer = GGUFWriter(tmp, ARCH)
        try:
            writer.add_name(f"ds4agent Flash-shape test model ({experts}, seed {seed}, shared expert data)")
            writer.add_quantization_version(2)
            writer.add_string(FLASH_TEST_KEY, describe(experts, seed))
            add_config_metadata(writer, cfg)
            for key, value, vtype, sub in tokenizer_metadata():
                writer.add_key_value(key, value, vtype, sub_type=sub)
            # Registered only so the header counts them; the directory itself is written below
            # with the shared offsets (GGUFWriter lays tensors out one after another).
            for p in layout.tensors:
                writer.add_tensor_info(p.spec.name, p.spec.shape, np.dtype(np.float32), p.nbytes,
                                       raw_dtype=GGMLQuantizationType[p.spec.ggml_type])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
        finally:
            writer.close()
        with open(tmp, "r+b") as fh:
            fh.seek(0, os.SEEK_END)
            fh.write(_directory(layout))
            start = -(-fh.tell() // ALIGN) * ALIGN
            for region in layout.regions:
                fh.seek(start + region.offset)
                for chunk in _chunks(region, cfg, seed):
                    fh.write(chunk.data.cast("B"))  # the chunk is C-contiguous: its bytes as they are
            fh.truncate(start + layout.data_bytes)
    return path
