"""--trace FILE: an append-mode, timestamped, token-level debug trace (agent-reference.md §2).

Every line starts `YYYY-MM-DD HH:MM:SS.mmm`. Tokens are written as `index id bytes-len
escaped-text hex`, so a trace shows exactly what the model saw and produced. The file is opened
once (line-buffered) and written only from the worker thread; a write failure disables the
trace with one notice instead of breaking the session.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def escape_bytes(data: bytes) -> str:
    """Printable ASCII as is, everything else as \\n, \\t, \\xHH (one readable column)."""
    out = []
    for b in data:
        if b == 0x0A:
            out.append("\\n")
        elif b == 0x09:
            out.append("\\t")
        elif b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


class TraceLog:
    def __init__(self, path: Path | None, on_error: Callable[[str], None] | None = None) -> None:
        self._file: TextIO | None = None
        self._on_error = on_error
        if path is not None:
            try:
                # 0600 from the start: a trace holds the whole transcript (prompts, file contents,
                # command output), so other users must never be able to read it.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._file = open(fd, "a", encoding="utf-8", buffering=1)
            except OSError as err:
                self._fail(f"cannot open trace file {path}: {err.strerror or err}")

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def _fail(self, message: str) -> None:
        self._file = None
        if self._on_error is not None:
            self._on_error(message)

    def line(self, text: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(f"{_stamp()} {text}\n")
        except OSError as err:
            self._fail(f"trace disabled: {err.strerror or err}")

    def token(self, index: int, token: int, data: bytes, tag: str = "gen") -> None:
        if self._file is not None:
            self.line(f"{tag} {index} {token} {len(data)} \"{escape_bytes(data)}\" {data.hex()}")

    def tokens(self, start: int, ids: Sequence[int], token_bytes: Callable[[int], bytes], tag: str) -> None:
        if self._file is None:
            return
        for k, t in enumerate(ids):
            self.token(start + k, t, token_bytes(t), tag)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
