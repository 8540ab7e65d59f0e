"""DS4 Flash forward pass over a chunk of tokens, as pure functions (model.md §4).

    logits, new_state = forward(weights, config, state, tokens)

Each sublayer runs on the executor of the kernel set the weights were built for (executors/:
reference, fast CPU, GPU; ModelWeights.kernels, chosen once at load): the shared layer plan
(layers.py), or the fast CPU executor's on host arrays (fast_layers.py).

`tokens` are appended after `state` (positions state.n_tokens ...); the whole chunk is processed
layer by layer in batch, and every query sees exactly what the streaming definition gives it
(model.md §9): raw rows max(0, p-W+1)..p, compressed rows 0..(p+1)//r - 1 (ratio 4: filtered by
the indexer over index rows 0..(p+1)//4 - 1).

Bit-exact chunk invariance on CPU (any chunk schedule -> identical logits and state) rests on
every per-query computation having a layout that depends on the query alone, never on the chunk:

* raw window: each query gathers its own W slots, slot j = position p-W+1+j (logical order),
  masked before position 0; all reductions over slots have the fixed length W.
* ratio-4 compressed rows: each query gathers its own top-k slots (rows in ascending order;
  before pruning, rows 0..K-1 with the invisible ones masked): fixed length K.
* other ratios: rows are scored in fixed blocks of `_COMP_BLOCK` rows at fixed absolute offsets
  and the per-block sums are accumulated sequentially, so trailing masked rows/blocks add exact
  zeros.
* expert outputs are summed in selection order by explicit additions; top-k selections are
  exact masks (threshold + tie rank by row index), never an unstable sort.
* compressor pooling runs over fixed-length candidate sets (r rows, or 8 for ratio 4).
Masked entries use -inf scores, so they contribute exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from .config import ModelConfig
from .errors import Interrupted
from .executors import executor_for
from .hostread import to_host
from .layers import Profile, Trace, timed
from .state import LayerState, SessionState, check_token_ids
from .weights import LayerWeights, ModelWeights

F32 = mx.float32
__all__ = ["Profile", "Trace", "build", "embed", "forward", "output_head", "run_layers"]


# ---- whole model ------------------------------------------------------------------------------------


def output_head(weights: ModelWeights, config: ModelConfig, R: mx.array) -> mx.array:
    """§4.7 on the weights' executor: R [n, hc, E] -> logits [n, V]."""
    return executor_for(weights.kernels).output_head(weights, config, R)


def embed(weights: ModelWeights, c: ModelConfig, toks: mx.array) -> mx.array:
    """Token ids [n] -> the hyper-connection input R [n, hc, E] (f32; every stream = the embedding)."""
    assert weights.token_embd is not None  # weights that include layer 0
    x0 = weights.token_embd[toks].astype(F32)
    return mx.broadcast_to(x0[:, None, :], (toks.shape[0], c.hc_count, c.dim))


def run_layers(layer_weights: Sequence[LayerWeights], c: ModelConfig, layer_states: Sequence[LayerState],
               R: mx.array, toks: mx.array, p0: int, *, first_layer: int, kernels: str, rounding: bool = True,
               trace: Trace | None = None, profile: Profile | None = None,
               should_stop: Callable[[], bool] | None = None) -> tuple[mx.array, tuple[LayerState, ...]]:
    """Layers first_layer.. (as many as `layer_weights`) on R [n, hc, E] at positions p0..:
    (R after them, their new states), on the executor of kernel set `kernels` (the weights'
    ModelWeights.kernels). `forward` runs every layer through this; a pipeline rank runs its own
    contiguous range (engine/pipeline/), so both run the same per-layer math.

    should_stop: asked after each sublayer of a prefill chunk (which is evaluated layer by
    layer); when it says so, Interrupted is raised and the chunk's work is dropped (nothing of it
    was committed), so an interrupt acts within one sublayer's time, not a whole chunk's."""
    n = R.shape[0]
    ex = executor_for(kernels)
    new_layers = []
    for li, (lw, lay) in enumerate(zip(layer_weights, layer_states, strict=True), start=first_layer):
        x, post, C = timed(profile, "hyper-connections", ex.hc_pre, lw.hc_attn, R, c)
        y, new_lay = timed(profile, "attention", ex.attention, lw.attn, c, li, x, lay, p0, rounding, trace,
                           profile)
        R = timed(profile, "hyper-connections", ex.hc_post, R, y, post, C)
        if n > 1 and should_stop is not None:
            _evaluate(R, new_lay)  # what a stop between the sublayers needs evaluated
            if should_stop():
                raise Interrupted("prefill interrupted inside a chunk")
        x, post, C = timed(profile, "hyper-connections", ex.hc_pre, lw.hc_ffn, R, c)
        y = timed(profile, "ffn (norm, sum)", ex.ffn, lw.ffn, c, li, x, toks, trace, profile)
        R = timed(profile, "hyper-connections", ex.hc_post, R, y, post, C)
        new_layers.append(new_lay)
        if n > 1:
            # Prefill: materialise layer by layer (bounded graph and memory); decode builds the
            # whole token as one graph.
            _evaluate(R, new_lay)
            if should_stop is not None and should_stop():
                raise Interrupted("prefill interrupted inside a chunk")
    # The fast CPU executor carries R on the host between sublayers (fast_layers.py); the head and
    # a pipeline's next rank take it as an MLX array.
    return (R if isinstance(R, mx.array) else mx.array(R)), tuple(new_layers)


def _evaluate(R: mx.array | np.ndarray, lay: LayerState) -> None:
    """Evaluate the MLX arrays among R (host arrays need nothing) and a layer's new state."""
    mx.eval(*([R] if isinstance(R, mx.array) else []), *lay.arrays())


def forward(weights: ModelWeights, config: ModelConfig, state: SessionState,
            tokens: Sequence[int] | mx.array, *, rounding: bool = True, last_only: bool = False,
            trace: Trace | None = None, profile: Profile | None = None,
            should_stop: Callable[[], bool] | None = None) -> tuple[mx.array, SessionState]:
    """Append `tokens` to `state`: (logits [n, V] float32, new state).

    logits row i = logits after token i (last_only: only the last row, shape [1, V]).
    `rounding=False` turns off the three rounding simulations (f16 rows, fp8sim, fp4 of qat):
    a test-only switch for oracle comparisons of deep configs (model.md §10). `trace` collects
    indexer masks and expert selections for tests.
    """
    c = config
    tok_list = check_token_ids(to_host(tokens).reshape(-1).tolist() if isinstance(tokens, mx.array)
                               else tokens, c.vocab)
    n = len(tok_list)
    if n == 0:
        return mx.zeros((0, c.vocab), dtype=F32), state
    toks = mx.array(np.asarray(tok_list, dtype=np.int32))
    logits, new_layers = build(weights, c, state, toks, rounding=rounding, last_only=last_only,
                               trace=trace, profile=profile, should_stop=should_stop)
    new_state = SessionState(tokens=state.tokens + tuple(tok_list), logits=logits[-1],
                             layers=new_layers)
    mx.eval(logits, *new_state.arrays())
    return logits, new_state


def build(weights: ModelWeights, config: ModelConfig, state: SessionState, toks: mx.array, *,
          rounding: bool = True, last_only: bool = False, trace: Trace | None = None,
          profile: Profile | None = None,
          should_stop: Callable[[], bool] | None = None) -> tuple[mx.array, tuple[LayerState, ...]]:
    """The graph of `forward` over device token ids toks [n] int32: (logits, new layer states),
    unevaluated for decode (n = 1; prefill evaluates layer by layer in run_layers). Reads no
    id back: decode.py passes the sampler's lazy id straight in. The caller guarantees the ids
    are in the vocabulary (the sampler can only draw such ids; `forward` checks host lists)."""
    c = config
    p0 = state.n_tokens
    R = embed(weights, c, toks)
    R, new_layers = run_layers(weights.layers, c, state.layers, R, toks, p0, first_layer=0,
                               kernels=weights.kernels, rounding=rounding, trace=trace, profile=profile,
                               should_stop=should_stop)
    logits = timed(profile, "head", output_head, weights, c, R[-1:] if last_only else R)
    return logits, new_layers
