"""engine/hostmem.py: large host arrays made and dropped again and again (a prefill's per-layer
temporaries) reuse freed heap memory on every thread instead of fresh mappings faulted in page by
page (glibc's own accounts of mapped blocks and arenas say where a block came from)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings")

_PROBE = """
import ctypes, os, resource, sys, tempfile, threading
import numpy as np
from ds4agent.engine.hostmem import keep_freed_memory, share_one_arena

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
took = share_one_arena() and keep_freed_memory() if sys.argv[1] == "keep" else None
seen = []

def cycles():
    mapped, before = 0, libc.mallinfo2().hblkhd  # bytes in blocks mapped on their own
    r0 = None
    for i in range(6):
        a = np.ones(48 << 20, np.uint8)  # above glibc's largest default mmap threshold (32 MiB)
        mapped = max(mapped, libc.mallinfo2().hblkhd - before)
        del a
        if i == 0:
            r0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    seen.append((mapped, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - r0))

cycles()
t = threading.Thread(target=cycles)  # a worker thread, as the agent prefills on one
t.start()
t.join()
path = os.path.join(tempfile.mkdtemp(), "info.xml")
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
arenas = open(path).read().count("<heap nr=")
print(took, arenas, *(v for pair in seen for v in pair))
"""


def _probe(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_freed_large_arrays_are_reused_from_one_heap_on_every_thread():
    took, arenas, main_mapped, main_faults, worker_mapped, worker_faults = _probe("keep")
    assert took == "True" and arenas == "1"  # the worker thread shares the first heap
    assert main_mapped == worker_mapped == "0"  # 48 MiB blocks from the heap, not fresh mappings
    assert int(main_faults) < 100 and int(worker_faults) < 100  # five more arrays: memory reused
    _, arenas, main_mapped, _, _, _ = _probe("default")
    assert int(arenas) >= 2 and int(main_mapped) >= 48 << 20  # what glibc does unasked


def test_the_settings_apply_once_per_process_and_can_be_left_alone():
    import os

    from ds4agent.engine.hostmem import keep_freed_memory, share_one_arena

    assert keep_freed_memory() is keep_freed_memory() is True
    assert share_one_arena() is True
    env = {**os.environ, "DS4AGENT_ALLOCATOR": "default"}
    out = subprocess.run([sys.executable, "-c", "from ds4agent.engine import hostmem; "
                          "print(hostmem.share_one_arena(), hostmem.keep_freed_memory())"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "False"]
