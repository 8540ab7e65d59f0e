"""Shared fixtures of the weights tests: random GGUF quant blocks with controlled scale fields."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ds4agent.engine import quant

# our type ids -> gguf's, for its reference dequantisers
GGML = {
    quant.Q8_0: gguf.GGMLQuantizationType.Q8_0,
    quant.Q2_K: gguf.GGMLQuantizationType.Q2_K,
    quant.Q4_K: gguf.GGMLQuantizationType.Q4_K,
    quant.IQ2_XXS: gguf.GGMLQuantizationType.IQ2_XXS,
}

# byte offsets of the f16 scale fields inside one block
F16_FIELDS = {
    quant.Q8_0: (0,),
    quant.Q2_K: (80, 82),
    quant.Q4_K: (0, 2),
    quant.IQ2_XXS: (0,),
}


def random_blocks(rng: np.random.Generator, qtype: int, n_blocks: int, *, scale: float | None = 0.01) -> np.ndarray:
    """n_blocks random blocks [n_blocks, bytes_per_block] uint8.

    Random bytes are valid blocks for every type here; only the f16 scale fields may decode to
    inf/nan. With `scale` set they are replaced by finite f16 values of about that magnitude (and
    random sign), which also keeps matmul results in a sane range; with scale=None they stay raw.
    """
    size = quant.block_info(qtype)[1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if scale is not None and qtype == quant.MXFP4:  # the E8M0 byte: a power of two near `scale`
        raw[:, 0] = np.round(128 + np.log2(scale) + rng.uniform(-1.0, 1.0, n_blocks)).astype(np.uint8)
    elif scale is not None:
        for off in F16_FIELDS[qtype]:
            vals = (rng.uniform(0.25, 1.0, n_blocks) * scale * rng.choice([-1, 1], n_blocks)).astype(np.float16)
            raw[:, off : off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
