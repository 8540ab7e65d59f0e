"""The engine: inference only. Tokens in, logits and state out; no policy, no printing.

It owns the model's math (config, ops, model), reading weight files (gguf, quant, weights,
experts/, convert), the device choice, the memory plan, the live session state and its snapshots,
the prefill chunk grid, sampling, and pipeline parallelism (pipeline/). It imports neither
`protocol`, `sessions`, `agent` nor `testmodels`: it hands out and accepts a PayloadState-shaped
object (arrays + header fields) that the agent passes to `sessions`.

Public names (consumers import these from `ds4agent.engine`, not from the modules):

    load_engine(path, ctx=..., ...)  -> Engine     loader.py: one process or a pipeline
    Engine                                         a loaded model (session.py)
    Session                                        one live KV state: sync, step, snapshot, rewind,
                                                   export_state, import_state (session.py)
    Snapshot                                       an O(1) handle on a session state (state.py)
    SnapshotStore                                  turn snapshots sharing their rows (snapshots.py)
    Sampler                                        greedy / temperature / top-k / top-p / min-p with
                                                   a saveable RNG state, on the device (sampler.py)
    generate(session, sampler, max_tokens=, greedy=)  the one decode loop: a generator of token
                                                   ids, the next step computing while the caller
                                                   works on a token (decode.py)
    DutyCycle(percent), FULL_POWER, check_percent  rests between prefill chunks and decoded tokens
                                                   so the device computes at most percent% of the
                                                   time (duty.py; no MLX)
    EngineError and its subclasses                 errors.py: every refusal, one readable line

The model classes load lazily (PEP 562 `__getattr__`): importing the errors, or a module that
needs only the config (`make-test-model`, the command line's help), does not start MLX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .duty import FULL_POWER, DutyCycle, check_percent
from .errors import (
    ConfigError,
    ContextOverflowError,
    EngineError,
    EngineLost,
    Interrupted,
    MissingTensorError,
    ModelFileError,
    PipelineError,
    StateError,
    TensorError,
    TensorShapeError,
    TensorTypeError,
)

if TYPE_CHECKING:
    from .decode import generate
    from .loader import load_engine
    from .sampler import Sampler
    from .session import Engine, Session
    from .snapshots import SnapshotStore
    from .state import Snapshot

# public name -> the module (of this package) that defines it
_LAZY = {
    "load_engine": "loader",
    "Engine": "session",
    "Session": "session",
    "Snapshot": "state",
    "SnapshotStore": "snapshots",
    "Sampler": "sampler",
    "generate": "decode",
}

__all__ = [
    "FULL_POWER",
    "ConfigError",
    "ContextOverflowError",
    "DutyCycle",
    "Engine",
    "EngineError",
    "check_percent",
    "EngineLost",
    "Interrupted",
    "MissingTensorError",
    "ModelFileError",
    "PipelineError",
    "Sampler",
    "Session",
    "Snapshot",
    "SnapshotStore",
    "StateError",
    "TensorError",
    "TensorShapeError",
    "TensorTypeError",
    "generate",
    "load_engine",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
