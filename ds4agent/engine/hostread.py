"""Every device->host read the engine makes goes through here, and is counted.

On a GPU, reading an array back to the host drains the device's queue: the host waits until
everything the array depends on has run, and the device then idles while Python builds the rest
of the graph. A decoded token should cost one such read (its id). Funnelling the reads through
one place makes that a number tests and bench/decode.py can check (`reads()` before and after)
instead of a property someone has to re-derive from the code.

    from .hostread import to_host, to_int
    ids = to_host(expert_ids)        # np.ndarray (a copy unless `view=True`)
    token = to_int(token_array)      # one scalar

Only MLX arrays count; numpy input passes through uncounted (the memory-mapped raw experts
and host-side tables are already on the host).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
import numpy as np

# A lock, not a bare `+= 1`: reads happen on several threads (the TUI's worker, a pipeline
# link thread) and a lost increment would make the count a lie. A read costs far more than this.
_lock = threading.Lock()
_count = 0
# Diagnostic hook (bench/decode.py): called with each MLX array just before it is read, so a
# benchmark can see the graph pieces a read cuts a token into. None in normal use.
_hook: Callable[[mx.array], None] | None = None


def set_read_hook(fn: Callable[[mx.array], None] | None) -> None:
    global _hook
    _hook = fn


def _tick(a: mx.array) -> None:
    global _count
    if _hook is not None:
        _hook(a)
    with _lock:
        _count += 1


def reads() -> int:
    """Device->host reads made so far by this process (monotonic; compare two readings)."""
    return _count


def to_host(a: Any, dtype: Any = None, *, view: bool = False) -> np.ndarray:
    """`a` as a numpy array (dtype converted if given). view=True: a read-only view of the
    evaluated MLX buffer where numpy can make one (no copy), for read-once hot paths."""
    if isinstance(a, mx.array):
        _tick(a)
        if view:
            out = np.asarray(a, dtype=dtype)
            out.flags.writeable = False
            return out
        return np.array(a, dtype=dtype, copy=True)
    return np.asarray(a, dtype=dtype)


def to_int(a: Any) -> int:
    """One integer element (a sampled token id, a flag) read back."""
    if isinstance(a, mx.array):
        _tick(a)
        return int(cast(int, a.item()))
    return int(a)


def to_bool(a: Any) -> bool:
    if isinstance(a, mx.array):
        _tick(a)
        return bool(a.item())
    return bool(a)
