"""search: find text in files under a path (agent-reference.md §5.8), in a stable order.

Walks at most 24 directory levels, never follows symlinks, skips `.git` and other tool caches
(see SKIP_DIRS), files with a NUL byte and files over 16 MiB. Unlike the baseline (directory
order) files are visited sorted by name so the same tree always gives the same output, and a
search cut by max_results says so. Printed lines count as shown for the edit guard.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterator, Mapping
from typing import Any

from ds4agent.tools.base import (
    RESULT_CAP_BYTES,
    TextDisplay,
    ToolContext,
    ToolError,
    ToolResult,
    arg_bool,
    arg_int,
    arg_str,
)
from ds4agent.tools.files import MAX_FILE_BYTES, line_text, split_lines

MAX_DEPTH = 24
MAX_SHOWN_CHARS = 400
BODY_BUDGET = RESULT_CAP_BYTES - 4096
# Besides .git (the baseline's only skip): version-control and generated caches whose matches
# would crowd out the project's own files, because sorted order visits dot-directories first.
# An explicit path inside one of them is still searched.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox"})


def _walk(root: str, depth: int = 0) -> Iterator[str]:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIP_DIRS and depth + 1 < MAX_DEPTH:
                    yield from _walk(entry.path, depth + 1)
            elif entry.is_file(follow_symlinks=False):
                yield entry.path
        except OSError:
            continue


def _glob_ok(pattern: str | None, rel: str) -> bool:
    if not pattern:
        return True
    return fnmatch.fnmatchcase(os.path.basename(rel), pattern) or fnmatch.fnmatchcase(rel, pattern)


class SearchTool:
    name = "search"
    description = (
        "Search file contents under a path (default: the working directory) and print matching "
        "lines with their line numbers, which can then be edited by line. Literal text by default, "
        "mode=\"regex\" for a regular expression; glob filters file names (for example *.py)."
    )
    schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "path": {"type": "string", "description": "file or directory (default .)"},
            "mode": {"type": "string", "description": "literal (default) or regex"},
            "glob": {"type": "string", "description": "only files whose name or path matches"},
            "context": {"type": "integer", "description": "lines of context around each match, 0-5"},
            "max_results": {"type": "integer", "description": "most matching lines to show (default 50)"},
            "case_sensitive": {"type": "boolean", "description": "default true"},
        },
        "required": ["query"],
    }
    mutates = False

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        query = arg_str(args, "query", required=True)
        if query == "":
            raise ToolError("empty query")
        path = arg_str(args, "path", default=".") or "."
        mode = (arg_str(args, "mode", default="literal") or "").strip().lower()
        pattern = arg_str(args, "glob")
        context = arg_int(args, "context", 0, 0, 5)
        limit = arg_int(args, "max_results", 50, 1, 500)
        case = arg_bool(args, "case_sensitive", True)
        if mode == "regex":
            try:
                rx = re.compile(query, 0 if case else re.IGNORECASE)
            except re.error as exc:
                raise ToolError(f"invalid regex: {exc}") from None
            matches = rx.search
        elif case:
            def matches(text: str) -> bool:
                return query in text
        else:
            folded = query.casefold()

            def matches(text: str) -> bool:
                return folded in text.casefold()

        root = ctx.resolve(path)
        try:
            st = os.stat(root)
        except OSError as exc:
            raise ToolError(f"cannot search {path}: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            files = ((f, os.path.relpath(f, root)) for f in _walk(str(root)))
            shown_name = lambda rel: os.path.normpath(os.path.join(path, rel))  # noqa: E731
        else:
            files = iter([(str(root), os.path.basename(path))])
            shown_name = lambda rel: path  # noqa: E731

        blocks: list[str] = []
        size = 0
        total = 0
        cut = False
        over_budget = False
        interrupted = False
        n_files = 0
        for full, rel in files:
            if ctx.should_stop():
                interrupted = True
                break
            if not _glob_ok(pattern, rel):
                continue
            try:
                if os.path.getsize(full) > MAX_FILE_BYTES:
                    continue
                with open(full, "rb") as f:
                    data = f.read(MAX_FILE_BYTES + 1)
            except OSError:
                continue
            if b"\0" in data or len(data) > MAX_FILE_BYTES:
                continue
            lines = split_lines(data)
            texts = [line_text(x) for x in lines]
            hits: list[int] = []
            for i, t in enumerate(texts):
                if matches(t):
                    if total == limit:
                        cut = True
                        break
                    hits.append(i)
                    total += 1
            if hits:
                n_files += 1
                wanted = sorted({j for i in hits for j in range(max(0, i - context), min(len(lines), i + context + 1))})
                key = os.path.realpath(full)
                out = [shown_name(rel) + "\n"]
                seen: list[tuple[int, bytes]] = []
                for j in wanted:
                    if size > BODY_BUDGET:
                        # Stay inside the result cap at a line boundary (and never record a line
                        # the cap would have cut away); hits not printed are not counted.
                        over_budget = True
                        total -= sum(1 for h in hits if h >= j)
                        break
                    t = texts[j]
                    if len(t) > MAX_SHOWN_CHARS:
                        # Not recorded for the guard: the model did not see the whole line.
                        t = t[:MAX_SHOWN_CHARS] + f" [... {len(t) - MAX_SHOWN_CHARS} more chars]"
                    else:
                        seen.append((j + 1, lines[j]))
                    out.append(f"  {j + 1} {t}\n")
                    size += len(out[-1].encode("utf-8"))
                ctx.seen.record(key, seen)
                blocks.append("".join(out) + "\n")
            if cut or over_budget:
                break
        if total == 0 and interrupted:
            raise ToolError("search interrupted by the user before any match was found")
        if total == 0:
            return ToolResult("No matches\n", display=TextDisplay(summary=f"search {query!r}: no matches", body=""))
        head = f"{total} match{'es' if total != 1 else ''} shown\n\n"
        text = head + "".join(blocks)
        if interrupted:
            text += "[search interrupted by the user; results are incomplete]\n"
        elif over_budget:
            text += "[search output reached the size limit; narrow the query, path or glob]\n"
        elif cut:
            text += f"[search stopped at max_results={limit}; more matches exist: narrow the query, path or glob]\n"
        summary = f"search {query!r}: {total} match{'es' if total != 1 else ''} in {n_files} file{'s' if n_files != 1 else ''}"
        return ToolResult(text, display=TextDisplay(summary=summary, body=text))
