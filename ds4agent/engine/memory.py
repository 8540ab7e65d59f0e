"""`ds4agent info MODEL [--ctx N]`: a model's shape, quant types, sizes and memory estimate.

Reads only the GGUF header, metadata and tensor directory (never tensor data), so it answers
instantly even for an 81 GB file; a directory written by `ds4agent convert` is described from its
config.json and safetensors headers. Memory is estimated the way the engine holds each tensor
(weights.py / experts/):

    routed experts (Q2_K/Q4_K/IQ2_XXS)  raw blocks, as in the file (memory-mapped; what decode
                                         touches is paged in, Metal keeps them resident)
    Q8_0 matrices                        MLX affine 8-bit + f32 scale and bias per 32 weights:
                                         40 bytes per 34-byte block
    F16 matrices and the embedding       as in the file (weights.Linear widens per call); only
                                         the small APE tables are widened to f32 at load. The GPU
                                         kernel set (device.kernel_set) holds F16 matrices as f32
    F32 / I32                            as in the file
    tensors the engine does not read     not counted (e.g. a file's optional MTP block)

plus the session state for `ctx` tokens, by the DSV4 payload size formula (kvc-format.md §9.6,
generalised to any config): the engine's live state holds exactly those arrays.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ConfigError, EngineError

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
    config: object  # ModelConfig
    groups: list[GroupInfo]
    types: dict[str, tuple[int, int]]  # type -> (tensor count, bytes)
    n_tensors: int
    ctx: int
    state_bytes: int
    plan: MemoryPlan | None = None
    note: str = ""  # what a generated test file is (flashmodel.FLASH_TEST_KEY), else empty

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
    t = int(tokens)
    total = 0
    rows = min(t, cfg.window)
    for layer in layers:
        r = cfg.ratios[layer]
        total += rows * cfg.head_dim * 4
        if r == 0:
            continue
        coff = cfg.coff(layer)
        total += (t // r) * cfg.head_dim * 4 + 2 * (coff * r) * (coff * cfg.head_dim) * 4
        if r == 4:
            total += (t // 4) * cfg.indexer_dim * 4 + 2 * 8 * (2 * cfg.indexer_dim) * 4
    return total


def _memory_bytes(name: str, type_name: str, n_elements: int, nbytes: int) -> int:
    if "_exps." in name:
        return nbytes if type_name != "F16" else n_elements * 4  # dense test experts widen to f32
    if type_name == "Q8_0":
        return n_elements // 32 * 40
    if type_name == "F16":
        # Matrices and the embedding stay F16 (weights.Linear widens per call); only the small
        # APE tables are widened to f32 at load, and the GPU kernel set's matrices (Linear).
        from .device import gpu_kernels

        widened = "_ape." in name or (name != "token_embd.weight" and gpu_kernels())
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
    (experts.DEFAULT_GROUP_BYTES each, one per CPU stream) and the logits row. An estimate that
    the Flash-shape benchmark checks against the measured peak."""
    from .session import chunk_cap

    rows = chunk_cap(ctx)
    per_row = 4 * (3 * cfg.n_heads * cfg.head_dim + 4 * cfg.hc_count * cfg.dim
                   + 4 * cfg.n_experts_used * cfg.expert_ffn)
    return rows * per_row + 2 * (256 << 20) + 4 * cfg.vocab


@dataclass(frozen=True)
class MemoryPlan:
    """Expected resident memory of a run (issue 13 item 3), by part."""

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
    from ds4agent.testmodels.writer import tensor_table

    wanted = {spec.name for spec in tensor_table(cfg)}  # what the loader reads (check_directory's set)
    weights, expert_ranges = 0, []
    for ti in tensors:
        if ti.name not in wanted:
            continue
        if "_exps." in ti.name and ti.type_name not in ("F16", "F32"):
            expert_ranges.append((ti.offset, ti.offset + ti.nbytes))
        else:
            weights += _memory_bytes(ti.name, ti.type_name, ti.n_elements, ti.nbytes)
    return MemoryPlan(weights=weights, experts=_distinct_bytes(expert_ranges),
                      state=payload_bytes(cfg, ctx), working=working_bytes(cfg, ctx))


def rank_plans(tensors, cfg, ctx: int, ranges: list[tuple[int, int]]) -> list[MemoryPlan]:
    """The memory plan of each rank of a pipeline (engine/pipeline.py): its tensors (its layers,
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


def format_rank_plans(ranges: list[tuple[int, int]], plans: list[MemoryPlan], ctx: int) -> str:
    lines = [f"pipeline    {len(ranges)} ranks (memory per rank at --ctx {ctx}):"]
    for k, ((a, b), p) in enumerate(zip(ranges, plans, strict=True)):
        extra = " + embedding" if k == 0 else ""
        extra += " + output head" if k == len(ranges) - 1 else ""
        lines.append(f"            rank {k}: layers {a}-{b - 1}{extra}: weights {_size(p.weights)}, routed "
                     f"experts {_size(p.experts)}, state {_size(p.state)}, working {_size(p.working)}; "
                     f"peak {_size(p.peak)}")
    return "\n".join(lines)


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
            f"{path}: the model needs about {_size(plan.to_start)} of memory to run (weights "
            f"{_size(plan.weights)}, routed experts {_size(plan.experts)}, working buffers "
            f"{_size(plan.working)}) but this machine has {_size(ram)}; it needs a machine with "
            "more memory (`ds4agent pull` lists each model's RAM)")


def model_info(path, *, ctx: int = 100_000) -> ModelInfo:
    """Inspect a GGUF model (header and directory only). Raises EngineError subclasses."""
    from ds4agent.testmodels.flash import FLASH_TEST_KEY
    from ds4agent.testmodels.writer import TEST_MODEL_KEY

    from .config import from_metadata
    from .gguf import GGUFFile

    if ctx < 1:
        raise EngineError(f"--ctx must be at least 1, got {ctx}")
    path = Path(path)
    if path.is_dir():
        return _directory_info(path, ctx)
    with GGUFFile.open(path) as gf:
        types = {k: gf.array_types.get(k, v) for k, v in gf.value_types.items()}
        mode, problem = ("test" if gf.metadata.get(TEST_MODEL_KEY) else "flash"), ""
        try:
            cfg = from_metadata(gf.metadata, mode=mode, types=types)
        except ConfigError as err:
            if mode == "test":
                raise
            # Still describe the file (permissively) and say why the engine would refuse it.
            mode, problem = "invalid", str(err)
            cfg = from_metadata(gf.metadata, mode="test", types=types)
        groups = {name: GroupInfo(name) for name, _ in GROUPS}
        other = GroupInfo("other")
        by_type: dict[str, list[int]] = {}
        for ti in gf.tensors.values():
            g = next((groups[n] for n, match in GROUPS if match(ti.name)), other)
            t = ti.type_name
            g.types[t] = g.types.get(t, 0) + 1
            g.file_bytes += ti.nbytes
            g.memory_bytes += _memory_bytes(ti.name, t, ti.n_elements, ti.nbytes)
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


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _ratio_summary(ratios) -> str:
    counts: dict[int, int] = {}
    for r in ratios:
        counts[r] = counts.get(r, 0) + 1
    return ", ".join(f"{n} x {r}" for r, n in sorted(counts.items()))


def format_info(info: ModelInfo, device=None) -> str:
    """The report; `device` (device.Device) adds the line saying where the engine would compute."""
    c = info.config
    kind = {
        "flash": "DeepSeek V4 Flash (strict metadata check passed)",
        "test": "ds4agent test model (permissive metadata check)",
        "invalid": f"NOT loadable as DS4 Flash: {info.problem}",
    }[info.mode]
    lines = [
        f"model       {info.path} ({_size(info.file_bytes)}, {info.n_tensors} tensors, "
        f"{_count(info.params)} parameters)",
        f"kind        {kind}",
        # One line: the tensor sizes below are the real model's, the file holds far less.
        *([f"test file   {info.note}; not a trained model, the sizes below are the tensors' as "
           f"in a real file"] if info.note else []),
        *([f"device      {device.label}" + (f" · {device.notice}" if device.notice else "")] if device else []),
        f"shape       {c.n_layers} layers, width {c.dim}, vocab {c.vocab}, {c.n_heads} query heads x "
        f"{c.head_dim} (RoPE on the last {c.rope_dim}), 1 KV head",
        f"attention   q LoRA {c.q_lora_rank}, output {c.out_groups} groups x {c.out_lora_rank}, window "
        f"{c.window}, compress ratios {_ratio_summary(c.ratios)}; indexer {c.indexer_heads} x "
        f"{c.indexer_dim} top-{c.indexer_top_k}",
        f"experts     {c.n_experts} routed ({c.n_experts_used} used, width {c.expert_ffn}), "
        f"{c.n_shared_experts} shared, {c.n_hash_layers} hash-routed layers",
        "quant types " + ", ".join(
            f"{t} {n} tensors {_size(b)}" for t, (n, b) in sorted(info.types.items(), key=lambda kv: -kv[1][1])
        ),
        "",
        f"{'tensors':<22}{'types':<28}{'file':>12}{'in memory':>12}",
    ]
    for g in info.groups:
        types = "+".join(f"{t}" for t in sorted(g.types, key=lambda t: -g.types[t]))
        lines.append(f"{g.name:<22}{types:<28}{_size(g.file_bytes):>12}{_size(g.memory_bytes):>12}")
    plan = info.plan
    assert plan is not None  # model_info always plans
    from ..models.fit import machine_ram

    ram = machine_ram() or 0
    verdict = ("" if not ram else
               f"; this machine has {_size(ram)}: " + ("fits" if plan.peak <= ram else
                                                       "fits to start, not with a full context"
                                                       if plan.to_start <= ram else "DOES NOT FIT"))
    lines += [
        "",
        f"memory      weights as the engine holds them {_size(plan.weights)} (F16 kept, Q8_0 as MLX "
        "affine 8-bit)",
        f"            routed experts {_size(plan.experts)}"
        + (" (MLX arrays)" if info.path.is_dir() else " memory-mapped (paged in as experts are used)"),
        f"            session state at --ctx {info.ctx}: {_size(plan.state)} when full (it grows with "
        "the tokens used; kvc-format.md 9.6)",
        f"            working buffers for one prefill chunk: about {_size(plan.working)}",
        f"            expected peak at --ctx {info.ctx}: {_size(plan.peak)}{verdict}",
    ]
    return "\n".join(lines)


def main(args) -> int:
    """`ds4agent info MODEL [--ctx N] [--pipeline N [--pipeline-split L,..]]`."""
    from .device import choose_device

    try:
        info = model_info(args.model_path, ctx=args.ctx)
        device = choose_device(getattr(args, "device", None))
        text = format_info(info, device)
        if getattr(args, "pipeline", None) is not None:
            text += "\n\n" + _pipeline_text(args, info)
    except EngineError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _pipeline_text(args, info: ModelInfo) -> str:
    from .gguf import GGUFFile
    from .pipeline.rank0 import plan_ranges

    ranges = plan_ranges(args.model_path, args.pipeline, getattr(args, "pipeline_split", None))
    with GGUFFile.open(args.model_path) as gf:
        plans = rank_plans(gf.tensors.values(), info.config, info.ctx, ranges)
    return format_rank_plans(ranges, plans, info.ctx)
