"""The prefill chunk grid: where a prefill may cut the tokens it runs (model.md §9).

Chunk boundaries sit on absolute multiples of the chunk cap (4096 when ctx > 4096, else ctx), and
a resumed prefill first runs up to the next multiple. On the CPU any schedule gives identical
bits; on a GPU the kernel choice can depend on the rows in a chunk, so a fixed grid is what makes
"prefill, save, load, continue" repeat the uninterrupted run exactly there too. The cap is also
the KVC payload's h3 field, so files stay loadable by ds4.
"""

from __future__ import annotations

MAX_CHUNK = 4096  # model.md §9 / payload h3: the prefill chunk cap when ctx > 4096


def chunk_cap(ctx: int) -> int:
    """Prefill chunk cap and payload h3: 4096 when ctx > 4096, else ctx (model.md §9)."""
    return MAX_CHUNK if ctx > MAX_CHUNK else ctx


def chunk_grid(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """Chunks [p0, p1) covering [start, end) whose boundaries sit on absolute multiples of chunk."""
    out = []
    p = start
    while p < end:
        nxt = min(end, (p // chunk + 1) * chunk)
        out.append((p, nxt))
        p = nxt
    return out
