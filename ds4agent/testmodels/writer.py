"""Test models: a DS4-architecture GGUF with deterministic random weights (issue 4, item 3).

`make_test_model(path, config="tiny", seed=0)` writes the real `deepseek4.*` metadata keys and
the real tensor names/types/dims of model.md §6.3 for a named test config (config.py), through
the `gguf` package's writer, so the file takes exactly the path a real ds4 GGUF takes through
`gguf.py` and the weight loader. `ds4agent make-test-model OUT.gguf [--config NAME] [--seed N]`
is the command-line face.

With `experts="q2"` or `"q4"` (and always for `config="flash"`) the file is instead a
Flash-layout file with ds4's quantised types and tokenizer and no test-model marker, written by
flashmodel.py (`ds4agent make-test-model OUT --config flash [--experts q2|q4]`).

Weights are scaled so activations stay O(1) through any depth: every matrix is N(0, 1/fan_in)
(variance-preserving mat-vec), norms are ~1, the hyper-connection mixers are small so the
Sinkhorn mix starts close to uniform, and the routed/shared experts are small so residual
streams grow slowly. Q8_0 tensors are quantised here with a vectorised numpy round-to-nearest
(d = amax/127 as f16), which is all a test file needs: the loader only has to reproduce the
stored d·q exactly.

The table `tensor_table(cfg)` is the writer's view of the tensor names; the loader's view is
C1's weights.py. The load round-trip test keeps the two in agreement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ds4agent.engine.config import METADATA_KINDS, TEST_CONFIGS, ModelConfig, flash_config, test_config
from ds4agent.engine.errors import ConfigError, EngineError, run_file_command
from ds4agent.fsutil import atomic_path

ARCH = "deepseek4"
# Marks a file as a test model: the engine then validates its metadata in the permissive "test"
# mode; every file without it (ds4's real weights) must pass the strict Flash checks.
TEST_MODEL_KEY = "ds4agent.test_model"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # row-major array shape (GGML dims reversed)
    ggml_type: str  # "F32", "F16", "I32", "Q8_0"
    init: str  # how to fill it: "linear", "norm", "embed", "small", "hc_scale", "hc_base",
    #            "sink", "tid2eid", "bias"


def tensor_table(cfg: ModelConfig) -> list[TensorSpec]:
    """Every tensor of a DS4 GGUF for `cfg`, in file order (model.md §6.3, §1.1 general rules)."""
    E, V, H, Dh = cfg.dim, cfg.vocab, cfg.n_heads, cfg.head_dim
    Q, G, O = cfg.q_lora_rank, cfg.out_groups, cfg.out_lora_rank
    n, mix = cfg.hc_count, cfg.hc_mix
    Hi, Di = cfg.indexer_heads, cfg.indexer_dim
    NE, U, F = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn
    t: list[TensorSpec] = [
        TensorSpec("token_embd.weight", (V, E), "F16", "embed"),
        TensorSpec("output_hc_fn.weight", (n, n * E), "F16", "small"),
        TensorSpec("output_hc_scale.weight", (1,), "F32", "hc_scale"),
        TensorSpec("output_hc_base.weight", (n,), "F32", "hc_base"),
        TensorSpec("output_norm.weight", (E,), "F32", "norm"),
        TensorSpec("output.weight", (V, E), "Q8_0", "linear"),
    ]
    for li in range(cfg.n_layers):
        b = f"blk.{li}."
        r = cfg.ratios[li]
        coff = cfg.coff(li)
        for sub in ("attn", "ffn"):
            t += [
                TensorSpec(f"{b}hc_{sub}_fn.weight", (mix, n * E), "F16", "small"),
                TensorSpec(f"{b}hc_{sub}_scale.weight", (3,), "F32", "hc_scale"),
                TensorSpec(f"{b}hc_{sub}_base.weight", (mix,), "F32", "hc_base"),
            ]
        t += [
            TensorSpec(f"{b}attn_norm.weight", (E,), "F32", "norm"),
            TensorSpec(f"{b}ffn_norm.weight", (E,), "F32", "norm"),
            TensorSpec(f"{b}attn_q_a.weight", (Q, E), "Q8_0", "linear"),
            TensorSpec(f"{b}attn_q_a_norm.weight", (Q,), "F32", "norm"),
            TensorSpec(f"{b}attn_q_b.weight", (H * Dh, Q), "Q8_0", "linear"),
            TensorSpec(f"{b}attn_kv.weight", (Dh, E), "Q8_0", "linear"),
            TensorSpec(f"{b}attn_kv_a_norm.weight", (Dh,), "F32", "norm"),
            TensorSpec(f"{b}attn_sinks.weight", (H,), "F32", "sink"),
            TensorSpec(f"{b}attn_output_a.weight", (G * O, (H // G) * Dh), "Q8_0", "linear"),
            TensorSpec(f"{b}attn_output_b.weight", (E, G * O), "Q8_0", "linear"),
        ]
        if r != 0:
            t += [
                TensorSpec(f"{b}attn_compressor_ape.weight", (r, coff * Dh), "F16", "small"),
                TensorSpec(f"{b}attn_compressor_kv.weight", (coff * Dh, E), "F16", "linear"),
                TensorSpec(f"{b}attn_compressor_gate.weight", (coff * Dh, E), "F16", "linear"),
                TensorSpec(f"{b}attn_compressor_norm.weight", (Dh,), "F32", "norm"),
            ]
        if r == 4:
            t += [
                TensorSpec(f"{b}indexer.attn_q_b.weight", (Hi * Di, Q), "F16", "linear"),
                TensorSpec(f"{b}indexer.proj.weight", (Hi, E), "F16", "linear"),
                TensorSpec(f"{b}indexer_compressor_ape.weight", (4, 2 * Di), "F16", "small"),
                TensorSpec(f"{b}indexer_compressor_kv.weight", (2 * Di, E), "F16", "linear"),
                TensorSpec(f"{b}indexer_compressor_gate.weight", (2 * Di, E), "F16", "linear"),
                TensorSpec(f"{b}indexer_compressor_norm.weight", (Di,), "F32", "norm"),
            ]
        t.append(TensorSpec(f"{b}ffn_gate_inp.weight", (NE, E), "F16", "linear"))
        if cfg.is_hash_layer(li):
            t.append(TensorSpec(f"{b}ffn_gate_tid2eid.weight", (V, U), "I32", "tid2eid"))
        else:
            t.append(TensorSpec(f"{b}exp_probs_b.bias", (NE,), "F32", "bias"))
        t += [
            # Test mode accepts F16 routed experts (model.md §1.1); real files carry 2/4-bit blocks.
            TensorSpec(f"{b}ffn_gate_exps.weight", (NE, F, E), "F16", "expert"),
            TensorSpec(f"{b}ffn_up_exps.weight", (NE, F, E), "F16", "expert"),
            TensorSpec(f"{b}ffn_down_exps.weight", (NE, E, F), "F16", "expert"),
            TensorSpec(f"{b}ffn_gate_shexp.weight", (F, E), "Q8_0", "expert"),
            TensorSpec(f"{b}ffn_up_shexp.weight", (F, E), "Q8_0", "expert"),
            TensorSpec(f"{b}ffn_down_shexp.weight", (E, F), "Q8_0", "expert"),
        ]
    return t


def _values(spec: TensorSpec, cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    """Float values (or ints) for one tensor; see the module docstring for the scales."""
    shape = spec.shape
    fan_in = shape[-1]
    kind = spec.init
    if kind == "linear":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(fan_in**-0.5)
    if kind == "expert":
        # Experts add into the residual stream of every layer: keep them at half scale.
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5 * fan_in**-0.5)
    if kind == "embed":
        return rng.standard_normal(shape, dtype=np.float32)
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "small":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1 * fan_in**-0.5)
    if kind == "hc_scale":
        return (0.5 + 0.5 * rng.random(shape)).astype(np.float32)
    if kind == "hc_base":
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "sink":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "tid2eid":
        # Hash routing picks U distinct experts per token id: the first U of a random permutation.
        keys = rng.random((shape[0], cfg.n_experts), dtype=np.float32)
        return np.argsort(keys, axis=1, kind="stable")[:, : shape[1]].astype(np.int32)
    raise AssertionError(kind)


def _q8_0_blocks(values: np.ndarray) -> np.ndarray:
    """Quantise rows to Q8_0 blocks (d = amax/127 as f16, q = round(w/d)); uint8 [rows, bytes]."""
    rows = int(np.prod(values.shape[:-1]))
    cols = values.shape[-1]
    x = values.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = (amax / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)
    safe = np.where(d32 == 0, 1.0, d32)
    q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    out[:, :, 0:2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(*values.shape[:-1], cols // 32 * 34)


def _encode(spec: TensorSpec, values: np.ndarray) -> np.ndarray:
    if spec.ggml_type == "F32":
        return values.astype(np.float32)
    if spec.ggml_type == "F16":
        return values.astype(np.float16)
    if spec.ggml_type == "I32":
        return values.astype(np.int32)
    if spec.ggml_type == "Q8_0":
        return _q8_0_blocks(values)
    raise AssertionError(spec.ggml_type)


def _add_metadata(writer, cfg: ModelConfig) -> None:
    from gguf import GGUFValueType as VT

    kinds = {"u32": VT.UINT32, "f32": VT.FLOAT32, "bool": VT.BOOL}
    for key, value in cfg.to_metadata().items():
        kind = METADATA_KINDS.get(key, "u32")
        if kind == "u32_array":
            writer.add_key_value(key, [int(v) for v in value], VT.ARRAY, sub_type=VT.UINT32)
        elif kind == "f32_array":
            writer.add_key_value(key, [float(v) for v in value], VT.ARRAY, sub_type=VT.FLOAT32)
        elif kind == "bool":
            writer.add_key_value(key, bool(value), VT.BOOL)
        elif kind == "f32":
            writer.add_key_value(key, float(value), VT.FLOAT32)
        else:
            writer.add_key_value(key, int(value), kinds[kind])


def named_config(name: str) -> ModelConfig:
    """A config make-test-model accepts by name: 'flash' or a named test config."""
    if name == "flash":
        return flash_config()
    try:
        return test_config(name)
    except ConfigError:
        names = ", ".join(sorted(("flash", *TEST_CONFIGS)))
        raise ConfigError(f"unknown test config {name!r} (choose from {names})") from None


def make_test_model(path: str | os.PathLike[str], config: str | ModelConfig = "tiny",
                    seed: int = 0, experts: str | None = None) -> Path:
    """Write a DS4-architecture GGUF with deterministic random weights; returns the path.

    experts: None writes F16 routed experts and the test-model marker (the engine then checks the
    metadata permissively); "q2" / "q4" writes ds4's quantised layout without the marker
    (flashmodel.py), which the Flash config always gets (F16 experts would take 86 GB).
    The same arguments always give the same bytes. Written atomically (ds4agent.fsutil), so a
    failed write never leaves a half file under `path` and keeps the file that was there.
    """
    from gguf import GGMLQuantizationType, GGUFWriter

    cfg = named_config(config) if isinstance(config, str) else config
    if not isinstance(seed, int) or seed < 0:
        raise EngineError(f"--seed must be a non-negative integer (got {seed})")
    if experts is None and cfg == flash_config():
        experts = "q2"
    if experts is not None:
        from ds4agent.testmodels.flash import write_flash_model

        return write_flash_model(path, cfg, experts=experts, seed=seed)
    path = Path(path)
    rng = np.random.default_rng(seed)
    # The gguf writer opens its file by name: fsutil's atomic_path gives it a temp path beside
    # the target and renames it over `path` only once the whole file is written.
    with atomic_path(path, make_parents=True) as tmp:
        writer = GGUFWriter(tmp, ARCH)
        try:
            writer.add_name(f"ds4agent test model ({cfg.name or 'custom'}, seed {seed})")
            writer.add_bool(TEST_MODEL_KEY, True)
            _add_metadata(writer, cfg)
            for spec in tensor_table(cfg):
                data = _encode(spec, _values(spec, cfg, rng))
                if spec.ggml_type == "Q8_0":
                    writer.add_tensor(spec.name, data, raw_shape=data.shape,
                                      raw_dtype=GGMLQuantizationType.Q8_0)
                else:
                    writer.add_tensor(spec.name, data)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return path


def main(args) -> int:
    """`ds4agent make-test-model OUT.gguf [--config NAME] [--experts q2|q4] [--seed N]`."""
    experts = getattr(args, "experts", None)

    def action() -> str:
        # A small config with quantised experts and no marker would be refused by the engine's
        # strict check: from the command line, the quantised layout is the Flash file's.
        if experts is not None and args.config != "flash":
            raise EngineError("--experts applies to --config flash (the Flash-shape test file)")
        out = make_test_model(args.out, config=args.config, seed=args.seed, experts=experts)
        flavour = f", {experts or 'q2'} experts" if args.config == "flash" else ""
        return (f"wrote {out} ({args.config}{flavour}, seed {args.seed}, "
                f"{out.stat().st_size / 1e6:.1f} MB)")

    return run_file_command(action, failure=f"cannot write {args.out}")
