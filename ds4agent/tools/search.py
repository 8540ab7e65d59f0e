"""search: find text in files under a path (agent-reference.md §5.8), in a stable order.

Walks at most 24 directory levels, never follows symlinks, skips `.git` and other tool caches
(see SKIP_DIRS), files with a NUL byte and files over 16 MiB. Unlike the baseline (directory
order) files are visited sorted by name so the same tree always gives the same output, and a
search cut by max_results says so. Printed lines count as shown for the edit guard. A search
ends after SEARCH_TIME_LIMIT seconds or at the user's interrupt, keeping what it found; regex
matching runs in a child process (regex_worker) so that both work while the regex engine runs.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ds4agent.tools.args import arg_bool, arg_int, arg_str
from ds4agent.tools.context import ToolContext
from ds4agent.tools.files import MAX_FILE_BYTES, line_text, split_lines
from ds4agent.tools.regex_worker import RegexInterrupted, RegexTimeout, RegexWorker, RegexWorkerFailed
from ds4agent.tools.regular import open_regular, refuse_unless_regular
from ds4agent.tools.results import RESULT_CAP_BYTES, TextDisplay, ToolError, ToolResult

MAX_DEPTH = 24
MAX_SHOWN_CHARS = 400
BODY_BUDGET = RESULT_CAP_BYTES - 4096
# A whole search stops after this long (results so far are kept): a regex that backtracks
# catastrophically is killed (regex_worker), and a huge tree does not hold the model for ever.
SEARCH_TIME_LIMIT = 30.0
TIMEOUT_HINT = ("a regex with nested repetition such as (a+)+ can take exponential time on a line that "
                "almost matches: simplify the regex, or narrow the path or glob")
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
        root = ctx.resolve(path)
        try:
            st = os.stat(root)
        except OSError as exc:
            raise ToolError(f"cannot search {path}: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            files: Iterator[tuple[str, str]] = ((f, os.path.relpath(f, root)) for f in _walk(str(root)))
            shown_name = lambda rel: os.path.normpath(os.path.join(path, rel))  # noqa: E731
        else:
            refuse_unless_regular(st.st_mode, path)
            files = iter([(str(root), os.path.basename(path))])
            shown_name = lambda rel: path  # noqa: E731
        deadline = time.monotonic() + SEARCH_TIME_LIMIT
        if mode == "regex":
            flags = 0 if case else re.IGNORECASE
            try:
                re.compile(query, flags)
            except re.error as exc:
                raise ToolError(f"invalid regex: {exc}") from None
            with RegexWorker(query, flags, SEARCH_TIME_LIMIT) as worker:
                return self._search(ctx, files, shown_name, query, pattern, context, limit, deadline,
                                    lambda texts, want: worker.hits(texts, want, deadline, ctx.should_stop))
        folded = query if case else query.casefold()

        def literal_hits(texts: list[str], want: int) -> list[int]:
            # A substring test is linear in the line: no time limit is needed inside one file.
            hits = []
            for i, t in enumerate(texts):
                if folded in (t if case else t.casefold()):
                    hits.append(i)
                    if len(hits) == want:
                        break
            return hits

        return self._search(ctx, files, shown_name, query, pattern, context, limit, deadline, literal_hits)

    def _search(self, ctx: ToolContext, files: Iterator[tuple[str, str]], shown_name: Callable[[str], str],
                query: str, pattern: str | None, context: int, limit: int, deadline: float,
                find: Callable[[list[str], int], list[int]]) -> ToolResult:
        blocks: list[str] = []
        size = 0
        total = 0
        cut = False
        over_budget = False
        interrupted = False
        timed_out = False
        n_files = 0
        for full, rel in files:
            if ctx.should_stop():
                interrupted = True
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            if not _glob_ok(pattern, rel):
                continue
            try:
                f, fst = open_regular(full, rel)
                with f:
                    if fst.st_size > MAX_FILE_BYTES:
                        continue
                    data = f.read(MAX_FILE_BYTES + 1)
            except (OSError, ToolError):
                continue  # vanished, unreadable, or no longer a regular file since the walk
            if b"\0" in data or len(data) > MAX_FILE_BYTES:
                continue
            lines = split_lines(data)
            texts = [line_text(x) for x in lines]
            room = limit - total
            try:
                hits = find(texts, room + 1)  # one more than there is room for: were there more?
            except RegexInterrupted:
                interrupted = True
                break
            except RegexTimeout:
                timed_out = True
                break
            except RegexWorkerFailed as exc:
                raise ToolError(f"regex search failed: {exc}") from None
            if len(hits) > room:
                cut = True
                hits = hits[:room]
            total += len(hits)
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
        if total == 0 and timed_out:
            raise ToolError(f"search timed out after {SEARCH_TIME_LIMIT:g} s before any match was found; "
                            + TIMEOUT_HINT)
        if total == 0:
            return ToolResult("No matches\n", display=TextDisplay(summary=f"search {query!r}: no matches", body=""))
        head = f"{total} match{'es' if total != 1 else ''} shown\n\n"
        text = head + "".join(blocks)
        if interrupted:
            text += "[search interrupted by the user; results are incomplete]\n"
        elif timed_out:
            text += f"[search timed out after {SEARCH_TIME_LIMIT:g} s; results are incomplete: {TIMEOUT_HINT}]\n"
        elif over_budget:
            text += "[search output reached the size limit; narrow the query, path or glob]\n"
        elif cut:
            text += f"[search stopped at max_results={limit}; more matches exist: narrow the query, path or glob]\n"
        summary = f"search {query!r}: {total} match{'es' if total != 1 else ''} in {n_files} file{'s' if n_files != 1 else ''}"
        return ToolResult(text, display=TextDisplay(summary=summary, body=text))
