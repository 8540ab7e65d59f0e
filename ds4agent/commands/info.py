"""`ds4agent info MODEL [--ctx N] [--pipeline N]`: a model's shape, quant types, sizes and memory plan,
and whether bash commands run in an OS sandbox here.

The figures are the engine's (engine/memory.py: model_info, memory_plan, rank_plans); this module
only lays them out as the report and prints it. Exit 2 with one line for a file the engine cannot
describe.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ds4agent.commands.settings import InfoSettings
from ds4agent.engine.device import Device, choose_device, kernel_set
from ds4agent.engine.errors import EngineError
from ds4agent.engine.experts.base import planned_experts
from ds4agent.engine.gguf import GGUFFile
from ds4agent.engine.memory import MemoryPlan, ModelInfo, binary_size, model_info, rank_plans
from ds4agent.engine.pipeline.split import plan_ranges
from ds4agent.models.fit import machine_ram
from ds4agent.tools.sandbox import availability


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _ratio_summary(ratios) -> str:
    counts: dict[int, int] = {}
    for r in ratios:
        counts[r] = counts.get(r, 0) + 1
    return ", ".join(f"{n} x {r}" for r, n in sorted(counts.items()))


def format_rank_plans(ranges: list[tuple[int, int]], plans: list[MemoryPlan], ctx: int) -> str:
    lines = [f"pipeline    {len(ranges)} ranks (memory per rank at --ctx {ctx}):"]
    for k, ((a, b), p) in enumerate(zip(ranges, plans, strict=True)):
        extra = " + embedding" if k == 0 else ""
        extra += " + output head" if k == len(ranges) - 1 else ""
        lines.append(f"            rank {k}: layers {a}-{b - 1}{extra}: weights {binary_size(p.weights)}, routed "
                     f"experts {binary_size(p.experts)}, state {binary_size(p.state)}, working {binary_size(p.working)}; "
                     f"peak {binary_size(p.peak)}")
    return "\n".join(lines)


def format_info(info: ModelInfo, device: Device | None = None) -> str:
    """The report; `device` (device.Device) adds the line saying where the engine would compute."""
    c = info.config
    routed = "+".join(t for g in info.groups if g.name == "routed experts" for t in g.types)
    kind = {
        "flash": "DeepSeek V4 Flash (strict metadata check passed)",
        "test": "ds4agent test model (permissive metadata check)",
        "invalid": f"NOT loadable as DS4 Flash: {info.problem}",
    }[info.mode]
    lines = [
        f"model       {info.path} ({binary_size(info.file_bytes)}, {info.n_tensors} tensors, "
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
        *([f"            routed types {routed}; experts: {planned_experts(routed.split('+'), device.kind)}"]
          if device and routed else []),
        "quant types " + ", ".join(
            f"{t} {n} tensors {binary_size(b)}" for t, (n, b) in sorted(info.types.items(), key=lambda kv: -kv[1][1])
        ),
        "",
        f"{'tensors':<22}{'types':<28}{'file':>12}{'in memory':>12}",
    ]
    for g in info.groups:
        types = "+".join(f"{t}" for t in sorted(g.types, key=lambda t: -g.types[t]))
        lines.append(f"{g.name:<22}{types:<28}{binary_size(g.file_bytes):>12}{binary_size(g.memory_bytes):>12}")
    plan = info.plan
    assert plan is not None  # model_info always plans
    ram = machine_ram() or 0
    verdict = ("" if not ram else
               f"; this machine has {binary_size(ram)}: " + ("fits" if plan.peak <= ram else
                                                       "fits to start, not with a full context"
                                                       if plan.to_start <= ram else "DOES NOT FIT"))
    lines += [
        "",
        f"memory      weights as the engine holds them {binary_size(plan.weights)} (F16 kept, Q8_0 as MLX "
        "affine 8-bit)",
        _experts_line(plan.experts, info, routed, kernel_set(device.kind) if device else kernel_set()),
        f"            session state at --ctx {info.ctx}: {binary_size(plan.state)} when full (it grows with "
        "the tokens used)",
        f"            working buffers for one prefill chunk: about {binary_size(plan.working)}",
        f"            expected peak at --ctx {info.ctx}: {binary_size(plan.peak)}{verdict}",
    ]
    return "\n".join(lines)


def _experts_line(mapped: int, info: ModelInfo, routed: str, kernels: str) -> str:
    """Where the routed experts live under the kernel set `kernels`: memory-mapped, MLX arrays (a
    converted directory; MXFP4 experts outside the fast CPU set, re-laid at load by
    engine/experts/mxfp4.py), or (F16 experts of a test file, none mapped) among the weights
    above, with the size the table gives them."""
    if info.path.is_dir() or (routed == "MXFP4" and kernels != "cpu"):
        return f"            routed experts {binary_size(mapped)} (MLX arrays)"
    if mapped == 0:
        held = sum(g.memory_bytes for g in info.groups if g.name == "routed experts")
        return (f"            routed experts {binary_size(held)} held with the weights above (their type is not "
                "memory-mapped)")
    return f"            routed experts {binary_size(mapped)} memory-mapped (paged in as experts are used)"


def main(settings: InfoSettings) -> int:
    """`ds4agent info [--model] MODEL [--ctx N] [--pipeline N [--pipeline-split L,..]]` (no model:
    the usual lookup, $DS4AGENT_MODEL first)."""
    from ds4agent.models.locate import resolve_model_path

    model_path = resolve_model_path(settings.model)  # ModelError: cli.py prints it, exit 2
    try:
        info = model_info(model_path, ctx=settings.ctx)
        device = choose_device(settings.device)
        text = format_info(info, device)
        # Whether bash commands run in an OS sandbox here (the agent says it at start too).
        text += f"\nsandbox     {availability().detail}"
        if settings.ranks is not None:
            split = list(settings.split) if settings.split is not None else None
            text += "\n\n" + _pipeline_text(model_path, settings.ranks, split, info)
    except EngineError as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _pipeline_text(model_path: Path, ranks: int, split: list[int] | None, info: ModelInfo) -> str:
    ranges = plan_ranges(model_path, ranks, split)
    with GGUFFile.open(model_path) as gf:
        plans = rank_plans(gf.tensors.values(), info.config, info.ctx, ranges)
    return format_rank_plans(ranges, plans, info.ctx)
