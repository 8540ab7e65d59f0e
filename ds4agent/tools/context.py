"""The context a tool runs in: one per agent, reused across turns.

    ToolContext(cwd, should_stop, output_dir, on_write)   paths, the interrupt poll, bash jobs,
                                                          seen lines, the `more` cursor
    SeenLines     which lines of which files the model has seen (the edit guard's memory)
    ReadCursor    where `more` continues
    temp_dir(ctx) where bash output files go
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ds4agent.tools.jobs import JobTable
from ds4agent.tools.results import ToolError
from ds4agent.tools.sandbox import Grants


class SeenLines:
    """Which lines of which files the model has seen, with the CRC32 of each line as it was shown.

    Keys are absolute resolved paths; line numbers are 1-based; the CRC covers the line's bytes
    including its terminator, so a line whose ending changed also counts as changed. The memory is
    cleared on /new and /switch (the agent calls clear()), not on compaction.
    """

    def __init__(self) -> None:
        self._files: dict[str, dict[int, int]] = {}

    @staticmethod
    def crc(line: bytes) -> int:
        return zlib.crc32(line)

    def clear(self) -> None:
        self._files.clear()

    def lines(self, path: str) -> dict[int, int]:
        return self._files.setdefault(path, {})

    def get(self, path: str) -> dict[int, int] | None:
        return self._files.get(path)

    def record(self, path: str, numbered: Iterable[tuple[int, bytes]]) -> None:
        rec = self._files.setdefault(path, {})
        for lineno, raw in numbered:
            rec[lineno] = zlib.crc32(raw)

    def replace(self, path: str, numbered: Iterable[tuple[int, bytes]]) -> None:
        self._files[path] = {n: zlib.crc32(raw) for n, raw in numbered}


@dataclass
class ReadCursor:
    """Where `more` continues: the path as the model wrote it, its absolute form, the next line."""

    path: str
    abs_path: str
    next_line: int
    raw: bool


def _never() -> bool:
    return False


@dataclass
class ToolContext:
    """Everything a tool may touch besides its arguments; one per agent, reused across turns.

    should_stop: polled by waiting tools (bash) every 100 ms; True ends the wait early.
    output_dir:  where bash output files go (default: the system temp directory); a file named to
                 the model is kept until close() (see tools/jobs.py), so it can read the rest.
    """

    cwd: Path
    should_stop: Callable[[], bool] = _never
    output_dir: Path | None = None
    seen: SeenLines = field(default_factory=SeenLines)
    last_read: ReadCursor | None = None
    jobs: JobTable = field(default_factory=JobTable)
    # What the user allowed bash jobs beyond the sandbox's boundary (tools/sandbox.py).
    sandbox: Grants = field(default_factory=Grants)
    # The Unix sockets outside the tree the user allowed jobs to reach (tools/sandbox_settings.py).
    sockets: tuple[str, ...] = ()
    # Told of every file write/edit after it succeeded: (absolute path, content before or None
    # when the file did not exist, content written). The agent's undo log listen here.
    on_write: Callable[[str, bytes | None, bytes], None] | None = None
    # Set by the permission policy for the call it just checked (a files.Approval: the real path
    # it judged, the change the question showed); the write/edit tool takes it and refuses to
    # write when the file or its path changed since. Any other call's check clears it.
    approved: object | None = None
    # --edit-upto: an edit's old may be HEAD[upto]TAIL (off by default: exact text only, since the
    # model reached for [upto] where the exact text was the better choice).
    edit_upto: bool = False

    def __post_init__(self) -> None:
        self.cwd = Path(self.cwd)

    def resolve(self, path: str) -> Path:
        """The absolute path of a model-supplied path (relative ones are relative to cwd). A NUL
        byte cannot be in a path (the OS call would raise ValueError): a tool error instead."""
        if "\0" in path:
            raise ToolError("invalid path: it contains a NUL byte")
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else self.cwd / p

    def abs_key(self, path: str | Path) -> str:
        """The guard key of a path: absolute, symlinks resolved, so ./a and a are the same file."""
        return os.path.realpath(self.resolve(str(path)))

    def reset_session(self) -> None:
        """On /new and /switch: forget seen lines and what the user allowed bash jobs beyond the
        sandbox (bash jobs and the `more` cursor survive)."""
        self.seen.clear()
        self.sandbox = Grants()

    def close(self) -> None:
        """Agent shutdown: stop every running bash job and remove the output files still kept."""
        self.jobs.stop_all()
        self.jobs.remove_outputs()


def temp_dir(ctx: ToolContext) -> str:
    """Where bash output files go: output_dir, else the system temp directory."""
    return str(ctx.output_dir) if ctx.output_dir is not None else tempfile.gettempdir()
