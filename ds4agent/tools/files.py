"""read, more, write, edit: file access with the seen-lines guard (agent-reference.md §5.4-5.7).

Lines split on LF, CRLF or a lone CR; every line keeps its own terminator in the file bytes, so an
edit never changes the endings of lines it did not touch. An edit replaces the span `old` selects:
text found exactly once, or HEAD[upto]TAIL (select_old). The guard: that span must lie in lines
shown to the model (by read, search, write or an edit's context block) whose CRC32 still matches
the file, so the model never overwrites lines it has not seen or that moved.

Writes are atomic (temp file in the same directory, fsync, rename, directory fsync) and keep the
file's permission bits; a symlink is written through (its target changes, the link stays). The
path is resolved once, when the change is planned (and judged by the permission policy); the write
walks that real path without following links and replaces the file only if it is still in the
state the change was planned on (tools/beneath.py), so a link or an edit slipped in between the
question and the write is refused, never written through.

Differences from the baseline, on purpose:
* `write` creates missing parent directories.
* Files containing NUL bytes are refused by read/edit with a hint to use bash (the baseline shows
  them as text, which wastes context on garbage and cannot be edited safely anyway).
* The LFs of `new` become the ending of the lines they replace (CRLF or a lone CR; the file's
  most common ending where those lines have none), and an `old` text written with LF matches the
  file's form, never half of a CRLF pair: the model only ever sees the decorated lines without
  terminators, so it cannot type the CRs itself.
* A failed match shows the closest candidate lines (numbered; they count as shown, so the model
  can copy them into old at once) and the number of occurrences; that search does bounded work on
  any input and stops on interrupt.
* No line-number edits: the model names the text it replaces (and, for a long span, only its
  first and last lines), which survives the line shifts of earlier edits.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ds4agent.tools.args import arg_bool, arg_int, arg_str
from ds4agent.tools.beneath import FileState, open_file, replace_file, state_at
from ds4agent.tools.context import ReadCursor, ToolContext
from ds4agent.tools.oldtext import select_old, upto_ready
from ds4agent.tools.regular import read_bounded
from ds4agent.tools.results import (
    RESULT_CAP_BYTES,
    DiffDisplay,
    DiffLine,
    Observation,
    TextDisplay,
    ToolError,
    error_text,
)
from ds4agent.tools.textlines import (
    line_at,
    line_starts,
    line_text,
    numbered,
    numbered_clipped,
    region_eol,
    split_lines,
    strip_eol,
    to_eol,
)

MAX_FILE_BYTES = 16 * 1024 * 1024
# A write over a larger file keeps no copy of it for /rewind (a sparse file may claim terabytes).
UNDO_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_CHUNK = 500
MAX_CHUNK = 100_000
CONTEXT_BEFORE = 5
CONTEXT_AFTER = 8
REGION_FULL = 36
REGION_HALF = 18
# Room for a read's body inside the 128 KiB result cap (the header and a marker take the rest).
READ_BUDGET = RESULT_CAP_BYTES - 2048


# --------------------------------------------------------------------------------------------------
# Lines


def load_file(ctx: ToolContext, path: str) -> tuple[str, bytes]:
    """(guard key, bytes) of an existing regular text file within the size limit; ToolError otherwise."""
    key, data, _ = load_file_state(ctx, path)
    return key, data


def load_file_state(ctx: ToolContext, path: str) -> tuple[str, bytes, FileState]:
    """load_file plus the state the file had when it was read (a change planned on these bytes is
    written only over that state). The file is opened beneath its real path (tools/beneath.py);
    a FIFO or a device is refused before it is opened: reading one would block or never end."""
    key = ctx.abs_key(path)
    try:
        f, st = open_file(key, path)
    except OSError as exc:
        raise ToolError(f"cannot open {path}: {exc.strerror}") from None
    with f:
        if st.st_size > MAX_FILE_BYTES:
            raise ToolError(f"file too large: {path} exceeds {MAX_FILE_BYTES} bytes")
        try:
            data = read_bounded(f, MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"file too large: {path} exceeds {MAX_FILE_BYTES} bytes")
    if b"\0" in data:
        raise ToolError(f"binary file: {path} contains NUL bytes; inspect it with bash (for example xxd or file)")
    return key, data, FileState.of(st)


# --------------------------------------------------------------------------------------------------
# Diffs for UIs


def make_diff(path: str, before: bytes | None, after: bytes) -> DiffDisplay:
    old = [line_text(x) for x in split_lines(before or b"")]
    new = [line_text(x) for x in split_lines(after)]
    text_lines = list(
        difflib.unified_diff(old, new, fromfile=f"a/{path}" if before is not None else "/dev/null",
                             tofile=f"b/{path}", lineterm="", n=3)
    )
    out: list[DiffLine] = []
    added = removed = 0
    o = n = 0
    hunk = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
    for line in text_lines[2:]:
        m = hunk.match(line)
        if m:
            o, n = int(m.group(1)), int(m.group(2))
            # difflib gives start 0 for an empty side; the next line is then number 1.
            o, n = max(o, 1), max(n, 1)
            out.append(DiffLine("hunk", None, None, line))
        elif line.startswith("-"):
            out.append(DiffLine("remove", o, None, line[1:]))
            o += 1
            removed += 1
        elif line.startswith("+"):
            out.append(DiffLine("add", None, n, line[1:]))
            n += 1
            added += 1
        else:
            out.append(DiffLine("context", o, n, line[1:]))
            o += 1
            n += 1
    unified = "\n".join(text_lines) + ("\n" if text_lines else "")
    return DiffDisplay(path=path, created=before is None, unified=unified, lines=tuple(out),
                       added=added, removed=removed)


def make_replacement_preview(path: str, unshown: str, after: bytes) -> DiffDisplay:
    """A write over a file whose content cannot be shown: no diff, the new content as added lines
    under a note that says why the old side is missing (it is not an empty file)."""
    added = [line_text(x) for x in split_lines(after)]
    note = f"@@ {unshown}; replaced by {len(after)} bytes, {len(added)} lines @@"
    lines = (DiffLine("hunk", None, None, note),
             *(DiffLine("add", None, n, t) for n, t in enumerate(added, 1)))
    unified = f"--- a/{path}\n+++ b/{path}\n{note}\n" + "".join(f"+{t}\n" for t in added)
    return DiffDisplay(path=path, created=False, unified=unified, lines=lines, added=len(added), removed=0)


# --------------------------------------------------------------------------------------------------
# read / more


def _fit(lines: list[bytes], a: int, b: int, raw: bool) -> int:
    """The last line (<= b) whose output still fits the result budget (at least line a).

    The tool cuts at a line boundary itself instead of leaving it to the 128 KiB result cap: the
    header then gives a correct continue offset, and no line is recorded for the guard that the
    model did not see in full.
    """
    used = 0
    for n in range(a, b + 1):
        size = len(lines[n - 1]) + (0 if raw else len(str(n)) + 2)
        used += size
        if used > READ_BUDGET and n > a:
            return n - 1
    return b


def _read_chunk(ctx: ToolContext, path: str, key: str, lines: list[bytes], start: int, count: int | None,
                raw: bool) -> Observation:
    """One chunk of a file already loaded (load_file) and split, so `more` reads the file once."""
    total = len(lines)
    if total == 0:
        a = b = 0
    else:
        if start > total:
            raise ToolError(f"start_line {start} is past the end of {path} ({total} lines)")
        a = start
        b = _fit(lines, a, total if count is None else min(total, start + count - 1), raw)
    more_left = b < total
    m = count if count is not None else DEFAULT_CHUNK
    ctx.last_read = ReadCursor(path=path, abs_path=key, next_line=b + 1 if total else 1, raw=raw)
    summary = f"{path}: lines {a}-{b} of {total}"
    # One line longer than the whole budget is shown clipped (and is not editable by line).
    oversized = total > 0 and len(lines[a - 1]) > READ_BUDGET
    if raw:
        data = b"".join(lines[a - 1 : b]) if total else b""
        if oversized:
            data = data[:READ_BUDGET] + f"[... line {a} clipped: {len(data)} bytes ...]".encode()
        text = data.decode("utf-8", errors="replace")
        if not text.endswith("\n"):
            text += "\n"
        if more_left:
            text += (
                f"[Read truncated at line {b} of {total}. continue_offset={b + 1}. "
                f"Call the more tool with count={m} to read the next chunk.]\n"
            )
        return Observation(text, display=TextDisplay(summary=f"Read {summary} (raw)", body=text))
    header = summary
    if more_left:
        header += f"; continue_offset={b + 1}; call the more tool with count={m} to read the next chunk"
    if oversized:
        clipped = strip_eol(lines[a - 1])[:READ_BUDGET].decode("utf-8", errors="replace")
        body = f"{a} {clipped}[... line {a} clipped: {len(lines[a - 1])} bytes ...]\n"
    else:
        body = numbered(lines, a, b) if total else ""
        if a == 1 and b == total:
            # A whole-file view replaces the record (a stale record of removed lines must not survive).
            ctx.seen.replace(key, ((n, lines[n - 1]) for n in range(1, total + 1)))
        elif total:
            ctx.seen.record(key, ((n, lines[n - 1]) for n in range(a, b + 1)))
    text = header + "\n" + body
    return Observation(text, display=TextDisplay(summary=f"Read {summary}", body=body))


class ReadTool:
    name = "read"
    description = (
        "Read a text file as numbered lines, 500 lines at a time by default; the header says where "
        "to continue. Lines you read can then be edited by line number. whole=true reads to the end "
        "(use only when needed: it may not fit); raw=true returns the exact text without numbers."
    )
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "start_line": {"type": "integer", "description": "first line, 1-based (default 1)"},
            "max_lines": {"type": "integer", "description": "lines to return (default 500)"},
            "whole": {"type": "boolean", "description": "read to the end of the file"},
            "raw": {"type": "boolean", "description": "exact text, no line numbers"},
        },
        "required": ["path"],
    }
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        path = arg_str(args, "path", required=True)
        start = arg_int(args, "start_line", 1, 1)
        count = arg_int(args, "max_lines", DEFAULT_CHUNK, 1, MAX_CHUNK)
        whole = arg_bool(args, "whole", False)
        raw = arg_bool(args, "raw", False)
        key, data = load_file(ctx, path)
        return _read_chunk(ctx, path, key, split_lines(data), start, None if whole else count, raw)


class MoreTool:
    name = "more"
    description = "Continue the last read with the next chunk of lines of the same file (same mode)."
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer", "description": "lines to return (default 500)"}},
        "required": [],
    }
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        cur = ctx.last_read
        if cur is None:
            raise ToolError("no previous output to continue")
        count = arg_int(args, "count", DEFAULT_CHUNK, 1, MAX_CHUNK)
        key, data = load_file(ctx, cur.path)
        lines = split_lines(data)
        if cur.next_line > len(lines):
            raise ToolError(f"end of file: {cur.path} has {len(lines)} lines; nothing more to read")
        return _read_chunk(ctx, cur.path, key, lines, cur.next_line, count, cur.raw)


# --------------------------------------------------------------------------------------------------
# write


@dataclass
class Change:
    """A planned file change: what the permission question previews and what run() applies."""

    path: str  # as the model wrote it
    key: str  # absolute, resolved
    before: bytes | None  # None: the file does not exist yet
    after: bytes
    result_text: str = ""
    record: list[tuple[int, bytes]] | None = None  # lines the guard learns (None: whole file)
    keep_below: int = 0  # guard: lines < keep_below keep their records
    # guard: lines after this old line keep their records (set only when the edit kept the line
    # count, so those lines did not move)
    keep_after: int | None = None
    # The file exists but its content is not shown (why, in words): the preview has no diff.
    before_unshown: str | None = None
    # What stood at the real path when the change was planned (None: no file): the write is
    # refused when the file is not in this state any more at the moment of the rename.
    state: FileState | None = None

    @property
    def creates(self) -> bool:
        return self.before is None and self.before_unshown is None

    def diff(self) -> DiffDisplay:
        if self.before_unshown is not None:
            return make_replacement_preview(self.path, self.before_unshown, self.after)
        return make_diff(self.path, self.before, self.after)


def _current_content(key: str, path: str) -> tuple[bytes | None, str | None, FileState | None]:
    """What a write will replace, for its diff, and the state it was found in: (bytes, None) for a
    text file within the read/edit limits; (None, None) when there is no file yet; (None, why) when
    the file exists but cannot be shown (too large, binary, unreadable): the write still may
    replace it, the preview just has no diff. A directory, FIFO or device is refused: write
    replaces regular files only, and reading one to preview it would block or never end."""
    try:
        state = state_at(key, path)
    except OSError as exc:
        return None, f"cannot look at the current file: {exc.strerror}", None
    if state is None:
        return None, None, None
    too_large = f"the current file ({{size}} bytes) is over the {MAX_FILE_BYTES} byte limit of read/edit and is not shown"
    try:
        f, st = open_file(key, path, list_hint=False)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, f"cannot read the current file: {exc.strerror}", state
    with f:
        state = FileState.of(st)
        if st.st_size > MAX_FILE_BYTES:
            return None, too_large.format(size=st.st_size), state
        try:
            data = read_bounded(f, MAX_FILE_BYTES + 1)
        except OSError as exc:
            return None, f"cannot read the current file: {exc.strerror}", state
    if len(data) > MAX_FILE_BYTES:  # it grew since the stat
        return None, too_large.format(size=len(data)), state
    if b"\0" in data:
        return None, f"the current file ({len(data)} bytes) is binary and is not shown", state
    return data, None, state


def plan_write(args: Mapping[str, Any], ctx: ToolContext) -> Change:
    path = arg_str(args, "path", required=True)
    content = arg_str(args, "content", required=True)
    if not path.strip():
        raise ToolError("empty path")
    key = ctx.abs_key(path)
    before, unshown, state = _current_content(key, path)
    after = content.encode("utf-8")
    return Change(path=path, key=key, before=before, after=after, before_unshown=unshown, state=state,
                  result_text=f"Wrote {len(after)} bytes to {path}\n")


def _content_before(change: Change) -> tuple[bytes | None, bool]:
    """What the file holds before the write, for the undo log (on_write), and whether a copy
    is kept at all. The preview may have left it unread (too large, binary: before is None then,
    as for a new file), but undoing the write must put those bytes back, not delete the file: read
    them here, whole, up to UNDO_MAX_BYTES. A larger file (a sparse file may claim terabytes) is
    not copied: the write goes ahead without an undo copy and its result says so."""
    if change.before is not None or change.before_unshown is None:
        return change.before, True
    if change.state is not None and change.state.size > UNDO_MAX_BYTES:
        return None, False
    try:
        f, st = open_file(change.key, change.path)
        with f:
            if FileState.of(st) != change.state:
                raise ToolError("it changed since the change was planned")
            data = read_bounded(f, UNDO_MAX_BYTES + 1)
    except (OSError, ToolError) as exc:
        # Without the old bytes a /rewind could not undo the write (it would remove the file):
        # refused before anything is changed.
        why = exc.message if isinstance(exc, ToolError) else exc.strerror or exc
        raise ToolError(f"cannot keep a copy of {change.path} for /rewind: {why}") from None
    if len(data) > UNDO_MAX_BYTES:  # grew since the stat; the state check at the write refuses it
        return None, False
    return data, True


def _apply(change: Change, ctx: ToolContext) -> Observation:
    """Write the change, then tell what happened to the file. Only a failed write is a failure:
    once the file is replaced, trouble with the bookkeeping after it (the guard's records, the
    diff for the UI: both scale with the file and can run out of memory) must not make the model
    believe the file is unchanged. The write goes to the real path the change was planned on,
    beneath (no link followed), and only over the state the change was planned against."""
    undo, kept = _content_before(change) if ctx.on_write is not None else (change.before, True)
    try:
        replace_file(change.key, change.after, change.path, make_parents=True, expect=change.state)
    except OSError as exc:
        raise ToolError(f"cannot write {change.path}: {exc.strerror or exc}") from None
    key = change.key
    if ctx.on_write is not None and kept:
        try:
            ctx.on_write(key, undo, change.after)
        except Exception:  # see the docstring; the agent reports its own failures
            pass
    if not kept:
        size = change.state.size if change.state is not None else 0
        change.result_text += (f"Note: the old {change.path} ({size} bytes) is over the "
                               f"{UNDO_MAX_BYTES >> 20} MiB limit of the undo log: no copy was "
                               "kept, /rewind cannot restore it.\n")
    try:
        _record(change, ctx, key)
    except Exception:  # see the docstring
        ctx.seen.replace(key, ())  # unknown state: line edits must read the file again
    try:
        display: object = change.diff()
    except Exception as exc:  # see the docstring
        first = change.result_text.split("\n", 1)[0]
        display = TextDisplay(summary=f"{first} (no diff: {type(exc).__name__})", body=change.result_text)
    return Observation(change.result_text, display=display)


# --------------------------------------------------------------------------------------------------
# Approvals: what the permission question showed is what gets written


@dataclass(frozen=True)
class Approval:
    """What the permission policy judged for one write/edit call: the real path (inside the tree
    or not) and, when it asked, the change the question showed. planned_ok False: planning failed
    at the check (nothing to approve), so a run that now succeeds was never asked about."""

    tool: str
    args: str  # the call's arguments, canonical JSON
    key: str
    change: Change | None = None
    planned_ok: bool = True


def _args_text(args: Mapping[str, Any]) -> str:
    return json.dumps(dict(args), sort_keys=True, default=str)


def approve(ctx: ToolContext, tool: str, args: Mapping[str, Any], key: str, change: Change | None = None,
            *, planned_ok: bool = True) -> None:
    """The permission policy's record of what it allowed (or asked about) for the next call."""
    ctx.approved = Approval(tool, _args_text(args), key, change, planned_ok)


def _take_approval(ctx: ToolContext, tool: str, args: Mapping[str, Any]) -> Approval | None:
    approval, ctx.approved = ctx.approved, None
    if isinstance(approval, Approval) and approval.tool == tool and approval.args == _args_text(args):
        return approval
    return None


def _planned(tool: str, args: Mapping[str, Any], ctx: ToolContext) -> Change:
    """Plan the call again at the moment it runs and hold it to what was approved: the same real
    path, and the same file content and state as the question's diff. Anything else is refused,
    with nothing written."""
    approval = _take_approval(ctx, tool, args)
    change = plan_write(args, ctx) if tool == "write" else plan_edit(args, ctx)
    if approval is None:
        return change
    if not approval.planned_ok:
        raise ToolError(f"{change.path} changed since the permission check (the call could not be "
                        "planned then); nothing was written. Call the tool again")
    if change.key != approval.key:
        raise ToolError(f"{change.path} now leads to {change.key}, not to {approval.key} as when the "
                        "permission was checked (a directory or link on the way was replaced); "
                        "nothing was written")
    shown = approval.change
    if shown is not None and (shown.state != change.state or shown.before != change.before
                              or shown.after != change.after):
        raise ToolError(f"{change.path} changed since the diff was shown to the user; nothing was "
                        "written. Read the file again and redo the change")
    return change


def _record(change: Change, ctx: ToolContext, key: str) -> None:
    """Teach the guard the lines the result showed (the whole file for a write)."""
    new_lines = split_lines(change.after)
    if change.record is None:
        ctx.seen.replace(key, ((n, new_lines[n - 1]) for n in range(1, len(new_lines) + 1)))
        return
    old = ctx.seen.get(key) or {}
    after = change.keep_after
    kept = {n: c for n, c in old.items() if n < change.keep_below or (after is not None and n > after)}
    ctx.seen.replace(key, ())
    ctx.seen.lines(key).update(kept)
    ctx.seen.record(key, change.record)


class WriteTool:
    name = "write"
    description = (
        "Create or overwrite a file with the given content (parent directories are created). "
        "Prefer edit for changes to existing files."
    )
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }
    mutates = True

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        return _apply(_planned("write", args, ctx), ctx)


# --------------------------------------------------------------------------------------------------
# edit




def _context_block(path: str, lines: list[bytes], start: int, count: int) -> tuple[str, list[tuple[int, bytes]]]:
    """`Current file around edit:` + numbered lines around the region [start, start+count)."""
    total = len(lines)
    x = max(1, start - CONTEXT_BEFORE)
    y = min(total, start + count - 1 + CONTEXT_AFTER)
    if total == 0 or x > y:
        return f"Current file around edit: {path} lines 0-0 of {total}\n", []
    if count > REGION_FULL:
        first_end = start + REGION_HALF - 1
        last_start = start + count - REGION_HALF
        head, seen1 = numbered_clipped(lines, list(range(x, first_end + 1)))
        tail, seen2 = numbered_clipped(lines, list(range(last_start, y + 1)))
        body = head + f"... {count - 2 * REGION_HALF} edited lines omitted ...\n" + tail
        seen = seen1 + seen2
    else:
        body, seen = numbered_clipped(lines, list(range(x, y + 1)))
    return f"Current file around edit: {path} lines {x}-{y} of {total}\n" + body, seen


def _shift_note(b: int, d: int) -> str:
    if d == 0:
        return ""
    return (
        f"Line shift: old lines after {b} moved by {d:+d} (old line {b + 1} is now line {b + 1 + d}). "
        "Lines shown below count as read; read again before editing other shifted lines.\n"
    )


def check_old(ctx: ToolContext, path: str, old: str) -> str | None:
    """None when `old` selects a span of the file at `path` (select_old), else the result text
    the edit would give; the lines it shows are recorded as seen, as the tool's own failure would.
    The agent asks this as soon as old is complete, before the model writes `new`."""
    try:
        key, data = load_file(ctx, path)
        select_old(ctx, path, key, data, old)
    except ToolError as err:
        for k, n, raw in err.shown:
            ctx.seen.record(k, [(n, raw)])
        return error_text(err.message)
    return None


def upto_ready_at(ctx: ToolContext, path: str) -> Callable[[str], bool] | None:
    """upto_ready over the file at `path` as it is now, read once; None when the file cannot be
    read, the model has read none of it (nothing is done with a file the model has not seen), or
    [upto] is off (--edit-upto not given)."""
    if not ctx.edit_upto:
        return None
    try:
        key = ctx.abs_key(path)
        if not ctx.seen.get(key):
            return None
        _, data = load_file(ctx, path)
    except ToolError:
        return None
    return lambda prefix: upto_ready(data, prefix)


def _plan_replace(ctx: ToolContext, path: str, key: str, data: bytes, old_s: str, new_s: str) -> Change:
    lines = split_lines(data)
    off, end = select_old(ctx, path, key, data, old_s)
    starts = line_starts(lines)
    a = line_at(starts, off)
    b = line_at(starts, end - 1)
    new_b = to_eol(new_s.encode("utf-8"), region_eol(lines, a, b))
    after = data[:off] + new_b + data[end:]
    new_lines = split_lines(after)
    d = len(new_lines) - len(lines)
    k = max(0, (b - a + 1) + d)
    ctx_text, ctx_lines = _context_block(path, new_lines, a, k)
    text = (
        f"Edited {path}\n"
        f"Touched old lines {a}-{b}; current post-edit context follows.\n"
        + _shift_note(b, d)
        + ctx_text
    )
    region = [(n, new_lines[n - 1]) for n in range(a, min(len(new_lines), a + k - 1) + 1)]
    return Change(path=path, key=key, before=data, after=after, result_text=text,
                  record=region + ctx_lines, keep_below=a, keep_after=b if d == 0 else None)


def plan_edit(args: Mapping[str, Any], ctx: ToolContext) -> Change:
    """Validate an edit call and compute the new file bytes and result text; writes nothing."""
    path = arg_str(args, "path", required=True)
    key, data, state = load_file_state(ctx, path)  # no such file, a FIFO, ...: said first
    old = arg_str(args, "old")
    new = arg_str(args, "new")
    if old is None or new is None:
        raise ToolError('edit requires path, old and new (new="" deletes the old text)')
    change = _plan_replace(ctx, path, key, data, old, new)
    change.state = state
    return change


_EDIT_EXACT = (
    "Replace text in an existing file you have read: old is the exact text to replace (it must "
    "occur once), new the replacement (\"\" deletes). The result shows the edited region with "
    "current line numbers."
)
_EDIT_UPTO = (
    "Replace text in an existing file you have read: old is the exact text to replace (it must "
    "occur once), new the replacement (\"\" deletes). For a long span write old as "
    "HEAD[upto]TAIL: the first lines, [upto], then the last lines; the span runs from HEAD to "
    "the end of TAIL. The result shows the edited region with current line numbers."
)


class EditTool:
    """edit: exact old -> new; with upto=True (--edit-upto) old may also be HEAD[upto]TAIL. The
    description and schema say which, so the system prompt's bytes (and its KV cache key) differ
    between the two; the ToolContext's edit_upto decides what select_old accepts."""

    name = "edit"
    mutates = True

    def __init__(self, upto: bool = False) -> None:
        self.description = _EDIT_UPTO if upto else _EDIT_EXACT
        old_doc = "exact text to replace (once in the file)" + (", or HEAD[upto]TAIL" if upto else "")
        self.schema = {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string", "description": old_doc},
                "new": {"type": "string", "description": "replacement text"},
            },
            "required": ["path", "old", "new"],
        }

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
        return _apply(_planned("edit", args, ctx), ctx)


def plan_change(tool_name: str, args: Mapping[str, Any], ctx: ToolContext) -> Change:
    """The change a write/edit call would make (for permission previews); ToolError if it would fail."""
    if tool_name == "write":
        return plan_write(args, ctx)
    if tool_name == "edit":
        return plan_edit(args, ctx)
    raise ToolError(f"{tool_name} does not change files")
