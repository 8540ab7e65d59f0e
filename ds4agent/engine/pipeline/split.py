"""The layer split: which contiguous layers each rank of a pipeline holds.

Balanced by the bytes each layer's weights take in memory (memory.memory_bytes, the memory plan's
own accounting), rank 0 also holding the embedding and the last rank the output head; or given
explicitly (`--pipeline-split`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..config import open_model
from ..errors import PipelineError
from ..memory import memory_bytes


def balance(layer_bytes: Sequence[int], ranks: int, *, first_extra: int = 0,
            last_extra: int = 0) -> list[tuple[int, int]]:
    """Contiguous layer ranges [(start, stop)] for `ranks` ranks, each with at least one layer,
    that minimise the largest rank's bytes (rank 0 also holds `first_extra`: the embedding; the
    last rank `last_extra`: the output head)."""
    L = len(layer_bytes)
    if not 1 <= ranks <= L:
        raise PipelineError(f"cannot split {L} layers over {ranks} ranks (1..{L} ranks)")
    pre = np.concatenate([[0], np.cumsum(layer_bytes)]).astype(np.int64)

    def cost(k: int, a: int, b: int) -> int:
        c = int(pre[b] - pre[a])
        return c + (first_extra if k == 0 else 0) + (last_extra if k == ranks - 1 else 0)

    inf = float("inf")
    # best[k][b]: the smallest max-load of ranks 0..k covering layers 0..b-1 (k+1 ranks).
    best = [[inf] * (L + 1) for _ in range(ranks)]
    cut = [[0] * (L + 1) for _ in range(ranks)]
    for b in range(1, L + 1):
        best[0][b] = cost(0, 0, b)
    for k in range(1, ranks):
        for b in range(k + 1, L + 1):
            for a in range(k, b):
                v = max(best[k - 1][a], cost(k, a, b))
                if v < best[k][b]:
                    best[k][b], cut[k][b] = v, a
    bounds, b = [L], L
    for k in range(ranks - 1, 0, -1):
        b = cut[k][b]
        bounds.append(b)
    bounds.append(0)
    bounds.reverse()
    return list(zip(bounds, bounds[1:], strict=False))


def ranges_from_split(split: Sequence[int], n_layers: int) -> list[tuple[int, int]]:
    """The ranges of an explicit split: the first layer of ranks 1..N-1 (e.g. [22] for two)."""
    bounds = [0, *[int(s) for s in split], n_layers]
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise PipelineError(f"pipeline split {list(split)} must be increasing layer numbers in "
                            f"1..{n_layers - 1}")
    return list(zip(bounds, bounds[1:], strict=False))


def gguf_layer_bytes(tensors, config) -> tuple[list[int], int, int]:
    """(bytes per layer, embedding bytes, head bytes) of a GGUF directory, as memory holds them
    (the memory plan's accounting: what a rank's share of the model costs)."""
    per = [0] * config.n_layers
    emb = head = 0
    for ti in tensors:
        size = memory_bytes(ti.name, ti.type_name, ti.n_elements, ti.nbytes)
        if ti.name.startswith("blk."):
            per[int(ti.name.split(".", 2)[1])] += size
        elif ti.name == "token_embd.weight":
            emb += size
        else:
            head += size
    return per, emb, head


def plan_ranges(model_path, ranks: int, split: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The layer ranges of a pipeline of `ranks` over a GGUF model (balanced unless `split`)."""
    if Path(model_path).is_dir():
        raise PipelineError(f"{model_path}: a pipeline runs GGUF files only, not converted MLX directories")
    gf, config = open_model(model_path)
    with gf:
        if split:
            ranges = ranges_from_split(split, config.n_layers)
            if len(ranges) != ranks:
                raise PipelineError(f"pipeline split {list(split)} gives {len(ranges)} ranks, not {ranks}")
            return ranges
        per, emb, head = gguf_layer_bytes(gf.tensors.values(), config)
    return balance(per, ranks, first_extra=emb, last_extra=head)
