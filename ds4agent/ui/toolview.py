"""How a tool call looks: the one-line summary, the result status and the body lines.

Pure functions (no Textual, no prompt_toolkit) so the TUI's cards and the plain mode's lines agree.
Body lines are (style, text) pairs; the style is one of the keys below and each front end maps it to
its own colours (the TUI to theme variables, the plain mode to ANSI).

The tools' `display` payload is read defensively (a dict or an object with attributes, any of the
keys below may be missing): the tools room owns that shape and may refine it, and a card must still
draw from the result text alone.
"""

from __future__ import annotations

import re
from typing import Any

from ds4agent.ui.fmt import clip

# styles of body lines
ADD, DEL, HUNK, CONTEXT, OUTPUT, FAILED, MUTED = "add", "del", "hunk", "context", "output", "failed", "muted"

SUMMARY_WIDTH = 90
OUTPUT_HEAD = 6      # bash: lines shown from the start of the output …
OUTPUT_TAIL = 6      # … and from its end
DIFF_HEAD = 14       # long diffs are folded to head and tail with "… N lines …"
DIFF_TAIL = 6
EXPANDED_MAX = 200   # an expanded read/search/list shows at most this many lines

# tools whose body is folded to the summary until the user expands it (Ctrl+O)
FOLDED_TOOLS = frozenset({"read", "more", "search", "list", "bash_status"})


def field(obj: Any, *names: str, default: Any = None) -> Any:
    """The first of `names` present in a dict or as an attribute of `obj`."""
    if obj is None:
        return default
    for name in names:
        if isinstance(obj, dict):
            if name in obj and obj[name] is not None:
                return obj[name]
        else:
            value = getattr(obj, name, None)
            if value is not None:
                return value
    return default


def _arg(args: dict[str, Any], *names: str) -> str:
    for name in names:
        value = args.get(name)
        if value not in (None, ""):
            return str(value)
    return ""


def tool_summary(name: str, args: dict[str, Any]) -> str:
    """`pytest -q tests/x.py`, `src/a.py  1–500`, `"retry" in src/ (regex)` … (parameter names as in
    the tools' schemas, with a few common spellings accepted while a call is still being written)."""
    args = args or {}
    if name == "bash":
        return clip(_arg(args, "command", "cmd"), SUMMARY_WIDTH)
    if name in ("bash_status", "bash_stop"):
        job, pid = _arg(args, "job"), _arg(args, "pid")
        return f"job {job}" if job else (f"pid {pid}" if pid else "")
    if name == "more":
        count = _arg(args, "count")
        return f"next {count} lines" if count else "next lines"
    if name == "read":
        path = _arg(args, "path", "file")
        if str(args.get("whole", "")).lower() in ("true", "1"):
            return clip(f"{path}  (whole file)", SUMMARY_WIDTH)
        start = _arg(args, "start_line", "start", "offset")
        count = _arg(args, "max_lines", "count", "limit")
        text = path
        if start.isdigit() and count.isdigit():
            text += f"  {start}–{int(start) + int(count) - 1}"
        elif start:
            text += f"  from {start}"
        return clip(text, SUMMARY_WIDTH)
    if name == "search":
        pattern = _arg(args, "query", "pattern", "regex")
        where = _arg(args, "path", "dir") or "."
        text = f'"{pattern}" in {where}'
        glob = _arg(args, "glob", "include")
        if glob:
            text += f" ({glob})"
        if _arg(args, "mode") == "regex" or str(args.get("regex", "")).lower() in ("true", "1"):
            text += " (regex)"
        return clip(text, SUMMARY_WIDTH)
    if name == "list":
        return clip(_arg(args, "path", "dir") or ".", SUMMARY_WIDTH)
    if name in ("edit", "write"):
        path = _arg(args, "path", "file")
        first = _arg(args, "start_line", "start", "line")
        last = _arg(args, "end_line", "end")
        where = _arg(args, "range")
        if first and last:
            path += f"  lines {first}–{last}"
        elif first:
            path += f"  line {first}"
        elif where:
            path += f"  {where}"
        return clip(path, SUMMARY_WIDTH)
    parts = [f"{k}={clip(str(v), 40)}" for k, v in args.items()]
    return clip(" ".join(parts), SUMMARY_WIDTH)


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n") if text.strip() else []


def diff_stats(diff: str) -> tuple[int, int]:
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+++") or line.startswith("---"):
            continue
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
    return added, removed


def _exit_code(display: Any, text: str) -> int | None:
    code = field(display, "exit_status", "exit_code", "returncode")
    if isinstance(code, int):
        return code
    if display is not None:
        return None
    # No payload: fall back on the observation text the model gets ("exit status N" / "exit code N").
    m = re.search(r"exit (?:status|code)[ :=]*(-?\d+)", text)
    return int(m.group(1)) if m else None


def result_status(name: str, ok: bool, text: str, display: Any = None, elapsed: float = 0.0) -> str:
    """The short text at the right of a finished card (after ✓ / ✗)."""
    if name in ("bash", "bash_status", "bash_stop") and (display is not None or ok):
        code = _exit_code(display, text)
        parts = []
        if field(display, "timed_out"):
            parts.append("timed out")
        elif code is not None:
            parts.append(f"exit {code}")
        elif field(display, "running"):
            parts.append("running in background")
        seconds = field(display, "duration", default=elapsed) or 0.0
        if seconds >= 0.05:
            parts.append(f"{seconds:.1f} s")
        return "  ".join(parts) or "done"
    if not ok:
        first = field(display, "summary") or next((ln for ln in text.splitlines() if ln.strip()), "failed")
        return clip(str(first).removeprefix("Tool error: "), 60)
    added, removed = field(display, "added"), field(display, "removed")
    if isinstance(added, int) and isinstance(removed, int):
        return ("created  " if field(display, "created") else "") + f"+{added} −{removed}"
    diff = field(display, "diff", "unified")
    if name in ("edit", "write") and isinstance(diff, str) and diff:
        added, removed = diff_stats(diff)
        return f"+{added} −{removed}"
    summary = field(display, "summary")
    if isinstance(summary, str) and summary:
        return clip(summary, 48)
    matches = field(display, "matches", "match_count")
    if name == "search" and isinstance(matches, int):
        return f"{matches} match" + ("" if matches == 1 else "es")
    n = len(_lines(text))
    return f"{n} line" + ("" if n == 1 else "s")


def _fold(lines: list[tuple[str, str]], head: int, tail: int) -> list[tuple[str, str]]:
    if len(lines) <= head + tail + 1:
        return lines
    hidden = len(lines) - head - tail
    return lines[:head] + [(MUTED, f"… {hidden} lines …")] + lines[-tail:]


def diff_lines(diff: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in diff.splitlines():
        if line.startswith("+++") or line.startswith("---"):
            continue
        if line.startswith("@@"):
            out.append((HUNK, line))
        elif line.startswith("+"):
            out.append((ADD, line))
        elif line.startswith("-"):
            out.append((DEL, line))
        else:
            out.append((CONTEXT, line))
    return out


def bash_failed(ok: bool, text: str, display: Any) -> bool:
    code = _exit_code(display, text)
    return (not ok) or (code is not None and code != 0)


def result_failed(name: str, ok: bool, text: str, display: Any) -> bool:
    """A card shows ✗ for a tool error, and for a bash command that exited non-zero."""
    return not ok or (name == "bash" and bash_failed(ok, text, display))


def invalid_call_label(kind: str) -> str:
    """How a rejected tool call is named (ToolCallInvalid.kind)."""
    return {"thinking": "tool call ignored", "interrupted": "unfinished tool call"}.get(kind, "invalid tool call")


def numbered_diff_lines(lines: Any) -> list[tuple[str, str]]:
    """DiffDisplay.lines (kind, old_no, new_no, text) as `- 88  text` rows, the numbers right-aligned."""
    out: list[tuple[str, str]] = []
    width = max((len(str(field(ln, "new_no") or field(ln, "old_no") or "")) for ln in lines), default=1)
    for ln in lines:
        kind, text = field(ln, "kind", default="context"), field(ln, "text", default="")
        if kind == "hunk":
            out.append((HUNK, text))
            continue
        no = field(ln, "new_no") if kind == "add" else field(ln, "old_no")
        if kind == "context":
            no = field(ln, "new_no") or field(ln, "old_no")
        sign = {"add": "+", "remove": "-"}.get(kind, " ")
        style = {"add": ADD, "remove": DEL}.get(kind, CONTEXT)
        out.append((style, f"{sign} {str(no or ''):>{width}}  {text.rstrip(chr(10))}"))
    return out


def result_body(name: str, ok: bool, text: str, display: Any = None, *, expanded: bool = False) -> list[tuple[str, str]]:
    """Body lines under the card; folded tools give [] unless expanded."""
    if name in ("bash", "bash_status", "bash_stop") and display is not None:
        output = field(display, "output", default="")
        style = FAILED if bash_failed(ok, text, display) else OUTPUT
        lines = [(style, ln) for ln in _lines(str(output))]
        kind = field(display, "output_kind")
        total = field(display, "total_lines")
        if kind in ("head", "tail") and isinstance(total, int) and total > len(lines):
            marker = (MUTED, f"[showing {'first' if kind == 'head' else 'last'} {len(lines)} of {total} lines]")
            lines = lines + [marker] if kind == "head" else [marker] + lines
        return lines[:EXPANDED_MAX] if expanded else _fold(lines, OUTPUT_HEAD, OUTPUT_TAIL)
    numbered = field(display, "lines")
    if name in ("edit", "write") and ok and isinstance(numbered, (list, tuple)) and numbered:
        lines = numbered_diff_lines(numbered)
        return lines if expanded else _fold(lines, DIFF_HEAD, DIFF_TAIL)
    diff = field(display, "diff", "unified")
    if name in ("edit", "write") and ok and isinstance(diff, str) and diff:
        lines = diff_lines(diff)
        return lines if expanded else _fold(lines, DIFF_HEAD, DIFF_TAIL)
    if not ok:
        lines = [(FAILED, ln) for ln in _lines(text)]
        return lines[:EXPANDED_MAX] if expanded else _fold(lines, 3, 2)
    if name == "bash":
        style = FAILED if bash_failed(ok, text, display) else OUTPUT
        lines = [(style, ln) for ln in _lines(text)]
        return lines[:EXPANDED_MAX] if expanded else _fold(lines, OUTPUT_HEAD, OUTPUT_TAIL)
    if name in FOLDED_TOOLS and not expanded:
        return []
    body = field(display, "body")
    lines = [(OUTPUT, ln) for ln in _lines(body if isinstance(body, str) else text)]
    if len(lines) > EXPANDED_MAX:
        lines = lines[:EXPANDED_MAX] + [(MUTED, f"… {len(lines) - EXPANDED_MAX} more lines …")]
    return lines


def pending_body(name: str, params: dict[str, str]) -> list[tuple[str, str]]:
    """What a card shows while the model is still writing an edit/write call: the new text."""
    if name == "edit":
        old, new = params.get("old", params.get("old_string", "")), params.get("new", params.get("new_string", ""))
        lines = [(DEL, "-" + ln) for ln in _lines(old)] + [(ADD, "+" + ln) for ln in _lines(new)]
        return _fold(lines, DIFF_HEAD, DIFF_TAIL)
    if name == "write":
        content = params.get("content", "")
        return _fold([(ADD, "+" + ln) for ln in _lines(content)], DIFF_HEAD, DIFF_TAIL)
    return []
