"""DSV4 session payload <-> PayloadState (plain numpy arrays + shape header).

CONTRACT between the engine and the session store (see shared/spec/kvc-format.md §9 and
architecture.md). The engine never imports this module: it produces and consumes objects that
have exactly these attribute names (duck typing), so `engine` and `sessions` stay independent and
the agent connects them.

The reader/writer are filled in by the session-files work; the data classes below are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAYLOAD_MAGIC = 0x34565344  # bytes 44 53 56 34 = "DSV4"
PAYLOAD_VERSION = 2


@dataclass(frozen=True)
class PayloadShape:
    """The model layout a payload must match (header fields h8..h11 plus per-layer ratios).

    Built by the engine from its ModelConfig (attribute names identical), or by hand in tests.
    """

    n_layers: int  # h8
    head_dim: int  # h9, D (raw/attention rows)
    indexer_dim: int  # h10, Di
    vocab: int  # h11, V
    window: int  # sliding window of the model (128 on Flash); h5 = min(window, ctx)
    ratios: tuple[int, ...]  # compress ratio per layer: 0, 4 (two lanes + indexer) or other (one lane)

    def coff(self, layer: int) -> int:
        """Lanes of the layer's compressor: 2 for ratio 4, 1 for any other non-zero ratio."""
        return 2 if self.ratios[layer] == 4 else 1


@dataclass
class LayerPayload:
    """One layer's state, all float32, all row-major 2-D arrays.

    raw:          [R, D]  last R = min(T, window) raw rows in LOGICAL order (positions T-R .. T-1)
    comp:         [T // ratio, D] compressed rows (None on dense layers, ratio 0)
    attn_kv:      [coff*ratio, coff*D] compressor frontier projections (None on dense layers)
    attn_score:   [coff*ratio, coff*D] compressor frontier scores, APE added (None on dense)
    index_comp:   [T // 4, Di] indexer rows (ratio-4 layers only, else None)
    index_kv:     [coff*ratio, coff*Di] indexer compressor frontier (ratio-4 only)
    index_score:  [coff*ratio, coff*Di]
    Frontier rows outside the current partial window hold the canonical filler (kv 0.0,
    score -1e30), kvc-format.md §9.4.
    """

    raw: np.ndarray
    comp: np.ndarray | None = None
    attn_kv: np.ndarray | None = None
    attn_score: np.ndarray | None = None
    index_comp: np.ndarray | None = None
    index_kv: np.ndarray | None = None
    index_score: np.ndarray | None = None


@dataclass
class PayloadState:
    """Everything needed to resume after T tokens (model.md §8), as the payload stores it.

    tokens: uint32 [T]; logits: float32 [V] (logits after token T-1); layers: one LayerPayload per
    layer. ctx is the session context the header records (h2); the other header fields derive from
    ctx and the shape (kvc-format.md §9.1) and are computed by the writer.
    """

    ctx: int
    tokens: np.ndarray
    logits: np.ndarray
    layers: list[LayerPayload]
