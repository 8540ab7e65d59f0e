"""One state layout: what a forward pass holds is what LayerState.layout, the memory plan, the
pipeline's wire format and the KVC payload's shape all say it is."""

import numpy as np
import pytest

from ds4agent.engine import EngineError, StateError
from ds4agent.engine.config import test_config
from ds4agent.engine.memory import layers_state_bytes
from ds4agent.engine.model import forward
from ds4agent.engine.pipeline import wire
from ds4agent.engine.state import LayerState, SessionState, check_token_ids, empty_layer
from ds4agent.sessions.payload import PayloadShape, payload_size
from ds4agent.testmodels.random_weights import random_weights

# micro: ratios (0, 0, 4, 16), window 8; 21 tokens cross the window and both ratios' groups.
TOKENS = [3, 17, 250, 9, 9, 41, 100, 7, 300, 2, 5, 77, 12, 501, 64, 33, 1, 8, 90, 91, 92]


def _state():
    cfg = test_config("micro")
    _, state = forward(random_weights(cfg, 0), cfg, SessionState.empty(cfg), TOKENS, last_only=True)
    return cfg, state


def test_a_forward_pass_holds_exactly_the_layout():
    cfg, state = _state()
    T = len(TOKENS)
    for li, lay in enumerate(state.layers):
        got = [(name, *getattr(lay, name).shape) for name, _, _ in LayerState.layout(cfg, li, T)]
        assert got == LayerState.layout(cfg, li, T)
        assert len(lay.arrays()) == len(got)  # nothing beyond the layout
        assert lay.nbytes == LayerState.state_bytes(cfg, li, T)
    assert [len(LayerState.layout(cfg, li, T)) for li in range(4)] == [1, 1, 7, 4]


def test_the_memory_plan_and_the_payload_count_the_same_bytes():
    cfg, state = _state()
    T = len(TOKENS)
    assert layers_state_bytes(cfg, T, range(cfg.n_layers)) == sum(lay.nbytes for lay in state.layers)
    shape = PayloadShape(n_layers=cfg.n_layers, head_dim=cfg.head_dim, indexer_dim=cfg.indexer_dim,
                         vocab=cfg.vocab, window=cfg.window, ratios=cfg.ratios)
    for li in range(cfg.n_layers):
        assert shape.layer_arrays(li, T, min(T, cfg.window)) == LayerState.layout(cfg, li, T)
    # The DSV4 payload: its header, the tokens, the logits, two counts per layer, then the arrays.
    ctx = 64
    assert payload_size(shape, T, ctx) == (52 + 4 * T + 4 * cfg.vocab + 8 * cfg.n_layers
                                           + sum(lay.nbytes for lay in state.layers))


def test_the_wire_format_round_trips_a_state():
    cfg, state = _state()
    T = len(TOKENS)
    flat = wire.flatten_layers(state.layers[1:])
    assert flat.size == wire.flat_size(cfg, (1, 4), T)
    back = wire.unflatten_layers(flat, cfg, (1, 4), T)
    for a, b in zip(state.layers[1:], back, strict=True):
        assert all(np.array_equal(np.array(x), np.array(y)) for x, y in zip(a.arrays(), b.arrays(), strict=True))


def test_an_empty_layer_is_the_layout_at_zero_tokens_with_the_filler():
    cfg = test_config("micro")
    lay = empty_layer(cfg, 2)
    assert [(n, *getattr(lay, n).shape) for n, _, _ in LayerState.layout(cfg, 2, 0)] == LayerState.layout(cfg, 2, 0)
    assert np.all(np.array(lay.attn_score) == np.float32(-1.0e30)) and not np.array(lay.attn_kv).any()
    assert np.all(np.array(lay.index_score) == np.float32(-1.0e30)) and not np.array(lay.index_kv).any()


def test_token_ids_are_checked_in_one_place():
    assert check_token_ids([0, 5, 511], 512) == (0, 5, 511)
    with pytest.raises(EngineError, match=r"token id 512 at position 1 is outside the vocabulary \(0\.\.511\)"):
        check_token_ids([1, 512], 512)
    with pytest.raises(StateError, match="token id -1 at position 0"):
        check_token_ids([-1], 512, error=StateError)
