"""What rank 0 and the worker ranks say to each other (pipeline/rank0.py, pipeline/worker.py).

A command is _HEADER int32s (op, base key, new key, token count, flag, dropped-key count), then the
dropped keys, then the chunk's token ids (forward and import). A layer state crosses the ring as
one flat float32 array: every layer's arrays in LayerState.layout order, each flattened.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..config import ModelConfig
from ..state import LayerState

PER_TOKEN_S = 0.05  # added to a receive's timeout per token of the chunk

FORWARD, EXPORT, IMPORT, STOP = 1, 2, 3, 4
HEADER = 6  # op, base key, new key, token count, flag (last_only), dropped-key count


def flat_size(config: ModelConfig, layer_range: tuple[int, int], n_tokens: int) -> int:
    """Floats of the flat state of layers `layer_range` after n_tokens."""
    return sum(rows * cols for li in range(*layer_range)
               for _, rows, cols in LayerState.layout(config, li, n_tokens))


def flatten_layers(layers: Sequence[LayerState]) -> mx.array:
    parts = [a.reshape(-1) for lay in layers for a in lay.arrays()]
    return mx.concatenate(parts) if parts else mx.zeros((0,), dtype=mx.float32)


def unflatten_layers(flat: mx.array, config: ModelConfig, layer_range: tuple[int, int],
                     n_tokens: int) -> tuple[LayerState, ...]:
    out, off = [], 0
    for li in range(*layer_range):
        arrays = {}
        for name, rows, cols in LayerState.layout(config, li, n_tokens):
            arrays[name] = flat[off:off + rows * cols].reshape(rows, cols)
            off += rows * cols
        out.append(LayerState(**arrays))
    return tuple(out)
