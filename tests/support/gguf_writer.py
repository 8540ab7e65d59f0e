"""Writing GGUF fixtures with gguf.GGUFWriter: a tensor as it is, or as raw quantised blocks, and
the file finished in the order the writer needs (header, metadata, tensor data)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def add_tensor(w: gguf.GGUFWriter, name: str, arr: np.ndarray,
               raw_dtype: gguf.GGMLQuantizationType | None = None) -> None:
    """`arr` as a tensor, or, with raw_dtype, as that type's encoded blocks (arr's shape in bytes)."""
    if raw_dtype is None:
        w.add_tensor(name, arr)
    else:
        w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=raw_dtype)


def finish(w: gguf.GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
