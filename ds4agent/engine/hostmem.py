"""The C allocator's settings for the host-side engine (glibc only): freed memory kept for reuse.

A prompt's chunk moves through each layer as a handful of large host arrays (at 512 tokens the
hyper-connection streams alone are 32 MiB, made and dropped several times a layer). glibc serves
every allocation above its mmap threshold (at most 32 MiB, adjusted as it goes) with a fresh
mapping and unmaps it on free, so each such array was faulted in and zeroed by the kernel page by
page, then returned: measured on the Flash-shape q2 file, a 512-token prefill made 3 million page
faults and spent 19-23 s of its 62-67 s in the kernel. Threads other than the first also get
arenas of their own, capped at 64 MiB per heap, whose large blocks go to fresh mappings the same
way (the agent prefills on a worker thread).

Two settings, each applied once per process:
  * share_one_arena(): one arena for every thread, so the engine's worker threads allocate from
    the first heap, whose blocks can be any size. It only applies to threads that have not
    allocated yet: the agent command calls it before its front end starts a thread, the engine's
    loader again (other commands, library use).
  * keep_freed_memory(): the mmap threshold and the trim threshold to 1 GiB, so blocks below
    1 GiB come from the heap and a freed block stays mapped for the next allocation instead of
    going back to the kernel. The loader calls it once the weights are in place: during the load,
    the repacking's large temporaries are still handed back to the kernel at once (kept in the
    heap, the holes they leave raised the peak by 0.4 GiB on that file).
Measured, same file and prompt, prefill from a worker thread: 63.4 s -> 42.0 s, system time
20.1 s -> 0.5 s, page faults 3.07 M -> 63 k; peak RSS 10.98 -> 11.01 GiB (what is kept is what
the peak held anyway). On a 68-token prompt no difference either way (its arrays are under the
threshold glibc adjusts itself). Elsewhere than glibc (macOS's allocator, musl) both do nothing
and say so.

Diagnostic switch: DS4AGENT_ALLOCATOR=default leaves glibc's settings alone (to measure them).

    share_one_arena() -> bool     whether one arena serves every thread from now on
    keep_freed_memory() -> bool   whether freed blocks below KEPT_BELOW stay mapped from now on
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
KEPT_BELOW = 1 << 30  # blocks up to this size come from the heap and stay mapped when freed

_lock = threading.Lock()
_applied: dict[str, bool] = {}  # setting -> result, once tried


def share_one_arena() -> bool:
    """One malloc arena for every thread that has not allocated yet (once per process)."""
    return _once("arena", ((_M_ARENA_MAX, 1),))


def keep_freed_memory() -> bool:
    """Blocks below KEPT_BELOW from the heap, kept mapped when freed (once per process)."""
    return _once("keep", ((_M_MMAP_THRESHOLD, KEPT_BELOW), (_M_TRIM_THRESHOLD, KEPT_BELOW)))


def _once(name: str, settings: tuple[tuple[int, int], ...]) -> bool:
    with _lock:
        if name not in _applied:
            _applied[name] = _apply(settings)
        return _applied[name]


@functools.cache
def _mallopt() -> Any:
    """glibc's mallopt, or None elsewhere. The process's own symbols hold the C library it runs
    on (no search for a file, which ctypes.util.find_library does with a subprocess)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None  # not glibc: its allocator has no such settings
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def _apply(settings: tuple[tuple[int, int], ...]) -> bool:
    if os.environ.get("DS4AGENT_ALLOCATOR") == "default":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # Each returns 1 when taken (glibc refuses an mmap threshold above its heap size limit).
    return all(mallopt(param, value) == 1 for param, value in settings)
