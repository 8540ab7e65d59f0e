"""The built-in system text and the project instructions (AGENTS.md).

The system prefix (BOS, [Think-Max prefix], system text, tools block) is cached as a KV file
keyed by its exact rendered text (kvc-format.md §12.2). Any byte that changes from run to run
would make that cache miss on every start, so the built-in text below holds NO per-run data:
no date, no working directory, no user name, no model path. Project-specific text comes only
from AGENTS.md (stable for a given project) and --system.

Trust (prompt-and-dsml.md §2): BUILTIN_SYSTEM_TEXT is trusted (the agent wrote it): the one DSML
marker it mentions becomes the special token, exactly as in the official tools block. The extra
text (--system, AGENTS.md) is untrusted: plain BPE, never special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ds4agent import utf8
from ds4agent.protocol.template import trim

# Written for DeepSeek V4 Flash running locally through ds4agent's tools (read/more/write/edit/
# search/list/bash/bash_status/bash_stop). Kept short: every token here is prefilled once per
# system-prompt cache miss and occupies context for the whole session.
_SYSTEM_TEMPLATE = """You are ds4agent, a coding agent. You work in the user's project directory on their own machine, and you act on it through the tools listed below: you read, search, edit and run things yourself instead of asking the user to do it or pasting large files into your answer.

## How to work
- Understand before changing: list and search to find the relevant code, then read the parts you need. Check your work by running the project's tests or commands when that makes sense.
- Calls are never allowed while you are reasoning: finish your reasoning first, then write the tool call block. Several independent calls may go in one block; they run in order.
- String parameters are taken literally, character for character: do not escape `<`, `>`, `&` or quotes. The only exception: if a value must contain the closing parameter tag itself, write it as `&lt;/｜DSML｜parameter>`. Numbers and booleans are JSON with string="false".
- After the tools have run, continue with the task; when it is done, answer briefly: what you changed, what you verified, what is left.

## Reading files
- `read` shows numbered lines, 500 at a time by default. When the header gives a continue_offset, call `more` to get the next chunk. Read the whole file at once (whole=true) only when the user asks for it: large files may not fit in the context.
- Use `search` (literal or regex, with a glob filter) to find code instead of reading whole trees, and `list` to see a directory.

## Editing files
- `edit` takes `path`, `old` and `new`: `old` is exact text from lines you have read (no line numbers) and must occur once in the file; `new` replaces it (new="" deletes). If the lines changed since you read them, read them again.
{upto}- If `old` selects nothing, the call stops before `new` and the result shows the closest lines.
- `write` creates or overwrites a whole file; use it for new files. raw=true on `read` gives the exact bytes without line numbers.

## Running commands
- `bash` runs one shell command in the project directory; it waits up to refresh_sec seconds, then leaves the job running in the background. Use `bash_status` to see a running job's progress and `bash_stop` to end it. Long builds or test runs: set a sensible refresh_sec and timeout_sec.
- Commands have no terminal input: use non-interactive flags.

## Task list
- For a job of several steps, keep the user's task list current with `todo`; skip it for small questions.

## Rules
- Follow the tool call syntax and the parameter schemas exactly.
- Inference is local and not fast: prefill runs at a few hundred tokens per second and generation at tens of tokens per second. Read only what you need, keep outputs small, and prefer {small_edits} to copying long text or rewriting files.
- Write correct, working code that fits the project's style. Do not change the user's system configuration, install software globally or delete work unless the user asks for it.
- The user may deny a tool call; then respect the decision and adapt."""

# --edit-upto adds the HEAD[upto]TAIL form of `old` (and the forced [upto], agent/edit_assist.py).
# Off by default: the model reached for it where exact text was the better choice.
_UPTO_PARAGRAPH = """- For a longer span write `old` as its first lines, `[upto]` on a line of its own, then its last line: the span runs from the first lines to the end of the last one. The tool may write `[upto]` for you once your first lines are unique: then write the last line, or close `old` if it was complete. Example:
<｜DSML｜parameter name="old" string="true">def parse_size(text):
    units = {"k": 1024, "M": 1 << 20}
[upto]
    return int(number * units[suffix])
</｜DSML｜parameter>
"""
_SMALL_EDITS = {False: "small exact edits", True: "edits with [upto]"}


def builtin_system_text(edit_upto: bool = False) -> str:
    """The built-in system text; --edit-upto teaches the [upto] form. The two differ in bytes, so
    the system prompt's KV cache (keyed by the exact text) keeps one file for each."""
    return _SYSTEM_TEMPLATE.format(upto=_UPTO_PARAGRAPH if edit_upto else "",
                                   small_edits=_SMALL_EDITS[edit_upto])


BUILTIN_SYSTEM_TEXT = builtin_system_text()

AGENTS_FILE = "AGENTS.md"
# AGENTS.md larger than this is cut (with a marker): it sits in every request's context.
AGENTS_MAX_BYTES = 32 * 1024


@dataclass(frozen=True)
class SystemText:
    """The two parts of SYSTEM_TEXT: built-in (trusted) and extra (untrusted, may be empty).

    notes: readable notices for the UI (e.g. "AGENTS.md truncated").
    """

    builtin: str
    extra: str
    notes: tuple[str, ...] = ()


def load_agents_md(cwd: Path) -> tuple[str, tuple[str, ...]]:
    """The project instructions from cwd/AGENTS.md ("" when absent), and notices."""
    path = cwd / AGENTS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return "", ()
    except OSError as err:
        return "", (f"could not read {AGENTS_FILE}: {err.strerror or err}",)
    notes: tuple[str, ...] = ()
    if len(raw) > AGENTS_MAX_BYTES:
        raw = utf8.cut(raw, AGENTS_MAX_BYTES)
        notes = (f"{AGENTS_FILE} is larger than {AGENTS_MAX_BYTES} bytes; only its start is used",)
        text = raw.decode("utf-8", "replace") + "\n[... AGENTS.md truncated ...]"
    else:
        text = raw.decode("utf-8", "replace")
    return trim(text), notes


def build_system_text(cwd: Path, extra: str | None, skills: str = "", *, edit_upto: bool = False) -> SystemText:
    """SYSTEM_TEXT parts for a project: built-in + ("\\n\\n" + extra) where extra joins the
    --system text, AGENTS.md and the skills' descriptions (each trimmed; empty parts dropped with
    their separator)."""
    parts: list[str] = []
    if extra:
        extra_t = trim(extra)
        if extra_t:
            parts.append(extra_t)
    agents, notes = load_agents_md(cwd)
    if agents:
        parts.append("# Project instructions (AGENTS.md)\n\n" + agents)
    if skills:
        parts.append(skills)
    return SystemText(builtin_system_text(edit_upto), "\n\n".join(parts), notes)
