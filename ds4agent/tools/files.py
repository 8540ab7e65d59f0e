"""read, more, write, edit: file access with the seen-lines guard (agent-reference.md §5.4-5.7).

Lines split on LF, CRLF or a lone CR; every line keeps its own terminator in the file bytes, so an
edit never changes the endings of lines it did not touch. The guard: a line/range edit is allowed
only on lines shown to the model (by read, search, write or an edit's context block) whose CRC32
still matches the file, so the model never overwrites lines it has not seen or that moved.

Writes are atomic (temp file in the same directory, fsync, rename, directory fsync) and keep the
file's permission bits; a symlink is written through (its target changes, the link stays).

Differences from the baseline, on purpose:
* `write` creates missing parent directories.
* Files containing NUL bytes are refused by read/edit with a hint to use bash (the baseline shows
  them as text, which wastes context on garbage and cannot be edited safely anyway).
* In a file whose replaced lines all end with CRLF, the LFs of `new` become CRLF, and an `old`
  text written with LF also matches the CRLF form: the model only ever sees the decorated lines
  without terminators, so it cannot type the CRs itself.
* A failed unique-match edit shows the closest candidate lines (numbered; they count as shown, so
  the model can edit them by line at once) and the number of occurrences.
"""

from __future__ import annotations

import bisect
import difflib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ds4agent import fsutil
from ds4agent.tools.args import arg_bool, arg_int, arg_str
from ds4agent.tools.context import ReadCursor, ToolContext
from ds4agent.tools.regular import open_regular, refuse_unless_regular
from ds4agent.tools.results import RESULT_CAP_BYTES, DiffDisplay, DiffLine, TextDisplay, ToolError, ToolResult

MAX_FILE_BYTES = 16 * 1024 * 1024
DEFAULT_CHUNK = 500
MAX_CHUNK = 100_000
CONTEXT_BEFORE = 5
CONTEXT_AFTER = 8
REGION_FULL = 36
REGION_HALF = 18
# Room for a read's body inside the 128 KiB result cap (the header and a marker take the rest).
READ_BUDGET = RESULT_CAP_BYTES - 2048
# Lines in edit context and error candidates are clipped beyond this many characters.
CLIP_CHARS = 2000

_EOL = re.compile(rb"\r\n|\r|\n")


# --------------------------------------------------------------------------------------------------
# Lines


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their own terminators (LF, CRLF or lone CR); a last line may have none."""
    lines: list[bytes] = []
    pos = 0
    for m in _EOL.finditer(data):
        lines.append(data[pos : m.end()])
        pos = m.end()
    if pos < len(data):
        lines.append(data[pos:])
    return lines


def strip_eol(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    if line.endswith((b"\n", b"\r")):
        return line[:-1]
    return line


def line_text(line: bytes) -> str:
    return strip_eol(line).decode("utf-8", errors="replace")


def numbered(lines: list[bytes], first: int, last: int) -> str:
    """`LINENO TEXT\\n` for lines first..last (1-based, inclusive)."""
    return "".join(f"{n} {line_text(lines[n - 1])}\n" for n in range(first, last + 1))


def load_file(ctx: ToolContext, path: str) -> tuple[str, bytes]:
    """(guard key, bytes) of an existing regular text file within the size limit; ToolError otherwise
    (a FIFO or a device is refused before it is opened: reading one would block or never end)."""
    full = ctx.resolve(path)
    try:
        st = os.stat(full)
    except OSError as exc:
        raise ToolError(f"cannot open {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{path} is a directory; use the list tool to see its entries")
    refuse_unless_regular(st.st_mode, path)
    if st.st_size > MAX_FILE_BYTES:
        raise ToolError(f"file too large: {path} exceeds {MAX_FILE_BYTES} bytes")
    try:
        f, _ = open_regular(full, path)
        with f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"file too large: {path} exceeds {MAX_FILE_BYTES} bytes")
    if b"\0" in data:
        raise ToolError(f"binary file: {path} contains NUL bytes; inspect it with bash (for example xxd or file)")
    return ctx.abs_key(path), data


def atomic_write(target: str, data: bytes) -> None:
    """Replace `target` through ds4agent.fsutil's one procedure (temp file beside the real target,
    fsync, rename, directory fsync): a crash leaves the old file or the new one, never half.
    Permission bits are kept, a symlink is written through (the link keeps pointing at the new
    file) and missing parent directories are created (`write` creates them)."""
    fsutil.atomic_write(target, data, make_parents=True)


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
                raw: bool) -> ToolResult:
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
        return ToolResult(text, display=TextDisplay(summary=f"Read {summary} (raw)", body=text))
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
    return ToolResult(text, display=TextDisplay(summary=f"Read {summary}", body=body))


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

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
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

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
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

    @property
    def creates(self) -> bool:
        return self.before is None and self.before_unshown is None

    def diff(self) -> DiffDisplay:
        if self.before_unshown is not None:
            return make_replacement_preview(self.path, self.before_unshown, self.after)
        return make_diff(self.path, self.before, self.after)


def _current_content(full: str, path: str) -> tuple[bytes | None, str | None]:
    """What a write will replace, for its diff: (bytes, None) for a text file within the read/edit
    limits; (None, None) when there is no file yet; (None, why) when the file exists but cannot be
    shown (too large, binary, unreadable): the write still may replace it, the preview just has no
    diff. A directory, FIFO or device is refused: write replaces regular files only, and reading
    one to preview it would block or never end."""
    try:
        st = os.stat(full)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot look at the current file: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{path} is a directory")
    refuse_unless_regular(st.st_mode, path)
    too_large = f"the current file ({{size}} bytes) is over the {MAX_FILE_BYTES} byte limit of read/edit and is not shown"
    if st.st_size > MAX_FILE_BYTES:
        return None, too_large.format(size=st.st_size)
    try:
        f, _ = open_regular(full, path)
        with f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return None, f"cannot read the current file: {exc.strerror}"
    if len(data) > MAX_FILE_BYTES:  # it grew since the stat
        return None, too_large.format(size=len(data))
    if b"\0" in data:
        return None, f"the current file ({len(data)} bytes) is binary and is not shown"
    return data, None


def plan_write(args: Mapping[str, Any], ctx: ToolContext) -> Change:
    path = arg_str(args, "path", required=True)
    content = arg_str(args, "content", required=True)
    if not path.strip():
        raise ToolError("empty path")
    before, unshown = _current_content(str(ctx.resolve(path)), path)
    after = content.encode("utf-8")
    return Change(path=path, key=ctx.abs_key(path), before=before, after=after, before_unshown=unshown,
                  result_text=f"Wrote {len(after)} bytes to {path}\n")


def _content_before(change: Change, ctx: ToolContext) -> bytes | None:
    """What the file holds before the write, for the code checkpoint (on_write). The preview may
    have left it unread (too large, binary: before is None then, as for a new file), but undoing
    the write must put those bytes back, not delete the file: read them here, whole."""
    if change.before is not None or change.before_unshown is None:
        return change.before
    try:
        f, _ = open_regular(ctx.resolve(change.path), change.path)
        with f:
            return f.read()
    except (OSError, ToolError) as exc:
        # Without the old bytes a /rewind could not undo the write (it would remove the file):
        # refused before anything is changed.
        raise ToolError(f"cannot keep a copy of {change.path} for /rewind: {exc}") from None


def _apply(change: Change, ctx: ToolContext) -> ToolResult:
    """Write the change, then tell what happened to the file. Only a failed write is a failure:
    once the file is replaced, trouble with the bookkeeping after it (the guard's records, the
    diff for the UI: both scale with the file and can run out of memory) must not make the model
    believe the file is unchanged."""
    undo = _content_before(change, ctx) if ctx.on_write is not None else change.before
    try:
        atomic_write(str(ctx.resolve(change.path)), change.after)
    except OSError as exc:
        raise ToolError(f"cannot write {change.path}: {exc.strerror or exc}") from None
    key = ctx.abs_key(change.path)  # the file exists now, so symlinks resolve
    if ctx.on_write is not None:
        try:
            ctx.on_write(key, undo, change.after)
        except Exception:  # see the docstring; the agent reports its own failures
            pass
    try:
        _record(change, ctx, key)
    except Exception:  # see the docstring
        ctx.seen.replace(key, ())  # unknown state: line edits must read the file again
    try:
        display: object = change.diff()
    except Exception as exc:  # see the docstring
        first = change.result_text.split("\n", 1)[0]
        display = TextDisplay(summary=f"{first} (no diff: {type(exc).__name__})", body=change.result_text)
    return ToolResult(change.result_text, display=display)


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

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        return _apply(plan_write(args, ctx), ctx)


# --------------------------------------------------------------------------------------------------
# edit


_RANGE = re.compile(r"^\s*(\d+)\s*[:\-]\s*(\d+)\s*$")


def _is_crlf_block(lines: list[bytes]) -> bool:
    ends = [x for x in lines if x.endswith((b"\n", b"\r"))]
    return bool(ends) and all(x.endswith(b"\r\n") for x in ends)


def _to_crlf(data: bytes) -> bytes:
    return re.sub(rb"(?<!\r)\n", b"\r\n", data)


def _numbered_clipped(lines: list[bytes], nums: list[int], indent: str = "") -> tuple[str, list[tuple[int, bytes]]]:
    """Numbered lines for error/context blocks; a line over CLIP_CHARS is clipped and not recorded
    for the guard (the model did not see all of it)."""
    out: list[str] = []
    seen: list[tuple[int, bytes]] = []
    for n in nums:
        t = line_text(lines[n - 1])
        if len(t) > CLIP_CHARS:
            t = t[:CLIP_CHARS] + f" [... {len(t) - CLIP_CHARS} more chars]"
        else:
            seen.append((n, lines[n - 1]))
        out.append(f"{indent}{n} {t}\n")
    return "".join(out), seen


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
        head, seen1 = _numbered_clipped(lines, list(range(x, first_end + 1)))
        tail, seen2 = _numbered_clipped(lines, list(range(last_start, y + 1)))
        body = head + f"... {count - 2 * REGION_HALF} edited lines omitted ...\n" + tail
        seen = seen1 + seen2
    else:
        body, seen = _numbered_clipped(lines, list(range(x, y + 1)))
    return f"Current file around edit: {path} lines {x}-{y} of {total}\n" + body, seen


def _shift_note(b: int, d: int) -> str:
    if d == 0:
        return ""
    return (
        f"Line shift: old lines after {b} moved by {d:+d} (old line {b + 1} is now line {b + 1 + d}). "
        "Lines shown below are safe for immediate line/range editing; read again before editing "
        "other shifted lines.\n"
    )


def _guard(ctx: ToolContext, key: str, path: str, lines: list[bytes], a: int, b: int) -> None:
    rec = ctx.seen.get(key)
    if not rec:
        raise ToolError(f"line edit requires a recent read/search of {path}; read the range before editing")
    for n in range(a, b + 1):
        crc = rec.get(n)
        if crc is None:
            raise ToolError(
                f"line {n} of {path} was not shown recently or moved after an edit; "
                "read this range again before editing"
            )
        if crc != ctx.seen.crc(lines[n - 1]):
            raise ToolError(f"file changed around line {n} of {path}; read this range again before editing")


def _line_range(args: Mapping[str, Any]) -> tuple[int, int] | None:
    """(A, B) from range / line / start_line+end_line; None when none was given."""
    rng = arg_str(args, "range")
    if rng is not None and rng.strip():
        m = _RANGE.match(rng)
        if not m:
            raise ToolError("invalid range; use START:END, for example 10:20")
        a, b = int(m.group(1)), int(m.group(2))
        if a < 1 or b < a:
            raise ToolError("invalid range; use START:END, for example 10:20")
        return a, b
    line = arg_int(args, "line", None)
    if line is not None:
        return line, line
    start = arg_int(args, "start_line", None)
    if start is not None:
        end = arg_int(args, "end_line", None)
        end = start if end is None else end
        if end < start:
            raise ToolError("invalid range; use START:END, for example 10:20")
        return start, end
    return None


def _candidates(lines: list[bytes], old: str, limit: int = 3) -> list[tuple[int, int, float]]:
    """Closest windows of len(old lines) lines: (first line, last line, similarity), best first."""
    want = old.split("\n")
    if want and want[-1] == "":
        want.pop()
    k = max(1, len(want))
    texts = [line_text(x) for x in lines]
    if not texts:
        return []
    first = want[0].strip() if want else ""
    # Cheap prefilter on the first line, then a full comparison of the best windows only, so a big
    # file does not cost a quadratic number of SequenceMatcher runs.
    sm = difflib.SequenceMatcher(autojunk=False)
    sm.set_seq2(first)
    scored = []
    for i, t in enumerate(texts):
        sm.set_seq1(t.strip())
        if sm.real_quick_ratio() < 0.3:
            continue
        scored.append((sm.quick_ratio(), i))
    scored.sort(reverse=True)
    target = "\n".join(want)
    best: list[tuple[int, int, float]] = []
    for _, i in scored[:30]:
        j = min(len(texts), i + k)
        ratio = difflib.SequenceMatcher(None, "\n".join(texts[i:j]), target, autojunk=False).ratio()
        best.append((i + 1, j, ratio))
    best.sort(key=lambda t: (-t[2], t[0]))
    picked: list[tuple[int, int, float]] = []
    for cand in best:
        if cand[2] < 0.4:
            break
        if all(cand[1] < p[0] or cand[0] > p[1] for p in picked):
            picked.append(cand)
        if len(picked) == limit:
            break
    return picked


def _show(lines: list[bytes], a: int, b: int, key: str, shown: list[tuple[str, int, bytes]]) -> str:
    b = min(b, a + 7)  # a candidate is shown by at most 8 lines
    text, seen = _numbered_clipped(lines, list(range(a, b + 1)), indent="    ")
    shown.extend((key, n, raw) for n, raw in seen)
    return text


def _line_starts(lines: list[bytes]) -> list[int]:
    starts, pos = [], 0
    for x in lines:
        starts.append(pos)
        pos += len(x)
    return starts


def _line_at(starts: list[int], offset: int) -> int:
    """1-based number of the line containing byte `offset`."""
    return bisect.bisect_right(starts, offset)


def _occurrences(data: bytes, needle: bytes) -> list[int]:
    """Every start offset of needle, overlapping ones included ("aa" occurs twice in "aaa": an
    ambiguous replacement, so it must not count as unique)."""
    out, pos = [], data.find(needle)
    while pos >= 0:
        out.append(pos)
        pos = data.find(needle, pos + 1)
    return out


def _plan_replace(ctx: ToolContext, path: str, key: str, data: bytes, old_s: str, new_s: str) -> Change:
    if old_s == "":
        raise ToolError("old text is empty; give the exact text to replace, or use line/range plus new")
    lines = split_lines(data)
    old_b, new_b = old_s.encode("utf-8"), new_s.encode("utf-8")
    offsets = _occurrences(data, old_b)
    if not offsets and b"\r\n" in data and b"\n" in old_b:
        crlf_old = _to_crlf(old_b)
        crlf_offsets = _occurrences(data, crlf_old)
        if crlf_offsets:
            old_b, new_b, offsets = crlf_old, _to_crlf(new_b), crlf_offsets
    count = len(offsets)
    if count == 0:
        shown: list[tuple[str, int, bytes]] = []
        msg = f"old text not found in {path} (0 occurrences; the match is exact and case-sensitive)."
        cands = _candidates(lines, old_s)
        if cands:
            msg += " Closest candidates:\n"
            for a, b, r in cands:
                where = f"line {a}" if a == b else f"lines {a}-{b}"
                msg += f"  {where} ({r:.0%} similar):\n" + _show(lines, a, b, key, shown)
            msg += "Retry with old copied exactly from these lines, or edit them by line/range plus new.\n"
        raise ToolError(msg, shown=shown)
    starts = _line_starts(lines)
    if count > 1:
        shown = []
        nums = list(dict.fromkeys(_line_at(starts, o) for o in offsets))
        listed = ", ".join(str(n) for n in nums[:20]) + (", ..." if len(nums) > 20 else "")
        msg = (
            f"old text is not unique; read the target lines and retry with line/range plus new "
            f"({count} occurrences in {path}, starting at lines {listed}):\n"
        )
        for n in nums[:5]:
            msg += _show(lines, n, n, key, shown)
        raise ToolError(msg, shown=shown)
    off = offsets[0]
    a = _line_at(starts, off)
    b = _line_at(starts, off + len(old_b) - 1)
    if _is_crlf_block(lines[a - 1 : b]):
        new_b = _to_crlf(new_b)
    after = data[:off] + new_b + data[off + len(old_b) :]
    new_lines = split_lines(after)
    d = len(new_lines) - len(lines)
    k = max(0, (b - a + 1) + d)
    ctx_text, ctx_lines = _context_block(path, new_lines, a, k)
    text = (
        f"Edited {path} using old/new replacement\n"
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
    old = arg_str(args, "old")
    new = arg_str(args, "new")
    rng = arg_str(args, "range")
    key, data = load_file(ctx, path)
    if old is not None:
        return _plan_replace(ctx, path, key, data, old, new if new is not None else "")
    lines = split_lines(data)
    if rng is not None and rng.strip().lower() == "all":
        if new is None:
            raise ToolError("line/range edit requires explicit new text; use new=\"\" only when deleting")
        new_b = new.encode("utf-8")
        if _is_crlf_block(lines):
            new_b = _to_crlf(new_b)
        new_lines = split_lines(new_b)
        ctx_text, _ = _context_block(path, new_lines, 1, len(new_lines))
        return Change(path=path, key=key, before=data, after=new_b,
                      result_text=f"Edited {path} range=all\n" + ctx_text, record=None)
    span = _line_range(args)
    if span is None:
        raise ToolError('edit requires old/new, line+new, range+new, or range="all"+new')
    if new is None:
        raise ToolError("line/range edit requires explicit new text; use new=\"\" only when deleting")
    a, b = span
    if a < 1 or b > len(lines):
        raise ToolError("edit line range is outside the file")
    _guard(ctx, key, path, lines, a, b)
    block = lines[a - 1 : b]
    new_b = new.encode("utf-8")
    if new_b:
        if _is_crlf_block(block):
            new_b = _to_crlf(new_b)
        last = block[-1]
        if last.endswith((b"\n", b"\r")) and not new_b.endswith((b"\n", b"\r")):
            # The replaced block ended a line; keep the next line on its own line.
            new_b += b"\r\n" if last.endswith(b"\r\n") else last[-1:]
    after = b"".join(lines[: a - 1]) + new_b + b"".join(lines[b:])
    new_lines = split_lines(after)
    k = len(split_lines(new_b))
    d = k - (b - a + 1)
    ctx_text, ctx_lines = _context_block(path, new_lines, a, k)
    text = f"Edited {path} lines {a}-{b}\n" + _shift_note(b, d) + ctx_text
    region = [(n, new_lines[n - 1]) for n in range(a, a + k)]
    return Change(path=path, key=key, before=data, after=after, result_text=text,
                  record=region + ctx_lines, keep_below=a, keep_after=b if d == 0 else None)


class EditTool:
    name = "edit"
    description = (
        "Change an existing file. Preferred: replace lines you have read by number with "
        "range=\"START:END\" (or line=N) plus new; new=\"\" deletes them. Lines not read since they "
        "last changed are refused: read them again. Alternatively old (exact text that occurs once) "
        "plus new, or range=\"all\" plus new to rewrite the whole file. The result shows the edited "
        "region with current line numbers."
    )
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "range": {"type": "string", "description": "START:END line range, or all"},
            "line": {"type": "integer", "description": "a single line number"},
            "start_line": {"type": "integer"},
            "end_line": {"type": "integer"},
            "old": {"type": "string", "description": "exact text to replace (must occur once)"},
            "new": {"type": "string", "description": "replacement text"},
        },
        "required": ["path"],
    }
    mutates = True

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        return _apply(plan_edit(args, ctx), ctx)


def plan_change(tool_name: str, args: Mapping[str, Any], ctx: ToolContext) -> Change:
    """The change a write/edit call would make (for permission previews); ToolError if it would fail."""
    if tool_name == "write":
        return plan_write(args, ctx)
    if tool_name == "edit":
        return plan_edit(args, ctx)
    raise ToolError(f"{tool_name} does not change files")
