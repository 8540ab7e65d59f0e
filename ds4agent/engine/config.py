"""ModelConfig: every size of the DS4 Flash architecture, read from `deepseek4.*` GGUF metadata.

The engine never uses a literal for a model size: everything comes from a ModelConfig (model.md
§1.1). Two validation modes:

* ``"flash"`` (real weights): every key must hold the DS4 Flash value (model.md §1 / §6.2):
  integers exactly, floats within ``max(1, |want|)·1e-6``, ratios element-wise by the §2 rule.
  The error names the FIRST mismatching key, in table order, so a user sees one clear line.
* ``"test"`` (test models): any sizes, checked only for internal consistency (the constraints
  the math needs, e.g. ``Dh − Dr`` a multiple of 64 for the fp8 blocks, ``Di`` a power of two).

Named test configs (``TEST_CONFIGS`` / ``test_config(name)``):

* ``micro``: vocab 512, width 32, 4 layers, ratios (0, 0, 4, 16), window 8, indexer top-k 4,
  8 experts / 2 used, 2 hash layers. Every boundary within ~40 tokens; for fast oracle tests.
* ``tiny``: the REAL vocab 129280 (the agent and UI run on it with the real tokenizer), width 64,
  4 layers, ratios (0, 0, 4, 16), window 16, indexer top-k 8 (pruning from position 35).
* ``small``: benchmark config: real vocab, width 512, 4 layers, ratios (0, 4, 128, 4), window 128,
  8 heads of 192 (Dr 64), indexer 8 × 128 top-k 128, 16 experts / 4 used of width 256.

``ModelConfig`` carries the attribute names of ``sessions.payload.PayloadShape`` (``n_layers``,
``head_dim``, ``indexer_dim``, ``vocab``, ``window``, ``ratios``, ``coff(layer)``), so it can be
handed wherever a payload shape is expected.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ds4agent import statelayout

from .errors import ConfigError
from .gguf import GGUFFile

PREFIX = "deepseek4."

#: Marks a file as a test model (ds4agent.testmodels writes it): the engine then validates its
#: metadata in the permissive "test" mode; every file without it (ds4's real weights) must pass
#: the strict Flash checks.
TEST_MODEL_KEY = "ds4agent.test_model"
#: Says what a Flash-shape test file is (`ds4agent info` shows it); no validation reads it, so
#: such a file takes the strict path exactly as a real one does.
FLASH_TEST_KEY = "ds4agent.flash_test_file"


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int  # block_count (L)
    dim: int  # embedding_length (E)
    vocab: int  # vocab_size (V)
    n_heads: int  # attention.head_count (H)
    head_dim: int  # attention.key_length (Dh) = value_length
    rope_dim: int  # rope.dimension_count (Dr): the LAST Dr dims of each head are rotated
    q_lora_rank: int  # attention.q_lora_rank (Q)
    out_lora_rank: int  # attention.output_lora_rank (O)
    out_groups: int  # attention.output_group_count (G)
    n_experts: int  # expert_count
    n_experts_used: int  # expert_used_count (U)
    expert_ffn: int  # expert_feed_forward_length
    n_hash_layers: int  # hash_layer_count (NH): layers l < NH route by token id
    window: int  # attention.sliding_window (W), raw rows incl. the current token
    indexer_heads: int  # attention.indexer.head_count (Hi)
    indexer_dim: int  # attention.indexer.key_length (Di)
    indexer_top_k: int  # attention.indexer.top_k (K)
    hc_count: int  # hyper_connection.count (n streams)
    hc_sinkhorn_iters: int  # hyper_connection.sinkhorn_iterations
    hc_eps: float  # hyper_connection.epsilon
    ratios: tuple[int, ...]  # attention.compress_ratios, first L entries
    swiglu_clamp: tuple[float, ...]  # swiglu_clamp_exp, first L entries (a clamp VALUE)
    rope_base: float  # rope.freq_base (ratio-0 layers)
    compress_rope_base: float  # attention.compress_rope_freq_base (compressed layers, YaRN)
    yarn_factor: float  # rope.scaling.factor
    yarn_orig_ctx: int  # rope.scaling.original_context_length
    yarn_beta_fast: float  # rope.scaling.yarn_beta_fast
    yarn_beta_slow: float  # rope.scaling.yarn_beta_slow
    rms_eps: float  # attention.layer_norm_rms_epsilon
    expert_weights_scale: float  # expert_weights_scale
    n_kv_heads: int = 1  # attention.head_count_kv (MQA, must be 1)
    value_dim: int = 0  # attention.value_length (0 = same as head_dim)
    n_shared_experts: int = 1  # expert_shared_count (must be 1)
    expert_group_count: int = 0  # must be 0 (no group-limited routing)
    expert_group_used_count: int = 0
    expert_weights_norm: bool = True  # must be true
    context_length: int = field(default=0, compare=False)  # informational only
    name: str = field(default="", compare=False)

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def nope_dim(self) -> int:
        """Dn: non-RoPE dims of a head (the fp8 blocks live there)."""
        return self.head_dim - self.rope_dim

    @property
    def heads_per_group(self) -> int:
        return self.n_heads // self.out_groups

    @property
    def hc_mix(self) -> int:
        """n(2+n): HC mix width (pre n, post n, comb n·n)."""
        return self.hc_count * (2 + self.hc_count)

    def coff(self, layer: int) -> int:
        """Compressor lanes: 2 (overlapping windows) iff ratio 4, else 1 (model.md §1.1)."""
        return statelayout.coff(self.ratios[layer])

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.n_hash_layers

    def yarn_lo_hi(self) -> tuple[int, int]:
        """YaRN ramp bounds for compressed layers (Flash: lo 15, hi 25), model.md §3."""
        b = self.compress_rope_base
        dr = self.rope_dim

        def corr(beta: float) -> float:
            return dr * math.log(self.yarn_orig_ctx / (beta * 2.0 * math.pi)) / (2.0 * math.log(b))

        lo = max(0, math.floor(corr(self.yarn_beta_fast)))
        hi = min(dr - 1, math.ceil(corr(self.yarn_beta_slow)))
        return lo, hi

    def to_metadata(self) -> dict[str, Any]:
        """`deepseek4.*` key -> python value (the inverse of `from_metadata`).

        Integers are meant to be written as GGUF u32, floats as f32, `context_length` and
        `rope.scaling.original_context_length` as u32 (accepted as u64*), bools as bool,
        `compress_ratios` as a u32 array and `swiglu_clamp_exp` as an f32 array (see
        `METADATA_KINDS`).
        """
        out: dict[str, Any] = {}
        for key, attr, _kind in _KEYS:
            if attr == "value_dim":
                out[PREFIX + key] = self.value_dim or self.head_dim
            else:
                v = getattr(self, attr)
                out[PREFIX + key] = list(v) if isinstance(v, tuple) else v
        out[PREFIX + "context_length"] = self.context_length or 65536
        return out


# (key without prefix, attribute, kind) in model.md §6.2 table order: validation reports the
# first mismatch in this order. kind: u32 | float | u64 | bool | ratios | clamps
_KEYS: tuple[tuple[str, str, str], ...] = (
    ("block_count", "n_layers", "u32"),
    ("embedding_length", "dim", "u32"),
    ("vocab_size", "vocab", "u32"),
    ("attention.head_count", "n_heads", "u32"),
    ("attention.head_count_kv", "n_kv_heads", "u32"),
    ("attention.key_length", "head_dim", "u32"),
    ("attention.value_length", "value_dim", "u32"),
    ("rope.dimension_count", "rope_dim", "u32"),
    ("attention.q_lora_rank", "q_lora_rank", "u32"),
    ("attention.output_lora_rank", "out_lora_rank", "u32"),
    ("attention.output_group_count", "out_groups", "u32"),
    ("expert_count", "n_experts", "u32"),
    ("expert_used_count", "n_experts_used", "u32"),
    ("expert_feed_forward_length", "expert_ffn", "u32"),
    ("expert_shared_count", "n_shared_experts", "u32"),
    ("hash_layer_count", "n_hash_layers", "u32"),
    ("expert_group_count", "expert_group_count", "u32?"),
    ("expert_group_used_count", "expert_group_used_count", "u32?"),
    ("attention.sliding_window", "window", "u32"),
    ("attention.indexer.head_count", "indexer_heads", "u32"),
    ("attention.indexer.key_length", "indexer_dim", "u32"),
    ("attention.indexer.top_k", "indexer_top_k", "u32"),
    ("hyper_connection.count", "hc_count", "u32"),
    ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters", "u32"),
    ("hyper_connection.epsilon", "hc_eps", "float"),
    ("attention.compress_ratios", "ratios", "ratios"),
    ("swiglu_clamp_exp", "swiglu_clamp", "clamps"),
    ("rope.freq_base", "rope_base", "float"),
    ("rope.scaling.factor", "yarn_factor", "float"),
    ("rope.scaling.original_context_length", "yarn_orig_ctx", "u64"),
    ("rope.scaling.yarn_beta_fast", "yarn_beta_fast", "float"),
    ("rope.scaling.yarn_beta_slow", "yarn_beta_slow", "float"),
    ("attention.compress_rope_freq_base", "compress_rope_base", "float"),
    ("attention.layer_norm_rms_epsilon", "rms_eps", "float"),
    ("expert_weights_scale", "expert_weights_scale", "float"),
    ("expert_weights_norm", "expert_weights_norm", "bool"),
)

#: GGUF writing kind of every `deepseek4.*` key (for the test-model maker): "u32", "f32", "bool",
#: "u32_array", "f32_array".
METADATA_KINDS: dict[str, str] = {
    PREFIX + k: {"u32": "u32", "u32?": "u32", "u64": "u32", "float": "f32", "bool": "bool",
                 "ratios": "u32_array", "clamps": "f32_array"}[kind]
    for k, _a, kind in _KEYS
} | {PREFIX + "context_length": "u32"}


def flash_ratio(layer: int) -> int:
    """model.md §2: 0 for layers 0-1, 4 for even layers, 128 for odd layers."""
    return 0 if layer < 2 else (4 if layer % 2 == 0 else 128)


def flash_config() -> ModelConfig:
    """The DS4 Flash constants (model.md §1)."""
    n = 43
    return ModelConfig(
        n_layers=n, dim=4096, vocab=129280, n_heads=64, head_dim=512, rope_dim=64,
        q_lora_rank=1024, out_lora_rank=1024, out_groups=8, n_experts=256, n_experts_used=6,
        expert_ffn=2048, n_hash_layers=3, window=128, indexer_heads=64, indexer_dim=128,
        indexer_top_k=512, hc_count=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        ratios=tuple(flash_ratio(i) for i in range(n)), swiglu_clamp=(10.0,) * n,
        rope_base=10000.0, compress_rope_base=160000.0, yarn_factor=16.0, yarn_orig_ctx=65536,
        yarn_beta_fast=32.0, yarn_beta_slow=1.0, rms_eps=1e-6, expert_weights_scale=1.5,
        n_kv_heads=1, value_dim=512, n_shared_experts=1, expert_group_count=0,
        expert_group_used_count=0, expert_weights_norm=True, name="flash",
    )


# ---- reading metadata ------------------------------------------------------------------------

_INT_TYPES = {"UINT32"}
_U64_TYPES = {"UINT32", "UINT64"}
_FLOAT_TYPES = {"FLOAT32", "FLOAT64", "UINT32", "INT32"}


def _type_name(t: Any) -> str | None:
    if t is None:
        return None
    name = getattr(t, "name", None)
    if name is not None:
        return str(name).upper()
    if isinstance(t, int):
        try:
            from gguf import GGUFValueType

            return GGUFValueType(t).name.upper()
        except Exception:  # unknown type id: report it as a number
            return str(t)
    return str(t).upper()


def from_metadata(
    meta: Mapping[str, Any],
    *,
    mode: str = "flash",
    types: Mapping[str, Any] | None = None,
    name: str = "",
) -> ModelConfig:
    """Build and validate a ModelConfig from GGUF metadata.

    meta:  key -> python value (int, float, bool, list/tuple/ndarray for arrays); keys other than
           `deepseek4.*` are ignored.
    types: optional key -> GGUF value type (gguf.GGUFValueType, its int, or its name); for arrays
           the ELEMENT type. When given, the §6.2 type rules are enforced ("u32" = exactly u32,
           "float" = f32/f64/u32/i32, "u64*" = u64/u32, ratios u32/i32, clamps f32/f64).
    mode:  "flash" (strict DS4 Flash values) or "test" (consistency checks only).
    Raises ConfigError naming the first offending key.
    """
    if mode not in ("flash", "test"):
        raise ConfigError(f"unknown config mode {mode!r} (expected 'flash' or 'test')")
    values: dict[str, Any] = {}
    for key, attr, kind in _KEYS:
        full = PREFIX + key
        if full not in meta:
            if kind == "u32?":
                values[attr] = 0
                continue
            raise ConfigError(f"model metadata is missing the key {full!r}")
        raw = meta[full]
        tname = _type_name(types.get(full)) if types is not None else None
        values[attr] = _convert(full, raw, kind, tname)
    L = values["n_layers"]
    if L < 1:
        raise ConfigError(f"{PREFIX}block_count must be at least 1 (got {L})")
    for attr, key in (("ratios", "attention.compress_ratios"), ("swiglu_clamp", "swiglu_clamp_exp")):
        seq = values[attr]
        if len(seq) < L:
            raise ConfigError(
                f"{PREFIX}{key} has {len(seq)} entries, fewer than block_count = {L}"
            )
        values[attr] = tuple(seq[:L])
    ctx = meta.get(PREFIX + "context_length", 0)
    try:
        values["context_length"] = int(ctx)
    except (TypeError, ValueError):
        values["context_length"] = 0
    cfg = ModelConfig(**values, name=name or mode)
    if mode == "flash":
        _check_flash(cfg)
    validate(cfg)
    return cfg


def model_mode(metadata: Mapping[str, Any]) -> str:
    """"test" for a file written by make-test-model (TEST_MODEL_KEY), else "flash"."""
    return "test" if metadata.get(TEST_MODEL_KEY) else "flash"


def gguf_config(gf: GGUFFile, *, mode: str | None = None) -> ModelConfig:
    """The ModelConfig of an open GGUF file, validated in `mode` (default: the file's own,
    model_mode), with the §6.2 type rules (the value types the file declares)."""
    types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
    return from_metadata(gf.metadata, mode=mode or model_mode(gf.metadata), types=types,
                         name=str(gf.metadata.get("general.name", "")))


def open_model(path: str | os.PathLike[str]) -> tuple[GGUFFile, ModelConfig]:
    """Open a GGUF model file and read its config (the one way every caller does it: the loader,
    the pipeline's layer split, `info`, `dump-logits`). The caller closes the file; on an error
    it is closed here."""
    gf = GGUFFile.open(path)
    try:
        return gf, gguf_config(gf)
    except BaseException:
        gf.close()
        raise


def _convert(key: str, raw: Any, kind: str, tname: str | None) -> Any:
    def bad_type(expected: str) -> ConfigError:
        return ConfigError(f"metadata key {key!r} has type {tname}, expected {expected}")

    if kind in ("u32", "u32?"):
        if tname is not None and tname not in _INT_TYPES:
            raise bad_type("u32")
        return _as_int(key, raw)
    if kind == "u64":
        if tname is not None and tname not in _U64_TYPES:
            raise bad_type("u64 or u32")
        return _as_int(key, raw)
    if kind == "float":
        if tname is not None and tname not in _FLOAT_TYPES:
            raise bad_type("f32, f64, u32 or i32")
        return _as_float(key, raw)
    if kind == "bool":
        if tname is not None and tname != "BOOL":
            raise bad_type("bool")
        if isinstance(raw, (bool, np.bool_)):
            return bool(raw)
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        raise ConfigError(f"metadata key {key!r} must be a bool (got {raw!r})")
    if kind in ("ratios", "clamps"):
        if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
            raise ConfigError(f"metadata key {key!r} must be an array (got {raw!r})")
        if kind == "ratios":
            if tname is not None and tname not in ("UINT32", "INT32"):
                raise bad_type("an array of u32 or i32")
            out = tuple(_as_int(key, v, allow_negative=True) for v in raw)
            for i, v in enumerate(out):
                if v < 0:
                    raise ConfigError(f"metadata key {key!r} has a negative ratio {v} at layer {i}")
            return out
        if tname is not None and tname not in ("FLOAT32", "FLOAT64"):
            raise bad_type("an array of f32 or f64")
        return tuple(_as_float(key, v) for v in raw)
    raise AssertionError(kind)


def _as_int(key: str, raw: Any, allow_negative: bool = False) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"metadata key {key!r} must be an integer (got {raw!r})")
    try:
        f = float(raw)
        v = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"metadata key {key!r} must be an integer (got {raw!r})") from None
    if f != v or (v < 0 and not allow_negative):
        raise ConfigError(f"metadata key {key!r} must be a non-negative integer (got {raw!r})")
    return v


def _as_float(key: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"metadata key {key!r} must be a number (got {raw!r})")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"metadata key {key!r} must be a number (got {raw!r})") from None
    if not math.isfinite(v):
        raise ConfigError(f"metadata key {key!r} must be finite (got {raw!r})")
    return v


def _check_flash(cfg: ModelConfig) -> None:
    """Strict DS4 Flash check; names the first mismatching key in §6.2 table order."""
    want = flash_config()
    for key, attr, kind in _KEYS:
        got_v = getattr(cfg, attr)
        want_v = getattr(want, attr)
        full = PREFIX + key
        if kind == "float":
            if abs(got_v - want_v) > max(1.0, abs(want_v)) * 1e-6:
                raise ConfigError(
                    f"not a DS4 Flash model: {full} is {got_v:g}, expected {want_v:g}"
                )
        elif kind == "ratios":
            for i, (g, w) in enumerate(zip(got_v, want_v, strict=True)):
                if g != w:
                    raise ConfigError(
                        f"not a DS4 Flash model: {full}[{i}] is {g}, expected {w}"
                    )
        elif kind == "clamps":
            for i, (g, w) in enumerate(zip(got_v, want_v, strict=True)):
                if abs(g - w) > max(1.0, abs(w)) * 1e-6:
                    raise ConfigError(
                        f"not a DS4 Flash model: {full}[{i}] is {g:g}, expected {w:g}"
                    )
        elif got_v != want_v:
            raise ConfigError(f"not a DS4 Flash model: {full} is {got_v}, expected {want_v}")


def validate(cfg: ModelConfig) -> None:
    """Internal-consistency checks every config (flash or test) must pass."""

    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"unsupported model metadata: {PREFIX}{key} {msg}")

    positive = (
        ("block_count", cfg.n_layers), ("embedding_length", cfg.dim), ("vocab_size", cfg.vocab),
        ("attention.head_count", cfg.n_heads), ("attention.key_length", cfg.head_dim),
        ("rope.dimension_count", cfg.rope_dim), ("attention.q_lora_rank", cfg.q_lora_rank),
        ("attention.output_lora_rank", cfg.out_lora_rank),
        ("attention.output_group_count", cfg.out_groups), ("expert_count", cfg.n_experts),
        ("expert_used_count", cfg.n_experts_used),
        ("expert_feed_forward_length", cfg.expert_ffn),
        ("attention.sliding_window", cfg.window),
        ("attention.indexer.head_count", cfg.indexer_heads),
        ("attention.indexer.key_length", cfg.indexer_dim),
        ("attention.indexer.top_k", cfg.indexer_top_k), ("hyper_connection.count", cfg.hc_count),
        ("hyper_connection.sinkhorn_iterations", cfg.hc_sinkhorn_iters),
        ("rope.scaling.original_context_length", cfg.yarn_orig_ctx),
    )
    for key, v in positive:
        need(v > 0, key, f"must be positive (got {v})")
    need(cfg.n_kv_heads == 1, "attention.head_count_kv", f"must be 1 (MQA), got {cfg.n_kv_heads}")
    need(cfg.value_dim in (0, cfg.head_dim), "attention.value_length",
         f"must equal key_length {cfg.head_dim} (key = value), got {cfg.value_dim}")
    need(cfg.rope_dim % 2 == 0 and cfg.rope_dim < cfg.head_dim, "rope.dimension_count",
         f"must be even and smaller than key_length {cfg.head_dim} (got {cfg.rope_dim})")
    need(cfg.nope_dim % 64 == 0, "attention.key_length",
         f"minus rope.dimension_count must be a multiple of 64 for the fp8 blocks "
         f"(got {cfg.head_dim} - {cfg.rope_dim})")
    need(cfg.n_heads % cfg.out_groups == 0, "attention.output_group_count",
         f"{cfg.out_groups} must divide head_count {cfg.n_heads}")
    di = cfg.indexer_dim
    need(di & (di - 1) == 0 and di % 32 == 0 and di >= cfg.rope_dim,
         "attention.indexer.key_length",
         f"must be a power of two, a multiple of 32 and at least rope.dimension_count (got {di})")
    need(cfg.n_experts_used <= cfg.n_experts, "expert_used_count",
         f"{cfg.n_experts_used} exceeds expert_count {cfg.n_experts}")
    need(cfg.n_shared_experts == 1, "expert_shared_count",
         f"must be 1 (got {cfg.n_shared_experts})")
    need(cfg.expert_group_count == 0 and cfg.expert_group_used_count == 0, "expert_group_count",
         "must be 0: group-limited routing is not supported")
    need(cfg.expert_weights_norm, "expert_weights_norm", "must be true")
    need(cfg.n_hash_layers <= cfg.n_layers, "hash_layer_count",
         f"{cfg.n_hash_layers} exceeds block_count {cfg.n_layers}")
    for i, c in enumerate(cfg.swiglu_clamp):
        need(c > 0, "swiglu_clamp_exp", f"entry {i} must be a positive clamp value (got {c})")
    for key, value in (("rope.freq_base", cfg.rope_base),
                   ("attention.compress_rope_freq_base", cfg.compress_rope_base),
                   ("rope.scaling.factor", cfg.yarn_factor),
                   ("rope.scaling.yarn_beta_fast", cfg.yarn_beta_fast),
                   ("rope.scaling.yarn_beta_slow", cfg.yarn_beta_slow),
                   ("attention.layer_norm_rms_epsilon", cfg.rms_eps),
                   ("hyper_connection.epsilon", cfg.hc_eps)):
        need(value > 0, key, f"must be positive (got {value:g})")
    need(cfg.compress_rope_base > 1 and cfg.rope_base > 1, "rope.freq_base", "must exceed 1")


# ---- named test configs ----------------------------------------------------------------------


def _test(name: str, **kw: Any) -> ModelConfig:
    base: dict[str, Any] = dict(
        hc_count=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rope_base=10000.0,
        compress_rope_base=160000.0, yarn_factor=16.0, yarn_orig_ctx=65536, yarn_beta_fast=32.0,
        yarn_beta_slow=1.0, rms_eps=1e-6, expert_weights_scale=1.5, n_kv_heads=1,
        n_shared_experts=1, expert_weights_norm=True, context_length=65536,
    )
    base.update(kw)
    L = base["n_layers"]
    base.setdefault("swiglu_clamp", (10.0,) * L)
    base["value_dim"] = base["head_dim"]
    cfg = ModelConfig(name=name, **base)
    validate(cfg)
    return cfg


def _micro() -> ModelConfig:
    return _test(
        "micro", n_layers=4, dim=32, vocab=512, n_heads=4, head_dim=80, rope_dim=16,
        q_lora_rank=32, out_lora_rank=16, out_groups=2, n_experts=8, n_experts_used=2,
        expert_ffn=32, n_hash_layers=2, window=8, indexer_heads=2, indexer_dim=32,
        indexer_top_k=4, ratios=(0, 0, 4, 16),
    )


def _tiny() -> ModelConfig:
    return _test(
        "tiny", n_layers=4, dim=64, vocab=129280, n_heads=4, head_dim=96, rope_dim=32,
        q_lora_rank=64, out_lora_rank=32, out_groups=2, n_experts=8, n_experts_used=2,
        expert_ffn=64, n_hash_layers=2, window=16, indexer_heads=4, indexer_dim=64,
        indexer_top_k=8, ratios=(0, 0, 4, 16),
    )


def _small() -> ModelConfig:
    return _test(
        "small", n_layers=4, dim=512, vocab=129280, n_heads=8, head_dim=192, rope_dim=64,
        q_lora_rank=256, out_lora_rank=256, out_groups=2, n_experts=16, n_experts_used=4,
        expert_ffn=256, n_hash_layers=1, window=128, indexer_heads=8, indexer_dim=128,
        indexer_top_k=128, ratios=(0, 4, 128, 4),
    )


TEST_CONFIGS = {"micro": _micro, "tiny": _tiny, "small": _small}


def test_config(name: str, **overrides: Any) -> ModelConfig:
    """A named test config ('micro', 'tiny', 'small'), optionally with fields replaced."""
    try:
        cfg = TEST_CONFIGS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown test config {name!r} (choose from {', '.join(sorted(TEST_CONFIGS))})"
        ) from None
    if overrides:
        # Keep the derived fields consistent with what was overridden.
        if "head_dim" in overrides and "value_dim" not in overrides:
            overrides["value_dim"] = overrides["head_dim"]
        if "n_layers" in overrides and "swiglu_clamp" not in overrides:
            overrides["swiglu_clamp"] = (cfg.swiglu_clamp[0],) * overrides["n_layers"]
        cfg = replace(cfg, **overrides)
        if len(cfg.ratios) != cfg.n_layers:
            raise ConfigError(f"test config {name!r}: {len(cfg.ratios)} ratios for {cfg.n_layers} layers")
        validate(cfg)
    return cfg


test_config.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
