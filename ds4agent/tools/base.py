"""What every tool shares: results, errors, the context a tool runs in, argument coercion, the registry.

Public API (used by the agent loop and the permission policy):

    ToolResult(text, ok=True, display=None)   the observation text for the model + a payload for UIs
    ToolError(message)                        a readable failure; becomes "Tool error: MESSAGE\\n"
    Tool                                      protocol: name, description, schema, run(args, ctx)
    ToolContext(cwd, should_stop, output_dir) per-agent state: bash jobs, seen lines, the `more` cursor
    default_tools() -> list[Tool]             the fixed, stable registry order (the system prompt's bytes;
                                              ds4agent.protocol.template.tool_schema_line renders each line)
    run_tool(name, args, ctx, tools=None)     never raises: every failure becomes a "Tool error: ..." result

Display payloads (plain frozen dataclasses, no UI types): BashDisplay, DiffDisplay, TextDisplay.

Argument values arrive from the DSML parser either as raw strings (string="true") or as already
decoded JSON values (string="false"), so every coercion helper accepts both forms. Integers parse
strictly and are clamped; an unparseable optional value falls back to its default, as the reference
agent does (agent-reference.md §5), so a sloppy `max_lines="50 lines"` still reads something.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ds4agent.tools.bash import JobTable

# One result is capped at 128 KiB (agent-reference.md §5); unlike the baseline we say so in the text.
RESULT_CAP_BYTES = 128 * 1024
ERROR_PREFIX = "Tool error: "


# --------------------------------------------------------------------------------------------------
# Results and errors


@dataclass(frozen=True)
class BashDisplay:
    """What a UI shows for bash/bash_status/bash_stop.

    `output` is the slice of output the observation selected; `output_kind` says which slice:
    "none" (no output yet), "full" (everything), "head" (the first lines) or "tail" (the last lines).
    `exit_status` is None while the job runs; `duration` is the elapsed time in seconds.
    """

    command: str
    job: int
    pid: int
    running: bool
    exit_status: int | None
    timed_out: bool
    output: str
    output_kind: str
    output_path: str
    total_bytes: int
    total_lines: int
    duration: float


@dataclass(frozen=True)
class DiffLine:
    """One line of a rendered diff. kind: "context" | "add" | "remove" | "hunk".

    Line numbers are 1-based; `old_no` is None for added lines, `new_no` None for removed ones,
    both None for hunk headers.
    """

    kind: str
    old_no: int | None
    new_no: int | None
    text: str


@dataclass(frozen=True)
class DiffDisplay:
    """What a UI shows for write/edit: the unified diff (difflib text) and the same lines numbered."""

    path: str
    created: bool
    unified: str
    lines: tuple[DiffLine, ...]
    added: int
    removed: int


@dataclass(frozen=True)
class TextDisplay:
    """read/more/search/list (and errors): a one-line summary plus the body the model got."""

    summary: str
    body: str


@dataclass
class ToolResult:
    """One observation. `text` goes to the model verbatim; `display` is for UIs only."""

    text: str
    ok: bool = True
    display: object | None = None


class ToolError(Exception):
    """A failure the model should read: the loop shows it as "Tool error: MESSAGE"."""

    def __init__(self, message: str, *, shown: Iterable[tuple[str, int, bytes]] = ()) -> None:
        super().__init__(message)
        self.message = message
        # (abs path, line number, line bytes) the error text showed with numbers: recorded in the
        # seen-lines guard like a read would, so the model can edit a candidate line directly.
        self.shown = tuple(shown)


def error_text(message: str) -> str:
    """The text of a failed tool call. Tool observations end with "\\n" (agent-reference.md §5)."""
    text = ERROR_PREFIX + message
    return text if text.endswith("\n") else text + "\n"


def error_result(message: str) -> ToolResult:
    first = message.split("\n", 1)[0]
    return ToolResult(error_text(message), ok=False, display=TextDisplay(summary=first, body=message))


# --------------------------------------------------------------------------------------------------
# Seen-lines guard memory


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


# --------------------------------------------------------------------------------------------------
# Context


def _never() -> bool:
    return False


@dataclass
class ToolContext:
    """Everything a tool may touch besides its arguments; one per agent, reused across turns.

    should_stop: polled by waiting tools (bash) every 100 ms; True ends the wait early.
    output_dir:  where bash output files go (default: the system temp directory); a file named to
                 the model is kept until close() (see tools/bash.py), so it can read the rest.
    """

    cwd: Path
    should_stop: Callable[[], bool] = _never
    output_dir: Path | None = None
    seen: SeenLines = field(default_factory=SeenLines)
    last_read: ReadCursor | None = None
    jobs: JobTable = field(default=None)  # type: ignore[assignment]  # filled in __post_init__
    # Told of every file write/edit after it succeeded: (absolute path, content before or None
    # when the file did not exist, content written). The agent's code checkpoints listen here.
    on_write: Callable[[str, bytes | None, bytes], None] | None = None

    def __post_init__(self) -> None:
        self.cwd = Path(self.cwd)
        if self.jobs is None:
            from ds4agent.tools.bash import JobTable

            self.jobs = JobTable()

    def resolve(self, path: str) -> Path:
        """The absolute path of a model-supplied path (relative ones are relative to cwd)."""
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else self.cwd / p

    def abs_key(self, path: str | Path) -> str:
        """The guard key of a path: absolute, symlinks resolved, so ./a and a are the same file."""
        return os.path.realpath(self.resolve(str(path)))

    def reset_session(self) -> None:
        """On /new and /switch: forget seen lines (bash jobs and the `more` cursor survive)."""
        self.seen.clear()

    def close(self) -> None:
        """Agent shutdown: stop every running bash job and remove the output files still kept."""
        self.jobs.stop_all()
        self.jobs.remove_outputs()


# --------------------------------------------------------------------------------------------------
# Tool protocol and registry


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    schema: dict  # JSON Schema of the parameters, keys in the order they are rendered
    mutates: bool  # writes files or runs commands (the permission policy asks about these)

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult: ...


def default_tools() -> list[Tool]:
    """The registry, in the fixed order that the system prompt's tools block renders (byte-stable)."""
    from ds4agent.tools.bash import BashStatusTool, BashStopTool, BashTool
    from ds4agent.tools.files import EditTool, MoreTool, ReadTool, WriteTool
    from ds4agent.tools.listing import ListTool
    from ds4agent.tools.search import SearchTool

    return [
        BashTool(),
        BashStatusTool(),
        BashStopTool(),
        ReadTool(),
        MoreTool(),
        WriteTool(),
        EditTool(),
        SearchTool(),
        ListTool(),
    ]


def _cap(text: str) -> str:
    """Cut a result over 128 KiB at a UTF-8 boundary and say so (the baseline cut silently)."""
    data = text.encode("utf-8")
    if len(data) <= RESULT_CAP_BYTES:
        return text
    marker = f"\n[tool result truncated: {len(data)} bytes, showing the first {{kept}}]\n"
    budget = RESULT_CAP_BYTES - len(marker.format(kept=RESULT_CAP_BYTES))
    kept = data[:budget].decode("utf-8", errors="ignore")
    return kept + marker.format(kept=len(kept.encode("utf-8")))


def run_tool(
    name: str, args: Mapping[str, Any], ctx: ToolContext, tools: Iterable[Tool] | None = None
) -> ToolResult:
    """Run one call. Never raises for the model's mistakes or the file system's refusals.

    Unknown tool -> `Tool error: unknown tool: NAME` without a trailing newline: it is one of the
    texts the loop produces itself (prompt-and-dsml.md §9). Everything else that fails becomes
    `Tool error: MESSAGE\\n` like the baseline observations.
    """
    registry = {t.name: t for t in (tools if tools is not None else default_tools())}
    tool = registry.get(name)
    if tool is None:
        text = f"{ERROR_PREFIX}unknown tool: {name}"
        return ToolResult(text, ok=False, display=TextDisplay(summary=f"unknown tool: {name}", body=""))
    try:
        result = tool.run(dict(args), ctx)
    except ToolError as exc:
        for path, lineno, raw in exc.shown:
            ctx.seen.record(path, [(lineno, raw)])
        result = error_result(exc.message)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        result = error_result(f"{exc.strerror or exc}{where}")
    except Exception as exc:  # noqa: BLE001 - the contract: nothing escapes into the agent loop
        # A bug or an absurd input must not take the agent down; the model sees a readable line.
        result = error_result(f"{name} failed: {type(exc).__name__}: {exc}")
    result.text = _cap(result.text)
    return result


# --------------------------------------------------------------------------------------------------
# Argument coercion (values are raw strings or decoded JSON values)


_MISSING = object()


def _first(args: Mapping[str, Any], name: str) -> Any:
    return args.get(name, _MISSING)


def arg_str(args: Mapping[str, Any], name: str, *, required: bool = False, default: str | None = None) -> str | None:
    value = _first(args, name)
    if value is _MISSING or value is None:
        if required:
            raise ToolError(f"missing required parameter: {name}")
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    # Arrays/objects given where text was expected: their JSON text is the most faithful string.
    return json.dumps(value, ensure_ascii=False)


def parse_int(value: Any) -> int | None:
    """Strict integer parse: an int, an integral float, or a decimal string (surrounding blanks ok)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        s = value.strip()
        body = s[1:] if s[:1] in "+-" else s
        if body.isascii() and body.isdigit():
            return int(s)
    return None


def parse_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        f = float(value)
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def arg_int(args: Mapping[str, Any], name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    """Integer argument: missing or unparseable -> default; parsed values are clamped to lo..hi."""
    value = _first(args, name)
    parsed = None if value is _MISSING else parse_int(value)
    if parsed is None:
        return default
    if lo is not None:
        parsed = max(lo, parsed)
    if hi is not None:
        parsed = min(hi, parsed)
    return parsed


def arg_float(args: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = _first(args, name)
    parsed = None if value is _MISSING else parse_float(value)
    if parsed is None:
        return default
    return min(hi, max(lo, parsed))


_TRUE = {"true", "yes", "1"}
_FALSE = {"false", "no", "0"}


def arg_bool(args: Mapping[str, Any], name: str, default: bool) -> bool:
    """true/yes/1 and false/no/0 (any case); anything else -> default."""
    value = _first(args, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    return default


def temp_dir(ctx: ToolContext) -> str:
    return str(ctx.output_dir) if ctx.output_dir is not None else tempfile.gettempdir()
