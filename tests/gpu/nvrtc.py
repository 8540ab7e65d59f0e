"""NVIDIA's runtime compiler (NVRTC) through ctypes, found in the `nvidia-cuda-nvrtc` wheel
(with the `nvidia-cuda-runtime` and `nvidia-cuda-cccl` wheels for the headers MLX's generated
CUDA source includes): compile a source to PTX, as MLX's CUDA backend does, with no GPU.

    find() -> Nvrtc | None (and why not, in `missing()`)
    Nvrtc.ptx(source, name) -> PTX text, or NvrtcError with the compiler's log
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# MLX's options (mlx/backend/cuda/jit_module.cpp) name the device's own architecture; the oldest
# one MLX's CUDA build supports (7.5) is the strictest check of what the kernels may use.
ARCH = "compute_75"
# What MLX's "mlx/backend/cuda/device/utils.cuh" brings in that the kernels may rely on: the
# CUDA half/bfloat16 headers and libcu++'s std headers (MLX's own complex type and config are
# not used by the kernels; the subset excludes them).
MLX_UTILS_STUB = """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/tuple>
"""


class NvrtcError(Exception):
    pass


def _cu13_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def missing() -> str | None:
    """Why NVRTC cannot be used here, or None."""
    try:
        find()
    except NvrtcError as err:
        return str(err)
    return None


@dataclass(frozen=True)
class Nvrtc:
    lib: ctypes.CDLL
    includes: tuple[str, ...]

    def ptx(self, source: str, name: str, arch: str = ARCH) -> str:
        """PTX of `source` (cached by its hash under the temp dir: each test session compiles a
        changed source once)."""
        key = hashlib.sha256("\0".join([source, arch, *self.includes]).encode()).hexdigest()[:24]
        cache = Path(tempfile.gettempdir()) / f"ds4agent-nvrtc-{os.getuid()}" / f"{key}.ptx"
        if cache.exists():
            return cache.read_text()
        text = self._compile(source, name, arch)
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, cache)
        return text

    def _compile(self, source: str, name: str, arch: str) -> str:
        stub_root = Path(tempfile.mkdtemp(prefix="ds4-nvrtc-"))
        stub = stub_root / "mlx" / "backend" / "cuda" / "device" / "utils.cuh"
        stub.parent.mkdir(parents=True)
        stub.write_text(MLX_UTILS_STUB)
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                                0, None, None), "nvrtcCreateProgram")
        try:
            opts = [b"--device-as-default-execution-space", f"--gpu-architecture={arch}".encode(),
                    f"--include-path={stub_root}".encode(), *[f"--include-path={i}".encode() for i in self.includes]]
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            n = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            log = ctypes.create_string_buffer(n.value)
            self.lib.nvrtcGetProgramLog(prog, log)
            if rc:
                raise NvrtcError(f"{name} ({arch}) does not compile:\n{log.value.decode(errors='replace')[-4000:]}")
            self.lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
            out = ctypes.create_string_buffer(n.value)
            self._check(self.lib.nvrtcGetPTX(prog, out), "nvrtcGetPTX")
            return out.value.decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
            for p in sorted(stub_root.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            stub_root.rmdir()

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise NvrtcError(f"{what} failed with NVRTC status {rc}")


def find() -> Nvrtc:
    """NVRTC and the CUDA headers from the nvidia-* wheels of this environment."""
    for root in _cu13_dirs():
        for sub in sorted(root.glob("cu*"), reverse=True):
            libs = sorted(glob.glob(str(sub / "lib" / "libnvrtc.so*")))
            inc = sub / "include"
            if not libs:
                continue
            if not (inc / "cuda_fp16.h").exists():
                raise NvrtcError(f"NVRTC is installed but not the CUDA headers (pip install nvidia-cuda-runtime): {inc}")
            if not (inc / "cccl" / "nv" / "target").exists():
                raise NvrtcError(f"NVRTC is installed but not CCCL's headers (pip install nvidia-cuda-cccl): {inc}")
            try:
                lib = ctypes.CDLL(libs[0])
            except OSError as err:
                raise NvrtcError(f"NVRTC does not load: {err}") from err
            return Nvrtc(lib, (str(inc / "cccl"), str(inc)))
    raise NvrtcError("tooling: NVIDIA's runtime compiler is not installed (the `nvidia-cuda-nvrtc`, "
                     "`nvidia-cuda-runtime` and `nvidia-cuda-cccl` wheels of the [test] extra, Linux only)"
                     + ("" if os.name == "posix" else "; it has no wheels for this platform"))
