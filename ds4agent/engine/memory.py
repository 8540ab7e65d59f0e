"""What a model needs in memory: the memory plan, the fit check, and a file's description by group.

    plan = memory_plan(gf.tensors.values(), cfg, ctx)   # MemoryPlan: weights, experts, state, working
    check_fits(plan, path)                              # ModelFileError when it cannot start here
    rank_plans(tensors, cfg, ctx, ranges)               # one plan per pipeline rank
    info = model_info(path, ctx=ctx)                    # ModelInfo: shape, groups, types, plan

Reads only the GGUF header, metadata and tensor directory (never tensor data), so it answers
instantly even for an 81 GB file; a directory written by `ds4agent convert` is described from its
config.json and safetensors headers. Memory is estimated the way the engine holds each tensor
(weights.py / experts/), by `memory_bytes`:

    routed experts (Q2_K/Q4_K/IQ2_XXS)  raw blocks, as in the file (memory-mapped; what decode
                                         touches is paged in; Metal and the GPU kernel set keep
                                         them resident, one copy per distinct file region)
    Q8_0 matrices                        the fast CPU kernel set: repacked at 34 bytes per 32
                                         weights, as in the file; the others: MLX affine 8-bit +
                                         f32 scale and bias per 32 weights, 40 bytes per block
    F16 matrices and the embedding       as in the file (weights.Linear widens per call); only
                                         the small APE tables are widened to f32 at load. The GPU
                                         kernel set (device.kernel_set) holds F16 matrices as f32
    F32 / I32                            as in the file
    tensors the engine does not read     not counted (e.g. a file's optional MTP block)

plus the session state for `ctx` tokens, by the DSV4 payload size formula (kvc-format.md §9.6,
generalised to any config): the engine's live state holds exactly those arrays. `ds4agent info`
prints these figures (commands/info.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ds4agent.models.fit import DEFAULT_CTX

from .chunks import chunk_cap
from .config import ModelConfig
from .errors import ConfigError, EngineError
from .layout import tensor_table
from .state import LayerState

# tensor-name groups, in display order
GROUPS = (
    ("routed experts", lambda n: "_exps." in n),
    ("shared experts", lambda n: "_shexp." in n),
    ("compressors+indexer", lambda n: "compressor" in n or ".indexer" in n),
    ("norms", lambda n: n.endswith("norm.weight")),
    ("attention", lambda n: ".attn_" in n),
    ("router", lambda n: "ffn_gate_inp" in n or "exp_probs_b" in n or "tid2eid" in n),
    ("hyper-connections", lambda n: "hc_" in n),
    ("embedding", lambda n: n == "token_embd.weight"),
    ("output head", lambda n: n.startswith("output")),
)


@dataclass
class GroupInfo:
    name: str
    types: dict[str, int] = field(default_factory=dict)  # type -> tensor count
    file_bytes: int = 0
    memory_bytes: int = 0
    params: int = 0


@dataclass
class ModelInfo:
    path: Path
    file_bytes: int
    mode: str  # "flash" | "test" | "invalid"
    problem: str  # the strict-validation message when mode == "invalid"
    config: ModelConfig
    groups: list[GroupInfo]
    types: dict[str, tuple[int, int]]  # type -> (tensor count, bytes)
    n_tensors: int
    ctx: int
    state_bytes: int
    plan: MemoryPlan | None = None
    note: str = ""  # what a generated test file is (config.FLASH_TEST_KEY), else empty

    @property
    def weights_memory(self) -> int:
        return sum(g.memory_bytes for g in self.groups)

    @property
    def params(self) -> int:
        return sum(g.params for g in self.groups)


def payload_bytes(cfg, tokens: int) -> int:
    """DSV4 session payload bytes for `tokens` tokens (kvc-format.md §9.6, any config):

    header 52 + ids 4T + logits 4V + two u32 counts per layer; per layer R = min(T, window) raw
    rows of Dh f32; ratio r != 0: floor(T/r) compressed rows of Dh f32 plus the compressor frontier
    2 x (coff*r) x (coff*Dh) f32; ratio 4 also floor(T/4) index rows of Di f32 plus the indexer
    frontier 2 x 8 x (2*Di) f32. (Flash: 12,723,596 + 4T + 2048*43*R + 53,760*floor(T/4) +
    40,960*floor(T/128).)
    """
    t = int(tokens)
    return 52 + 4 * t + 4 * cfg.vocab + 2 * 4 * cfg.n_layers + layers_state_bytes(cfg, t, range(cfg.n_layers))


def layers_state_bytes(cfg, tokens: int, layers: range) -> int:
    """The per-layer part of payload_bytes for `layers` (a pipeline rank holds only its own)."""
    return sum(LayerState.state_bytes(cfg, layer, int(tokens)) for layer in layers)


def memory_bytes(name: str, type_name: str, n_elements: int, nbytes: int) -> int:
    """Bytes the engine holds for one tensor of the file (the table in the module docstring)."""
    if "_exps." in name:
        return nbytes if type_name != "F16" else n_elements * 4  # dense test experts widen to f32
    from .device import kernel_set

    if type_name == "Q8_0":
        # Counted at 40 on the CPU too, the plan refused a Flash model 1.1 GiB too early there.
        return nbytes if kernel_set() == "cpu" else n_elements // 32 * 40
    if type_name == "F16":
        # Matrices and the embedding stay F16 (weights.Linear widens per call); only the small
        # APE tables are widened to f32 at load, and the GPU kernel set's matrices (Linear).
        widened = "_ape." in name or (name != "token_embd.weight" and kernel_set() == "gpu")
        return n_elements * 4 if widened else nbytes
    return nbytes


def _distinct_bytes(ranges: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of [start, end) file ranges: what a mapping can make resident.
    Real files have one range per tensor; a test file may point many tensors at one region."""
    total, reach = 0, -1
    for start, end in sorted(ranges):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def working_bytes(cfg, ctx: int) -> int:
    """MLX temporaries of one prefill chunk (the largest step): per chunk row, the query heads
    (q, its RoPE and norm: ~3 x H x Dh), the hyper-connection streams (~4 x hc x E), the routed
    experts' gate/up/mid/down rows (~4 x U x F) in f32, plus two groups of dequantised experts
    (the device path dequantises experts.portable.DEFAULT_GROUP_BYTES at a time; the CPU kernels decode
    into a small buffer, so there the two groups are a margin) and the logits row. An estimate
    that the Flash-shape benchmark checks against the measured peak."""
    rows = chunk_cap(ctx)
    per_row = 4 * (3 * cfg.n_heads * cfg.head_dim + 4 * cfg.hc_count * cfg.dim
                   + 4 * cfg.n_experts_used * cfg.expert_ffn)
    return rows * per_row + 2 * (256 << 20) + 4 * cfg.vocab


@dataclass(frozen=True)
class MemoryPlan:
    """Expected resident memory of a run, by part."""

    weights: int  # non-expert tensors as the engine holds them
    experts: int  # routed-expert file bytes that can be paged in (distinct ranges)
    state: int  # session state when the context is full (it grows with the tokens used)
    working: int  # one prefill chunk's temporaries

    @property
    def peak(self) -> int:
        return self.weights + self.experts + self.state + self.working

    @property
    def to_start(self) -> int:
        """What must fit before the first token: everything but the state, which starts empty."""
        return self.weights + self.experts + self.working


def memory_plan(tensors, cfg, ctx: int) -> MemoryPlan:
    """The plan for a model's tensor directory (`GGUFFile.tensors.values()`) at `ctx`."""
    wanted = {spec.name for spec in tensor_table(cfg)}  # what the loader reads (check_directory's set)
    weights, expert_ranges = 0, []
    for ti in tensors:
        if ti.name not in wanted:
            continue
        if "_exps." in ti.name and ti.type_name not in ("F16", "F32"):
            expert_ranges.append((ti.offset, ti.offset + ti.nbytes))
        else:
            weights += memory_bytes(ti.name, ti.type_name, ti.n_elements, ti.nbytes)
    return MemoryPlan(weights=weights, experts=_distinct_bytes(expert_ranges),
                      state=payload_bytes(cfg, ctx), working=working_bytes(cfg, ctx))


def rank_plans(tensors, cfg, ctx: int, ranges: list[tuple[int, int]]) -> list[MemoryPlan]:
    """The memory plan of each rank of a pipeline (engine/pipeline/): its tensors (its layers,
    the embedding on rank 0, the head on the last rank), its layers' state at `ctx` (rank 0 also
    the token ids and the logits row) and one chunk's working buffers."""
    from .weights import tensor_in_range

    tensors = list(tensors)
    plans = []
    for k, (a, b) in enumerate(ranges):
        own = memory_plan([ti for ti in tensors if tensor_in_range(ti.name, cfg, (a, b))], cfg, ctx)
        state = layers_state_bytes(cfg, ctx, range(a, b)) + (4 * ctx + 4 * cfg.vocab if k == 0 else 0)
        plans.append(MemoryPlan(weights=own.weights, experts=own.experts, state=state, working=own.working))
    return plans


def check_fits(plan: MemoryPlan, path, ram: int | None = None) -> None:
    """Refuse, before any weight is read, a model that cannot fit this machine's memory: an
    80 GB model on a 64 GB machine would swap for minutes and then be killed, which is worse
    than one clear line now. The state is left out (it grows with use and the agent compacts);
    `info` shows the full-context figure."""
    from ..models.fit import machine_ram
    from .errors import ModelFileError

    ram = (machine_ram() or 0) if ram is None else ram
    if ram and plan.to_start > ram:
        raise ModelFileError(
            f"{path}: the model needs about {binary_size(plan.to_start)} of memory to run (weights "
            f"{binary_size(plan.weights)}, routed experts {binary_size(plan.experts)}, working buffers "
            f"{binary_size(plan.working)}) but this machine has {binary_size(ram)}; it needs a machine with "
            "more memory (`ds4agent pull` lists each model's RAM)")


def model_info(path, *, ctx: int = DEFAULT_CTX) -> ModelInfo:
    """Inspect a GGUF model (header and directory only). Raises EngineError subclasses."""
    from .config import FLASH_TEST_KEY, gguf_config, model_mode
    from .gguf import GGUFFile

    if ctx < 1:
        raise EngineError(f"--ctx must be at least 1, got {ctx}")
    path = Path(path)
    if path.is_dir():
        return _directory_info(path, ctx)
    with GGUFFile.open(path) as gf:
        mode, problem = model_mode(gf.metadata), ""
        try:
            cfg = gguf_config(gf, mode=mode)
        except ConfigError as err:
            if mode == "test":
                raise
            # Still describe the file (permissively) and say why the engine would refuse it.
            mode, problem = "invalid", str(err)
            cfg = gguf_config(gf, mode="test")
        groups = {name: GroupInfo(name) for name, _ in GROUPS}
        other = GroupInfo("other")
        by_type: dict[str, list[int]] = {}
        for ti in gf.tensors.values():
            g = next((groups[n] for n, match in GROUPS if match(ti.name)), other)
            t = ti.type_name
            g.types[t] = g.types.get(t, 0) + 1
            g.file_bytes += ti.nbytes
            g.memory_bytes += memory_bytes(ti.name, t, ti.n_elements, ti.nbytes)
            g.params += ti.n_elements
            entry = by_type.setdefault(t, [0, 0])
            entry[0] += 1
            entry[1] += ti.nbytes
        group_list = [g for g in (*groups.values(), other) if g.types]
        return ModelInfo(
            path=path, file_bytes=gf.file_size, mode=mode, problem=problem, config=cfg,
            groups=group_list, types={k: (v[0], v[1]) for k, v in by_type.items()},
            n_tensors=len(gf.tensors), ctx=int(ctx), state_bytes=payload_bytes(cfg, ctx),
            plan=memory_plan(gf.tensors.values(), cfg, ctx),
            note=str(gf.metadata.get(FLASH_TEST_KEY, "")),
        )


def _directory_info(path: Path, ctx: int) -> ModelInfo:
    """A directory written by `ds4agent convert`: sizes from the safetensors headers, types from
    its config.json (mxfp8 / mxfp4 for the repacked tensors, the stored dtype otherwise). MLX holds
    the quantised tensors as stored; 16-bit float matrices are widened to f32 like GGUF F16."""

    from .config import from_metadata
    from .convert import SafeTensorsFile, read_converted_config
    from .errors import ModelFileError

    cfg = read_converted_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} holds no .safetensors files; an incomplete conversion?")
    meta = cfg.get("metadata")
    if not meta:
        raise ModelFileError(f"{path}: no model metadata ({cfg.get('metadata_error', 'unknown source')})")
    mode, problem = ("test" if cfg.get("test_model") else "flash"), ""
    try:
        config = from_metadata(meta, mode=mode)
    except ConfigError as err:
        if mode == "test":
            raise
        mode, problem, config = "invalid", str(err), from_metadata(meta, mode="test")
    quant = cfg.get("quantization", {})
    groups = {name: GroupInfo(name) for name, _ in GROUPS}
    other = GroupInfo("other")
    by_type: dict[str, list[int]] = {}
    total, n_tensors = 0, 0
    for f in files:
        st = SafeTensorsFile(f)
        total += f.stat().st_size
        for name, t in st.tensors.items():
            n_tensors += 1
            base = name[: -len(".scales")] + ".weight" if name.endswith(".scales") else name
            tname = quant[base]["mode"] if base in quant else t["dtype"]
            nbytes = t["data_offsets"][1] - t["data_offsets"][0]
            g = next((groups[n] for n, match in GROUPS if match(base)), other)
            if name == base:
                g.types[tname] = g.types.get(tname, 0) + 1
                shape = quant[base]["shape"] if base in quant else t["shape"]
                g.params += int(np.prod(shape)) if shape else 1
            g.file_bytes += nbytes
            # as weights.py holds them: BF16 widens to f32 (Linear keeps only F16 as is), except
            # the embedding rows
            widen = tname == "BF16" and base != "token_embd.weight"
            g.memory_bytes += nbytes * 2 if widen else nbytes
            entry = by_type.setdefault(tname, [0, 0])
            entry[0] += name == base
            entry[1] += nbytes
    group_list = [g for g in (*groups.values(), other) if g.types]
    experts = sum(g.memory_bytes for g in group_list if g.name == "routed experts")
    plan = MemoryPlan(weights=sum(g.memory_bytes for g in group_list) - experts, experts=experts,
                      state=payload_bytes(config, ctx), working=working_bytes(config, ctx))
    return ModelInfo(
        path=path, file_bytes=total, mode=mode, problem=problem, config=config,
        groups=group_list, types={k: (v[0], v[1]) for k, v in by_type.items()},
        n_tensors=n_tensors, ctx=int(ctx), state_bytes=payload_bytes(config, ctx), plan=plan,
    )


def binary_size(n: int) -> str:
    """Bytes in binary units with two decimals ("1.50 GiB"), as the plan's figures are shown."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
