"""Typed engine errors: everything the engine refuses crosses the room boundary as an EngineError.

Every message is one readable sentence that names what was wrong (the file, the tensor, the
metadata key, the token count), so the agent/UI can show it verbatim without a traceback.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose; `str(err)` is user-readable."""


class Interrupted(EngineError):
    """`Session.sync()` stopped between two chunks because `should_stop()` said so.

    The live state is left at a consistent prefix: `done` tokens of the request are held.
    """

    def __init__(self, message: str = "prefill interrupted", *, done: int = 0, total: int = 0):
        super().__init__(message)
        self.done = done
        self.total = total


class EngineLost(EngineError):
    """The engine cannot go on (a pipeline rank died or stopped answering): the agent ends the
    session after journalling it, instead of failing every later turn the same way."""


class PipelineError(EngineLost):
    """A pipeline rank died, hung, or could not be started; the pipeline cannot continue."""


class ModelFileError(EngineError):
    """The weight file cannot be read: not a GGUF, truncated, unsupported version or value type."""


class ConfigError(EngineError):
    """Model metadata is missing or does not match what the engine supports (names the key)."""


class TensorError(ModelFileError):
    """A tensor is missing or has the wrong type/shape; `tensor` names it."""

    def __init__(self, message: str, *, tensor: str):
        super().__init__(message)
        self.tensor = tensor


class TensorShapeError(TensorError):
    """A tensor's dimensions differ from what the config requires."""

    def __init__(self, tensor: str, expected: tuple[int, ...], got: tuple[int, ...]):
        super().__init__(
            f"tensor {tensor!r} has shape {_fmt(got)}, expected {_fmt(expected)}", tensor=tensor
        )
        self.expected = tuple(expected)
        self.got = tuple(got)


class TensorTypeError(TensorError):
    """A tensor's GGML type is not one the engine accepts at that place."""

    def __init__(self, tensor: str, got: str, allowed: tuple[str, ...]):
        super().__init__(
            f"tensor {tensor!r} has type {got}, expected {' or '.join(allowed)}", tensor=tensor
        )
        self.got = got
        self.allowed = tuple(allowed)


class MissingTensorError(TensorError):
    def __init__(self, tensor: str, where: str = "the model file"):
        super().__init__(f"tensor {tensor!r} is missing from {where}", tensor=tensor)


class ContextOverflowError(EngineError):
    """A request needs more token positions than the session's context holds."""

    def __init__(self, needed: int, ctx: int):
        super().__init__(f"{needed} tokens do not fit the context of {ctx} tokens")
        self.needed = needed
        self.ctx = ctx


class StateError(EngineError):
    """An imported session state does not fit this model/context (names the offending array)."""


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"
