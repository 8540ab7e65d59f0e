"""Indexer selection and expert routing rules (model.md §4.5, §4.6, §10 items 7-8)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import EngineError
from ds4agent.engine.config import test_config
from ds4agent.engine.executors import executor_for
from ds4agent.engine.layers import ffn_block, indexer_slots
from ds4agent.engine.model import forward
from ds4agent.engine.state import SessionState
from ds4agent.testmodels.random_weights import random_weights


def _slots(values, n_vis, K):
    """Indexer slots for one query whose per-row scores are relu(values) (1 head, weight 1)."""
    cfg = test_config("micro", indexer_top_k=K, indexer_heads=1)
    keys = np.zeros((len(values), 32), dtype=np.float32)
    keys[:, 0] = values
    iq = np.zeros((1, 1, 32), dtype=np.float32)
    iq[0, 0, 0] = 1.0
    idx, valid = indexer_slots(cfg, mx.array(iq), mx.ones((1, 1)), mx.array(keys),
                                np.array([n_vis]), None)
    idx, valid = np.array(idx)[0], np.array(valid)[0]
    return sorted(idx[valid].tolist())


def test_indexer_keeps_all_rows_up_to_top_k():
    assert _slots([5.0, 1.0, 2.0, 9.0], n_vis=3, K=4) == [0, 1, 2]
    assert _slots([5.0, 1.0, 2.0, 9.0], n_vis=4, K=4) == [0, 1, 2, 3]


def test_indexer_top_k_ties_go_to_the_lower_row_and_invisible_rows_never_count():
    vals = [3.0, 1.0, 3.0, 2.0, 3.0, 0.0, 50.0]
    assert _slots(vals, n_vis=6, K=2) == [0, 2]  # row 6 (score 50) is not visible yet
    assert _slots(vals, n_vis=6, K=4) == [0, 2, 3, 4]
    # negative scores clamp to 0 (relu): ties among zeros also go to the lower rows
    assert _slots([-1.0, -2.0, 0.5, -3.0, -4.0], n_vis=5, K=3) == [0, 1, 2]


def test_indexer_selection_is_a_set_independent_of_row_order():
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(40).astype(np.float32)
    sel = _slots(vals, n_vis=40, K=7)
    assert sel == sorted(np.argsort(-np.maximum(vals, 0), kind="stable")[:7].tolist())


def test_top_u_orders_by_score_and_breaks_ties_to_the_lower_index():
    s = mx.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(np.array(executor_for("reference").top_u(s, 3)), [[1, 2, 4], [0, 1, 2]])


@pytest.mark.parametrize("layer", [0, 3])
def test_routing_weights_sum_to_scale_and_hash_layers_ignore_the_bias(layer):
    cfg = test_config("micro")
    w = random_weights(cfg, 1, quantize_q8=False)
    fw = w.layers[layer].ffn
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((6, cfg.dim)).astype(np.float32))
    toks = mx.array(rng.integers(0, cfg.vocab, 6).astype(np.int32))
    from ds4agent.engine.model import Trace

    tr = Trace.new()
    ffn_block(executor_for("reference"), fw, cfg, layer, x, toks, tr)
    sel = tr.experts[layer][0]
    np.testing.assert_allclose(tr.expert_weights[layer][0].sum(axis=-1), 1.5, rtol=1e-6)
    if layer < cfg.n_hash_layers:
        np.testing.assert_array_equal(sel, np.array(fw.tid2eid)[np.array(toks)])
        assert fw.bias is None
    else:
        # a huge bias on one expert forces its selection (selection only)
        from dataclasses import replace

        bias = np.zeros(cfg.n_experts, dtype=np.float32)
        bias[5] = 100.0
        tr2 = Trace.new()
        y_biased = ffn_block(executor_for("reference"), replace(fw, bias=mx.array(bias)), cfg, layer, x, toks, tr2)
        assert (tr2.experts[layer][0][:, 0] == 5).all()
        assert np.isfinite(np.array(y_biased)).all()


def test_forward_rejects_out_of_range_token_ids():
    cfg = test_config("micro")
    w = random_weights(cfg, 0)
    with pytest.raises(EngineError, match="outside the vocabulary"):
        forward(w, cfg, SessionState.empty(cfg), [1, cfg.vocab])
