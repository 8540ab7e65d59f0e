"""Official DeepSeek-V4-Flash safetensors -> an MLX safetensors directory (`ds4agent convert SRC OUT`).

Source layout (DeepSeek's release; tensor names of model.md §6.3, last paragraph):
  * dense projections (attention wq_a/wq_b/wkv/wo_a/wo_b, shared experts w1/w2/w3): weight
    F8_E4M3 [out, in] with a `.scale` sibling F8_E8M0 [ceil(out/128), ceil(in/128)]: one power of
    two per 128 x 128 tile, w = e4m3(code) * 2^(s - 127);
  * routed experts `layers.N.ffn.experts.E.w{1,3,2}`: weight I8 [out, in/2] holding two E2M1 codes
    per byte (element 2i in the low nibble, 2i+1 in the high nibble), `.scale` F8_E8M0 [out, in/32]:
    w = e2m1(code) * 2^(s - 127);
  * everything else BF16 / F32 / I64 (tid2eid), copied exactly (I64 ids narrowed to int32).

Output: per-layer safetensors files written with MLX, under our canonical (GGUF) tensor names, and
a `config.json` describing the quantised tensors. The repacks are lossless reinterpretations:
  * FP8 -> MLX `mxfp8` (group 32, E4M3 codes, E8M0 scale per group): the codes are the same bytes
    (packed four per uint32, little endian = MLX's element order); each 128-wide tile scale is
    repeated for the 4 groups of 32 it covers and for each of the tile's (up to) 128 rows;
  * FP4 -> MLX `mxfp4` (group 32, E2M1 codes, E8M0 scale per group): the packed bytes are already
    MLX's nibble order (element i of a uint32 at bits 4i), the scales are the same bytes.
  Dequantising the output with `mx.dequantize(..., mode=...)` gives exactly the source values
  (tests/weights/test_convert.py). Routed experts are stacked to [n_experts, out, in/8].

`load_converted(path)` is the engine's loader for such a directory (loader.load_engine takes a directory).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..fsutil import atomic_file, current_umask, fsync_dir, fsync_file
from .errors import EngineError

FP8_TILE = 128
MX_GROUP = 32


class ConvertError(EngineError):
    """The source checkpoint cannot be converted (the message names the file or tensor)."""


# ---- safetensors (read: mmap, no copies; dtypes MLX/numpy lack are read as raw bytes) --------

_ST_DTYPES = {
    "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "F8_E5M2": np.uint8, "I8": np.int8, "U8": np.uint8,
    "BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64, "I16": np.int16,
    "I32": np.int32, "I64": np.int64, "U16": np.uint16, "U32": np.uint32, "BOOL": np.bool_,
}


class SafeTensorsFile:
    """A safetensors file: 8-byte little-endian header length, JSON header, then the data."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, struct.error, ValueError) as err:
            raise ConvertError(f"{self.path}: not a readable safetensors file ({err})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.tensors: dict[str, dict] = header
        self._base = 8 + n
        self._mm: np.memmap | None = None

    def get(self, name: str) -> tuple[str, np.ndarray]:
        """(safetensors dtype, array view) of a tensor; BF16/F8 come back as raw integers."""
        info = self.tensors[name]
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ConvertError(f"{self.path}: tensor {name!r} has unsupported dtype {dt}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        start, end = info["data_offsets"]
        raw = self._mm[self._base + start : self._base + end]
        return dt, raw.view(_ST_DTYPES[dt]).reshape(info["shape"])


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Write {name: (safetensors dtype, array)} (used to build official-layout fixtures)."""
    header, offset, chunks = {}, 0, []
    for name, (dt, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with atomic_file(path) as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        for c in chunks:
            fh.write(c)


def open_checkpoint(src: Path) -> dict[str, SafeTensorsFile]:
    """Tensor name -> the file holding it, over every *.safetensors in `src`."""
    src = Path(src)
    if not src.is_dir():
        raise ConvertError(f"{src} is not a directory of safetensors files")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{src} holds no .safetensors files")
    where: dict[str, SafeTensorsFile] = {}
    for f in files:
        st = SafeTensorsFile(f)
        for name in st.tensors:
            where[name] = st
    return where


# ---- exact decoders of the source formats (the definition the repacks are tested against) -----


def e8m0_to_f32(s: np.ndarray) -> np.ndarray:
    """E8M0 scale bytes -> float32 2^(s-127) (s = 255 is NaN)."""
    s = np.asarray(s, dtype=np.uint8).astype(np.int32)
    out = np.ldexp(np.float32(1.0), s - 127).astype(np.float32)
    return np.where(s == 255, np.float32(np.nan), out)


def e4m3_to_f32(codes: np.ndarray) -> np.ndarray:
    """E4M3FN codes -> float32: exponent bias 7, subnormals m*2^-9, S.1111.111 = NaN, no inf."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int32)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m * np.float32(2.0**-9), np.ldexp(1.0 + m / 8.0, e - 7)).astype(np.float32)
    mag = np.where((c & 0x7F) == 0x7F, np.float32(np.nan), mag)
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def e2m1_to_f32(codes: np.ndarray) -> np.ndarray:
    c = np.asarray(codes, dtype=np.uint8)
    mag = _E2M1[c & 7]
    return np.where(c & 8, -mag, mag).astype(np.float32)


def dequant_fp8_block(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    out, n = weight.shape
    s = e8m0_to_f32(scale)
    s_full = np.repeat(np.repeat(s, FP8_TILE, axis=0)[:out], FP8_TILE, axis=1)[:, :n]
    return e4m3_to_f32(weight.view(np.uint8)) * s_full


def dequant_fp4(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    b = weight.view(np.uint8)
    codes = np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], -1)
    return e2m1_to_f32(codes) * np.repeat(e8m0_to_f32(scale), MX_GROUP, axis=1)


# ---- repacks ---------------------------------------------------------------------------------


def fp8_block_to_mxfp8(weight: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 [out, in] + E8M0 [ceil(out/128), ceil(in/128)] -> (wq uint32 [out, in/4],
    scales uint8 [out, in/32]) for MLX mode "mxfp8", group 32. Lossless."""
    out, n = weight.shape
    want = (-(-out // FP8_TILE), -(-n // FP8_TILE))
    if n % MX_GROUP:
        raise ConvertError(f"FP8 weight of {n} columns is not a multiple of {MX_GROUP}")
    if tuple(scale.shape) != want:
        raise ConvertError(f"FP8 block scale has shape {list(scale.shape)}, expected {list(want)}")
    wq = np.ascontiguousarray(weight.view(np.uint8)).view("<u4")
    per_group = np.repeat(scale.view(np.uint8), FP8_TILE // MX_GROUP, axis=1)[:, : n // MX_GROUP]
    scales = np.ascontiguousarray(np.repeat(per_group, FP8_TILE, axis=0)[:out])
    return wq, scales


def fp4_to_mxfp4(weight: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed E2M1 [out, in/2] + E8M0 [out, in/32] -> (wq uint32 [out, in/8], scales uint8
    [out, in/32]) for MLX mode "mxfp4", group 32. Lossless (same bytes)."""
    out, half = weight.shape
    if (2 * half) % MX_GROUP or tuple(scale.shape) != (out, 2 * half // MX_GROUP):
        raise ConvertError(
            f"FP4 weight [{out}, {half}] needs a scale of [{out}, {2 * half // MX_GROUP}], got {list(scale.shape)}"
        )
    return np.ascontiguousarray(weight.view(np.uint8)).view("<u4"), np.ascontiguousarray(scale.view(np.uint8))


# ---- names -----------------------------------------------------------------------------------

_TOP = {
    "embed.weight": "token_embd.weight", "head.weight": "output.weight", "norm.weight": "output_norm.weight",
    "hc_head_fn": "output_hc_fn.weight", "hc_head_scale": "output_hc_scale.weight",
    "hc_head_base": "output_hc_base.weight",
}
_LAYER = {
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_scale": "hc_attn_scale.weight",
    "hc_attn_base": "hc_attn_base.weight", "hc_ffn_fn": "hc_ffn_fn.weight",
    "hc_ffn_scale": "hc_ffn_scale.weight", "hc_ffn_base": "hc_ffn_base.weight",
    "attn.wq_a.weight": "attn_q_a.weight", "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wq_b.weight": "attn_q_b.weight", "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight", "attn.attn_sink": "attn_sinks.weight",
    "attn.wo_a.weight": "attn_output_a.weight", "attn.wo_b.weight": "attn_output_b.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight", "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight", "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight", "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
}
_EXPERT_RE = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")
_EXPERT_NAME = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}


def canonical_name(official: str) -> str | None:
    """Our tensor name for an official one (None: not used, e.g. mtp.* or scale siblings)."""
    if official in _TOP:
        return _TOP[official]
    m = re.match(r"^layers\.(\d+)\.(.+)$", official)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}"
    return None


# ---- conversion ------------------------------------------------------------------------------


def _to_mx(dt: str, arr: np.ndarray):
    import mlx.core as mx

    if dt == "BF16":
        return mx.array(np.ascontiguousarray(arr)).view(mx.bfloat16)
    if dt == "I64":
        if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
            raise ConvertError("an I64 tensor does not fit int32")
        return mx.array(arr.astype(np.int32))
    if dt in ("F8_E4M3", "F8_E8M0", "F8_E5M2", "I8"):
        raise ConvertError(f"unexpected unscaled {dt} tensor")
    return mx.array(np.ascontiguousarray(arr))


def _group_tensors(where: dict[str, SafeTensorsFile]):
    """The checkpoint's tensor names grouped as the output files are: (top-level (official,
    canonical) names, the same per layer, routed experts per (layer, projection) by expert id,
    names with no canonical name)."""
    layers: dict[int, list[tuple[str, str]]] = {}
    top: list[tuple[str, str]] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    skipped: list[str] = []
    for name in where:
        if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in where:
            continue  # consumed with its weight
        m = _EXPERT_RE.match(name)
        if m:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = name
            continue
        canon = canonical_name(name)
        if canon is None:
            skipped.append(name)
        elif canon.startswith("blk."):
            layers.setdefault(int(canon.split(".")[1]), []).append((name, canon))
        else:
            top.append((name, canon))
    for layer, _ in experts:
        layers.setdefault(layer, [])
    return top, layers, experts, skipped


def _stack_experts(where: dict[str, SafeTensorsFile], layer: int, proj: str,
                   by_id: dict[int, str]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """One layer's routed experts of one projection, repacked to mxfp4 and stacked:
    (codes [n_exp, out, in/8], scales, the [n_exp, out, in] shape)."""
    n_exp = max(by_id) + 1
    if sorted(by_id) != list(range(n_exp)):
        raise ConvertError(f"layer {layer} {proj}: routed experts are not numbered 0..{n_exp - 1}")
    wqs, scs = [], []
    for e in range(n_exp):
        wname = by_id[e]
        sname = wname[: -len(".weight")] + ".scale"
        dt, w = where[wname].get(wname)
        if dt not in ("I8", "U8") or sname not in where:
            raise ConvertError(f"routed expert {wname!r} is {dt}, expected packed FP4 (I8) with a scale")
        wq, sc = fp4_to_mxfp4(w, where[sname].get(sname)[1])
        wqs.append(wq)
        scs.append(sc)
    d_out, d_in = wqs[0].shape[0], wqs[0].shape[1] * 8
    return np.stack(wqs), np.stack(scs), [n_exp, d_out, d_in]


def _converted_config(src: Path, quant: dict[str, dict], skipped: list[str]) -> dict:
    """The output's config.json: the repacked tensors' modes and the model's GGUF-style metadata
    read from the source's config.json (or why it could not be)."""
    config = {
        "format": "ds4agent-mlx",
        "version": 1,
        "source": str(src),
        "quantization": quant,
        "skipped": sorted(skipped),
    }
    src_config = src / "config.json"
    if src_config.exists():
        try:
            source = json.loads(src_config.read_text())
        except ValueError:
            raise ConvertError(f"{src_config} is not valid JSON") from None
        config["source_config"] = source
        try:
            config["metadata"] = hf_metadata(source)
        except ConvertError as err:  # still a valid conversion; the engine will say why it refuses
            config["metadata_error"] = str(err)
        # test fixtures mark themselves so the engine validates them permissively (as GGUF test models)
        config["test_model"] = bool(source.get("ds4agent_test_model", False))
    else:
        config["metadata_error"] = f"{src_config} is missing"
    return config


def convert(src, out, *, progress: Callable[[str], None] | None = None) -> Path:
    """Convert the checkpoint in `src` into a new directory `out` (atomically: built in a
    temporary sibling and renamed). Returns `out`."""
    import mlx.core as mx

    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(f"{out} already exists and is not empty; choose a new output directory")
    where = open_checkpoint(src)
    say = progress or (lambda _msg: None)
    top, layers, experts, skipped = _group_tensors(where)
    quant: dict[str, dict] = {}

    def put(arrays: dict, official: str, canon: str) -> None:
        dt, arr = where[official].get(official)
        scale_name = official[: -len(".weight")] + ".scale" if official.endswith(".weight") else None
        if dt == "F8_E4M3":
            if scale_name is None or scale_name not in where:
                raise ConvertError(f"FP8 tensor {official!r} has no {scale_name!r} block scale")
            _, scale = where[scale_name].get(scale_name)
            wq, sc = fp8_block_to_mxfp8(arr, scale)
            arrays[canon], arrays[canon[: -len(".weight")] + ".scales"] = mx.array(wq), mx.array(sc)
            quant[canon] = {"mode": "mxfp8", "group_size": MX_GROUP, "bits": 8, "shape": list(arr.shape)}
        else:
            arrays[canon] = _to_mx(dt, arr)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        weight_map: dict[str, str] = {}

        def save(fname: str, arrays: dict) -> None:
            mx.save_safetensors(str(tmp / fname), arrays)
            for k in arrays:
                weight_map[k] = fname

        arrays: dict = {}
        for name, canon in top:
            put(arrays, name, canon)
        save("model-top.safetensors", arrays)
        for layer in sorted(layers):
            say(f"layer {layer}")
            arrays = {}
            for name, canon in layers[layer]:
                put(arrays, name, canon)
            for proj in ("w1", "w3", "w2"):
                by_id = experts.get((layer, proj))
                if not by_id:
                    continue
                wq, sc, shape = _stack_experts(where, layer, proj, by_id)
                canon = f"blk.{layer}.{_EXPERT_NAME[proj]}"
                arrays[canon] = mx.array(wq)
                arrays[canon[: -len(".weight")] + ".scales"] = mx.array(sc)
                quant[canon] = {"mode": "mxfp4", "group_size": MX_GROUP, "bits": 4, "shape": shape}
            save(f"model-layer-{layer:03d}.safetensors", arrays)
        config = _converted_config(src, quant, skipped)
        (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}, indent=1))
        _make_durable(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _make_durable(directory: Path) -> None:
    """Before the temp directory is renamed into place: fsync every file in it and the directory
    itself (fsutil's procedure, applied to a directory: after a crash `out` is either absent or
    complete), and give it the permissions a plain mkdir would (mkdtemp makes it 0700)."""
    for f in directory.iterdir():
        fsync_file(f)
    fsync_dir(directory)
    os.chmod(directory, 0o777 & ~current_umask())


# ---- model metadata from the official config.json --------------------------------------------

# deepseek4.* key (without prefix) <- config.json key(s), first present wins
_HF_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("block_count", ("num_hidden_layers",)), ("embedding_length", ("hidden_size",)),
    ("vocab_size", ("vocab_size",)), ("attention.head_count", ("num_attention_heads",)),
    ("attention.head_count_kv", ("num_key_value_heads",)), ("attention.key_length", ("head_dim",)),
    ("attention.value_length", ("head_dim",)), ("rope.dimension_count", ("qk_rope_head_dim",)),
    ("attention.q_lora_rank", ("q_lora_rank",)), ("attention.output_lora_rank", ("o_lora_rank",)),
    ("attention.output_group_count", ("o_groups",)), ("expert_count", ("n_routed_experts",)),
    ("expert_used_count", ("num_experts_per_tok",)), ("expert_feed_forward_length", ("moe_intermediate_size",)),
    ("expert_shared_count", ("n_shared_experts",)), ("hash_layer_count", ("num_hash_layers", "n_hash_layers")),
    ("attention.sliding_window", ("sliding_window", "window_size")),
    ("attention.indexer.head_count", ("index_n_heads",)), ("attention.indexer.key_length", ("index_head_dim",)),
    ("attention.indexer.top_k", ("index_topk",)), ("hyper_connection.count", ("hc_mult",)),
    ("hyper_connection.sinkhorn_iterations", ("hc_sinkhorn_iters",)), ("hyper_connection.epsilon", ("hc_eps",)),
    ("rope.freq_base", ("rope_theta",)), ("attention.compress_rope_freq_base", ("compress_rope_theta",)),
    ("attention.layer_norm_rms_epsilon", ("rms_norm_eps",)), ("expert_weights_scale", ("routed_scaling_factor",)),
)


def hf_metadata(cfg: dict) -> dict:
    """`deepseek4.*` metadata (as a GGUF would carry it) from DeepSeek's config.json.

    Raises ConvertError naming the first missing key. compress_ratios is cut to the layer count
    (the release lists one more entry, for the MTP block); swiglu_limit becomes the per-layer
    clamp array; num_key_value_heads defaults to 1 and norm_topk_prob to true.
    """
    meta: dict = {}
    defaults = {"num_key_value_heads": 1}
    for key, sources in _HF_KEYS:
        found = next((cfg[k] for k in sources if k in cfg), defaults.get(sources[0]))
        if found is None:
            raise ConvertError(f"config.json has no {' / '.join(sources)} (needed for deepseek4.{key})")
        meta["deepseek4." + key] = found
    n = int(meta["deepseek4.block_count"])
    rs = cfg.get("rope_scaling") or {}
    try:
        meta["deepseek4.attention.compress_ratios"] = [int(r) for r in cfg["compress_ratios"][:n]]
        meta["deepseek4.swiglu_clamp_exp"] = [float(cfg["swiglu_limit"])] * n
        meta["deepseek4.rope.scaling.factor"] = rs["factor"]
        meta["deepseek4.rope.scaling.original_context_length"] = rs["original_max_position_embeddings"]
        meta["deepseek4.rope.scaling.yarn_beta_fast"] = rs["beta_fast"]
        meta["deepseek4.rope.scaling.yarn_beta_slow"] = rs["beta_slow"]
    except (KeyError, TypeError) as err:
        raise ConvertError(f"config.json lacks {err} (needed for the DeepSeek V4 metadata)") from None
    meta["deepseek4.expert_weights_norm"] = bool(cfg.get("norm_topk_prob", True))
    return meta


# ---- loading a converted directory -------------------------------------------------------------


def _mx_linear_class():
    from .weights import Linear

    class MxLinear(Linear):
        """A Linear over MLX microscaled codes (`mxfp8` from the official FP8 projections)."""

        __slots__ = ("mode", "bits")

        def __init__(self, wq, scales, *, mode: str, bits: int, in_features: int):
            super().__init__(wq, scales, None, in_features=in_features)
            self.mode, self.bits = mode, bits

        def __call__(self, x):
            import mlx.core as mx

            assert self.scales is not None  # microscaled codes always come with their scales
            return mx.quantized_matmul(x, self.weight, self.scales, None, transpose=True, group_size=MX_GROUP,
                                       bits=self.bits, mode=self.mode)

        def rows(self, start: int, stop: int):
            assert self.scales is not None  # microscaled codes always come with their scales
            return MxLinear(self.weight[start:stop], self.scales[start:stop], mode=self.mode, bits=self.bits,
                            in_features=self.in_features)

        def dense(self):
            import mlx.core as mx

            assert self.scales is not None  # microscaled codes always come with their scales
            return mx.dequantize(self.weight, self.scales, group_size=MX_GROUP, bits=self.bits, mode=self.mode,
                                 dtype=mx.float32)

    return MxLinear


def read_converted_config(path: Path) -> dict:
    """The config.json of a directory written by `convert`, or a ModelFileError that says what
    the directory is missing (shared by the loader and `ds4agent info`)."""
    from .errors import ModelFileError

    not_ours = f"{path} is a directory but not a model written by `ds4agent convert`"
    try:
        text = (path / "config.json").read_text()
    except FileNotFoundError:
        raise ModelFileError(f"{not_ours} (it has no config.json)") from None
    except OSError as err:
        raise ModelFileError(f"{path}/config.json: {err.strerror or err}") from None
    try:
        cfg = json.loads(text)
    except ValueError:
        raise ModelFileError(f"{path}/config.json is not valid JSON") from None
    if not isinstance(cfg, dict) or cfg.get("format") != "ds4agent-mlx":
        raise ModelFileError(f"{not_ours} (its config.json is not a ds4agent-mlx description)")
    return cfg


def load_converted(path, *, progress: Callable[[float], None] | None = None):
    """(ModelConfig, ModelWeights, quant_bits) of a directory written by `convert`.

    The engine's hook for MLX directories (loader.load_engine): FP8 projections run as `mxfp8`
    quantized matmuls, FP4 routed experts as `mxfp4` gather_qmm, everything else dense.
    """
    import mlx.core as mx

    from .config import from_metadata
    from .errors import ModelFileError
    from .experts.portable import MxExperts
    from .weights import build_weights

    path = Path(path)
    cfg = read_converted_config(path)
    try:
        index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise ModelFileError(f"{path}: cannot read model.safetensors.index.json ({why}); "
                             "an incomplete conversion? Run `ds4agent convert` again") from None
    meta = cfg.get("metadata")
    if not meta:
        raise ModelFileError(f"{path}: no model metadata ({cfg.get('metadata_error', 'source config.json missing')})")
    config = from_metadata(meta, mode="test" if cfg.get("test_model") else "flash")
    tensors: dict = {}
    for fname in sorted(set(index.values())):
        try:
            loaded = mx.load(str(path / fname))
        except Exception as err:  # MLX raises RuntimeError/ValueError for unreadable files
            raise ModelFileError(f"{path / fname}: cannot read ({err})") from None
        if not isinstance(loaded, dict):  # a .npy named in the index: one array, no tensor names
            raise ModelFileError(f"{path / fname}: not a safetensors file of named tensors")
        tensors.update(loaded)
    quant = cfg.get("quantization", {})
    MxLinear = _mx_linear_class()

    def get(name: str):
        if name in quant:
            q = quant[name]
            wq, sc = tensors[name], tensors[name[: -len(".weight")] + ".scales"]
            if "_exps." in name:
                return MxExperts(wq, sc, mode=q["mode"], bits=q["bits"])
            return MxLinear(wq, sc, mode=q["mode"], bits=q["bits"], in_features=q["shape"][1])
        return tensors[name]

    weights = build_weights(config, get, has=lambda n: n in tensors, progress=progress)
    return config, weights, 4
