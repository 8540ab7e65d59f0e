"""A model's fingerprint: enough to tell whether a session is being continued in the model it was
made with (a session's KV state only means something in the weights that computed it).

The shape check of a KVC file catches another architecture; this catches the same shape with other
weights (another quantisation, another random test model). It reads little, so it costs nothing at
start-up even for an 81 GB file: the file name, its size, and a hash of its head (the GGUF header
and tensor directory: names, types, offsets) and of a sample of its tail (weights, so two files
with the same directory but different values differ too). A converted MLX directory: its file
names and sizes and the hash of its config.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HEAD_BYTES = 4 << 20
TAIL_BYTES = 64 << 10


def fingerprint(path: str | os.PathLike[str]) -> str:
    """"NAME:SIZE:HASH16"; "" when the model cannot be read (nothing is compared then)."""
    p = Path(path)
    h = hashlib.sha256()
    try:
        if p.is_dir():
            size = 0
            for child in sorted(p.iterdir()):
                if child.is_file():
                    n = child.stat().st_size
                    size += n
                    h.update(f"{child.name}\0{n}\0".encode())
            config = p / "config.json"
            if config.is_file():
                h.update(config.read_bytes())
        else:
            size = p.stat().st_size
            with open(p, "rb") as f:
                h.update(f.read(HEAD_BYTES))
                if size > HEAD_BYTES:
                    f.seek(max(HEAD_BYTES, size - TAIL_BYTES))
                    h.update(f.read(TAIL_BYTES))
    except OSError:
        return ""
    return f"{p.name}:{size}:{h.hexdigest()[:16]}"


def same_model(recorded: str, current: str) -> bool:
    """Whether two fingerprints name the same model; an unknown one ("") never raises doubt."""
    return not recorded or not current or recorded == current


def model_name(fp: str) -> str:
    """The file name a fingerprint records."""
    return fp.split(":", 1)[0]
