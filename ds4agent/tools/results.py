"""What a tool call gives back: the observation, the error it may raise, and the display payloads.

    Observation(text, ok=True, display=None)   the observation text for the model + a payload for UIs
    ToolError(message)                        a readable failure; becomes "Tool error: MESSAGE\\n"
    error_text(message), error_result(message) the text and the result of a failed call

Display payloads (plain frozen dataclasses, no UI types): BashDisplay, DiffDisplay/DiffLine,
TextDisplay. The UI reads them defensively (ui/toolview.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# One result is capped at 128 KiB (agent-reference.md §5); unlike the baseline we say so in the text.
RESULT_CAP_BYTES = 128 * 1024
ERROR_PREFIX = "Tool error: "


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
class Observation:
    """What one tool call gives the model (the reference agent's word for it, agent-reference.md §5).
    `text` goes to the model verbatim; `display` is for UIs only (the agent passes both on in its
    ToolResult event)."""

    text: str
    ok: bool = True
    display: object | None = None
    # bash: the paths the OS sandbox refused (tools/sandbox.py Refusal), for the permission layer
    sandbox_refusals: tuple = ()


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


def error_result(message: str) -> Observation:
    first = message.split("\n", 1)[0]
    return Observation(error_text(message), ok=False, display=TextDisplay(summary=first, body=message))
