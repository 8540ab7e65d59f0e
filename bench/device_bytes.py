"""Device bytes per decoded token, modeled: what one decode step at the Flash shape reads from
device memory with the GPU kernel set, against what a token must read.

    python bench/device_bytes.py                 # q2, q4 (and every other expert flavour of layout.py)
    python bench/device_bytes.py --ctx 32768     # the KV attended at another context length

Built from the config and the tensor table alone (shapes only: no 4 GB file is written or read).
For every tensor a decode step uses, the kernel that reads it and what that kernel reads:
  * dense products (weights.Linear): the weight in the form the GPU kernel set stores it,
    measured by building a small Linear of each file type under DS4AGENT_KERNELS=gpu on the CPU
    device (Q8_0 as MLX affine 8-bit with f32 scales and biases; F16 widened once to f32), plus
    the input row;
  * the token embedding: one row;
  * routed experts with a GPU kernel (IQ2_XXS, Q2_K, Q4_K): experts/gpu.py's read model of the
    decode kernel (each selected expert's blocks once, and its input row), for the 6 selected
    experts of each of the three projections; experts of any other type (e.g. MXFP4, multiplied
    by MLX's gather_qmm) read their selected experts' blocks once;
  * attention: the KV rows each layer attends (the sliding window, the compressed rows of its
    ratio, the indexer's keys on ratio-4 layers), as f32 rows, the same on both sides of the ratio.

A token must read: every such weight once in the file's own form (active experts only, one
embedding row) plus the same KV. One line per expert flavour: `N.NNx weight bytes`, and beside
it what the portable backend's decode (dequantise the six experts to f32, then multiply) would
read, for scale. Exit status 1 when a flavour is above 1.3x.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from ds4agent.engine import layout, quant  # noqa: E402
from ds4agent.engine.config import ModelConfig, flash_config  # noqa: E402
from ds4agent.engine.device import forced_kernel_set  # noqa: E402
from ds4agent.engine.experts import gpu  # noqa: E402
from ds4agent.engine.gguf import GGML_TYPE_IDS, block_of  # noqa: E402
from ds4agent.engine.weights import Linear  # noqa: E402

TARGET = 1.3
F32 = 4
EXPERT_ROLES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# Read by other means than a product of the whole tensor (one row of it, or a table lookup).
LOOKUP_ROLES = ("token_embd", "ffn_gate_tid2eid")


def file_bytes(ggml_type: str, n: int) -> int:
    block = block_of(ggml_type)
    return n // block.block * block.nbytes


def device_bytes_per_weight(ggml_type: str) -> float:
    """Bytes per weight of a dense tensor of this file type as the GPU kernel set holds it
    (a small weights.Linear built on the CPU device with DS4AGENT_KERNELS=gpu)."""
    rows, cols = 32, 256
    rng = np.random.default_rng(0)
    with forced_kernel_set("gpu"):
        if ggml_type == "Q8_0":
            raw = np.zeros((rows, cols // 32, 34), np.uint8)
            raw[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 32), dtype=np.uint8)
            raw[..., :2] = np.full((rows, cols // 32, 1), np.float16(0.01)).view(np.uint8)
            lin = Linear(*quant.q8_0_to_affine(raw.reshape(-1), (rows, cols)))
        elif ggml_type in ("F16", "F32"):
            lin = Linear(mx.array(rng.standard_normal((rows, cols)).astype(np.float16 if ggml_type == "F16"
                                                                              else np.float32)))
        else:
            raise SystemExit(f"no dense kernel model for {ggml_type}")
        arrays = [a for a in (lin.weight, lin.scales, lin.biases) if a is not None]
        return sum(int(a.nbytes) for a in arrays) / (rows * cols)


def expert_reads(ggml_type: str, d_out: int, d_in: int, pairs: int) -> tuple[int, int, int]:
    """(kernel reads, portable decode's reads, file bytes of the selected experts) of one expert
    tensor for `pairs` (token, expert) pairs."""
    n = pairs * d_out * d_in
    selected = file_bytes(ggml_type, n)
    activation = pairs * d_in * F32
    tid = GGML_TYPE_IDS[ggml_type]
    kernel = gpu.read_bytes(tid, d_in, d_out, pairs) if tid in gpu.GPU_TYPES else selected + activation
    portable = selected + 2 * n * F32 + activation  # dequantised f32 written, then read by the product
    return kernel, portable, selected


def kv_rows(cfg: ModelConfig, layer: int, ctx: int) -> tuple[int, int]:
    """(attended KV rows of head_dim, indexer key rows of indexer_dim) of one layer at `ctx`."""
    ratio = cfg.ratios[layer]
    rows = min(ctx, cfg.window)
    keys = 0
    if ratio:
        compressed = ctx // ratio
        if ratio == 4:  # the indexer scores every compressed row and attends its top k
            keys = compressed
            compressed = min(compressed, cfg.indexer_top_k)
        rows += compressed
    return rows, keys


def model(cfg: ModelConfig, experts: str, ctx: int) -> dict[str, float]:
    per_weight = {t: device_bytes_per_weight(t) for t in ("Q8_0", "F16", "F32")}
    k = cfg.n_experts_used
    got = must = portable = 0.0
    ex_got = ex_must = 0.0
    for spec in layout.tensor_table(cfg, experts=experts):
        n = int(np.prod(spec.shape))
        if spec.role in EXPERT_ROLES:
            _, d_out, d_in = spec.shape
            kern, port, sel = expert_reads(spec.ggml_type, d_out, d_in, k)
            got += kern
            portable += port
            must += sel
            ex_got += kern
            ex_must += sel
            continue
        if spec.role in LOOKUP_ROLES:
            row = file_bytes(spec.ggml_type, spec.shape[-1]) if spec.role == "token_embd" else k * 4
            got += row
            portable += row
            must += row
            continue
        reads = per_weight[spec.ggml_type] * n + (spec.shape[-1] * F32 if len(spec.shape) == 2 else 0)
        got += reads
        portable += reads
        must += file_bytes(spec.ggml_type, n)
    kv = 0
    for layer in range(cfg.n_layers):
        rows, keys = kv_rows(cfg, layer, ctx)
        kv += rows * cfg.head_dim * F32 + keys * cfg.indexer_dim * F32
    return {"ratio": (got + kv) / (must + kv), "portable": (portable + kv) / (must + kv),
            "must": must + kv, "kv": kv, "experts": ex_got / ex_must,
            "dense": (got - ex_got) / (must - ex_must)}


def flavours() -> list[str]:
    """Every routed-expert flavour layout.py knows (q2, q4, and any added later, e.g. mxfp4)."""
    return list(layout.EXPERT_TYPES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", type=int, default=4096, help="context length whose KV a token attends")
    p.add_argument("--experts", default=",".join(flavours()), help="expert flavours (comma-separated)")
    args = p.parse_args(argv)
    cfg = flash_config()
    failed = False
    for name in [e for e in args.experts.split(",") if e]:
        r = model(cfg, name, args.ctx)
        ok = r["ratio"] <= TARGET
        failed |= not ok
        print(f"{name}: {r['ratio']:.2f}x weight bytes ({r['must'] / 2**30:.2f} GiB a token must read, "
              f"{r['kv'] / 2**20:.0f} MiB of it KV at ctx {args.ctx}; routed experts {r['experts']:.2f}x, "
              f"the rest {r['dense']:.2f}x; with the portable experts {r['portable']:.2f}x) "
              f"{'ok' if ok else 'FAIL'} (target <= {TARGET}x)")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("DS4AGENT_KERNELS", "gpu")
    sys.exit(main())
