"""Regex matching for `search` in a child process that can be killed.

Why a process: Python's `re` backtracks, and a pattern such as ^(\\w+\\s?)+$ on a 40-character line
that almost matches runs for hours inside C code that holds the GIL, so in-process the UI thread,
the user's interrupt and any timer stop with it, and a thread cannot be killed. A child process
can be: the parent waits for its answer with the GIL released, polling the interrupt flag and
the search's deadline, and kills it on either. The alternative, a backtracking-safe engine (RE2),
would be a new compiled dependency whose syntax differs from the Python `re` dialect the model is
told it writes (no lookaround, no backreferences); one child per regex search costs ~20 ms.

Only the standard library is imported: the parent runs this very file as a script with
`python -I -S`, so the child starts fast and cannot pick up anything from the working directory.

Public API:
    RegexWorker(pattern, flags, time_limit)   start the child (the pattern already compiles)
      .hits(texts, max_hits, deadline, should_stop) -> list[int]   indices of matching lines
      .close()                                 end the child (also a context manager)
    RegexTimeout, RegexInterrupted             raised by hits(); the child is gone by then
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable

POLL_SEC = 0.1
# A request: (number of lines, most hits wanted, payload bytes); a reply: payload bytes.
_REQUEST = struct.Struct("<III")
_REPLY = struct.Struct("<I")
# Seconds the child outlives the search's time limit before it ends itself: a parent killed
# with SIGKILL mid-search cannot kill it, and a catastrophic regex would otherwise spin forever.
_ORPHAN_GRACE = 10


class RegexTimeout(Exception):
    """The search's deadline passed while the regex ran."""


class RegexInterrupted(Exception):
    """The user interrupted while the regex ran."""


class RegexWorkerFailed(Exception):
    """The child died or answered nonsense (out of memory, killed from outside)."""


class RegexWorker:
    def __init__(self, pattern: str, flags: int, time_limit: float) -> None:
        init = json.dumps({"pattern": pattern, "flags": flags,
                           "alarm": int(time_limit) + _ORPHAN_GRACE}).encode("utf-8")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            # Its own session: a Ctrl+C typed in a plain terminal reaches the agent, which decides;
            # the child ends when the parent kills it or closes its stdin.
            start_new_session=True,
        )
        self._send(_REPLY.pack(len(init)) + init)

    def __enter__(self) -> RegexWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        proc.wait()

    def _send(self, data: bytes) -> None:
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self.close()
            raise RegexWorkerFailed(f"the regex worker stopped: {exc}") from None

    def hits(self, texts: list[str], max_hits: int, deadline: float,
             should_stop: Callable[[], bool]) -> list[int]:
        """Indices of the lines the regex finds a match in, at most `max_hits`, in order.
        Raises RegexTimeout at `deadline` (time.monotonic()), RegexInterrupted when should_stop()
        says so; both kill the child (a worker cannot be reused after either)."""
        payload = "\n".join(texts).encode("utf-8")
        self._send(_REQUEST.pack(len(texts), max_hits, len(payload)) + payload)
        head = self._read(_REPLY.size, deadline, should_stop)
        (size,) = _REPLY.unpack(head)
        body = self._read(size, deadline, should_stop)
        try:
            return [int(i) for i in json.loads(body)]
        except (ValueError, TypeError):
            self.close()
            raise RegexWorkerFailed("the regex worker answered garbage") from None

    def _read(self, n: int, deadline: float, should_stop: Callable[[], bool]) -> bytes:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        chunks: list[bytes] = []
        left = n
        while left:
            if should_stop():
                self.close()
                raise RegexInterrupted
            wait = min(POLL_SEC, deadline - time.monotonic())
            if wait <= 0:
                self.close()
                raise RegexTimeout
            # select() releases the GIL while it waits: the rest of the app keeps running.
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                continue
            chunk = os.read(fd, left)
            if not chunk:
                self.close()
                raise RegexWorkerFailed("the regex worker ended unexpectedly")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


# --------------------------------------------------------------------------------------------------
# The child


def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def _serve(stdin, stdout) -> None:
    head = _read_exact(stdin, _REPLY.size)
    if head is None:
        return
    init = json.loads(_read_exact(stdin, _REPLY.unpack(head)[0]) or b"{}")
    # SIGALRM's default action ends the process even inside the regex engine.
    signal.alarm(int(init["alarm"]))
    rx = re.compile(init["pattern"], int(init["flags"]))
    while True:
        head = _read_exact(stdin, _REQUEST.size)
        if head is None:
            return  # the parent closed our stdin: the search is over
        count, max_hits, size = _REQUEST.unpack(head)
        payload = _read_exact(stdin, size)
        if payload is None:
            return
        texts = payload.decode("utf-8").split("\n") if count else []
        found: list[int] = []
        for i, text in enumerate(texts):
            if rx.search(text):
                found.append(i)
                if len(found) >= max_hits:
                    break
        reply = json.dumps(found).encode("ascii")
        stdout.write(_REPLY.pack(len(reply)) + reply)
        stdout.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
