"""Prompt rendering for DeepSeek V4 (prompt-and-dsml.md §3-10): the one renderer of the transcript.

Append-only by construction: every unit the agent appends starts with a special token (BOS, <｜User｜>,
EOS), and BPE runs never cross a special token, so the ids of the units, concatenated in order (with the
sampled assistant tokens between them), equal the tokenisation of the whole rendering. The agent keeps a
flat id list and only ever extends it with what these functions return.

Public API (`think_mode` is "think" | "nothink" | "think-max" or a ThinkMode). Each unit is written
as a list of pieces (special ids and tokenizer.Text runs, trusted or not); `render` turns any of
them into ids, so a unit's arguments are stated once:

    ids = render(user_turn_pieces("fix the test", think_mode="think"), tokenizer)

    render(pieces, tokenizer=None) -> list[int]
    system_prefix_pieces(system_text, *, extra_system_text="", tools=(), think_mode="think", ctx)
        BOS [Think-Max prefix] SYSTEM_TEXT ["\\n\\n" extra] ["\\n\\n" TOOLS_BLOCK]
    user_turn_pieces(text, *, think_mode, lead=(), date_line="")
        [lead] <｜User｜> [date_line "\\n\\n"] trimmed text <｜Assistant｜> THINK_TOKEN
        (EmptyMessageError when the text is empty after trimming)
    session_date_line(now) -> str ; strip_session_date(text) -> str
        the local date and time the first user turn of a session carries, and its removal
    tool_results_pieces(results, *, queued=(), think_mode, lead=())
        <｜User｜><tool_result>R1</tool_result>\\n\\n<tool_result>R2</tool_result>[\\n\\nqueued]<｜Assistant｜>THINK
    render_assistant_end() -> [EOS]
    system_reminder_pieces(system_text, *, extra_system_text, tools)
        the `lead` of a turn: the system prompt again (long sessions)
    compacted_prefix_pieces(system_text, summary, *, extra_system_text="", tools=(), think_mode, ctx)
        the system prefix + the compaction wrapper lines + summary; the kept tail's ids follow it.
    render_dsml_block(calls) -> str          canonical "\\n\\n<｜DSML｜tool_calls>\\n...</｜DSML｜tool_calls>"
    assistant_output_pieces(*, reasoning=None, text="", calls=(), think_mode, eos=True)
        what a canonical model output looks like (tests, scripted engines, rebuilds)
    tools_block(tools) -> str ; tool_schema_line(tool) -> str
    effective_think_mode(mode, ctx) -> ThinkMode ; think_token(mode) -> int
    trim(text) ; join_queued(messages) -> str

The inverse, reading a rendered transcript's ids back into turns:

    split_turns(ids, start=0) -> list[Turn]  every <｜User｜> turn: its user part, the think token
        after <｜Assistant｜>, the assistant output up to EOS, and whether that EOS came

Tools are given as mappings {"name", "description", "parameters"} or objects with `name`,
`description` and `schema` attributes (the tools room's Tool protocol), in registry order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, overload

from ds4agent.protocol.tokenizer import (
    ASSISTANT,
    BOS,
    END_THINK,
    EOS,
    THINK,
    USER,
    Piece,
    Text,
    Tokenizer,
    as_bytes,
)


class ThinkMode(StrEnum):
    THINK = "think"
    NOTHINK = "nothink"
    THINK_MAX = "think-max"


THINK_MAX_MIN_CTX = 393216  # §4: think-max is effective only with a context of at least 384K tokens

THINK_MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n"
    "\n"
)

# §5, byte for byte: the schema lines go between the two parts; the block ends with one LF.
TOOLS_BLOCK_HEAD = (
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    '"<｜DSML｜tool_calls>" block like the following:\n'
    "\n"
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n"
)
TOOLS_BLOCK_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

# The system prompt once more, deep in a long session (agent/worker.py decides when), between
# two trusted wrapper lines.
SYSTEM_REMINDER_HEAD = "[System prompt reminder follows.]\n"
SYSTEM_REMINDER_TAIL = "\n[End of system prompt reminder.]\n"

# agent-reference.md §8 (trusted wrapper lines; the summary between them is untrusted).
COMPACTION_HEAD = "\n\n[ds4-agent compacted earlier conversation. Durable task-state summary follows.]\n"
COMPACTION_TAIL = "[End compacted summary. Recent conversation continues verbatim below.]\n\n"

# §9: the loop's own result text (exact, no trailing LF). A message typed while the model works
# never stops a call (it follows the results turn); only an interrupt does.
RESULT_NOT_RUN_INTERRUPTED = "Tool call not executed: the user interrupted."


def result_unknown_tool(name: str) -> str:
    return f"Tool error: unknown tool: {name}"


class TemplateError(ValueError):
    """Something cannot be rendered (empty system text, an unrepresentable DSML value, ...)."""


class EmptyMessageError(TemplateError):
    """A user message that is empty after trimming; it is not submitted (§3)."""


# ----------------------------------------------------------------------------- small rules

_WS = " \t\n\v\f\r"  # exactly the six C-locale isspace bytes (§3); Unicode spaces are kept
_WS_B = _WS.encode()


@overload
def trim(text: str) -> str: ...
@overload
def trim(text: bytes) -> bytes: ...
def trim(text: str | bytes) -> str | bytes:
    """Strip leading/trailing 0x20, 0x09-0x0D only (U+00A0, U+3000, ... stay)."""
    return text.strip(_WS_B) if isinstance(text, bytes | bytearray) else text.strip(_WS)


def join_queued(messages: str | Iterable[str]) -> str:
    """Queued text (§9.1): each message trimmed, empty ones dropped. One message is sent as typed;
    several are numbered ("Queued user message 1:\n..."), a blank line between them, so the model
    can tell where one ends and the next begins (what ds4-agent sends)."""
    if isinstance(messages, str):
        messages = (messages,)
    texts = [t for t in (trim(m) for m in messages) if t]
    if len(texts) == 1:
        return texts[0]
    return "\n\n".join(f"Queued user message {i}:\n{t}" for i, t in enumerate(texts, 1))


def effective_think_mode(mode: str | ThinkMode, ctx: int) -> ThinkMode:
    """think-max silently becomes think below a 393216-token context (§4)."""
    mode = ThinkMode(mode)
    if mode is ThinkMode.THINK_MAX and ctx < THINK_MAX_MIN_CTX:
        return ThinkMode.THINK
    return mode


def think_token(mode: str | ThinkMode) -> int:
    """<think> in think/think-max, </think> in nothink: the last token of every generation prompt."""
    return END_THINK if ThinkMode(mode) is ThinkMode.NOTHINK else THINK


# ----------------------------------------------------------------------------- tools block

def _tool_fields(tool: Any) -> tuple[str, str, Any]:
    if isinstance(tool, Mapping):
        try:
            return tool["name"], tool["description"], tool["parameters"]
        except KeyError as exc:
            raise TemplateError(f"tool schema lacks {exc.args[0]!r}: {tool!r}") from None
    try:
        return tool.name, tool.description, tool.schema
    except AttributeError as exc:
        raise TemplateError(f"not a tool (needs name, description, schema): {tool!r}") from exc


def tool_schema_line(tool: Any) -> str:
    """One schema line: json.dumps with ", "/": " separators, non-ASCII literal, keys in given order (§5)."""
    name, description, parameters = _tool_fields(tool)
    return json.dumps(
        {"name": name, "description": description, "parameters": parameters},
        ensure_ascii=False,
        separators=(", ", ": "),
    )


def tools_block(tools: Sequence[Any]) -> str:
    """The exact §5 block for these tools (registry order kept); ends with one LF."""
    return TOOLS_BLOCK_HEAD + "\n".join(tool_schema_line(t) for t in tools) + TOOLS_BLOCK_TAIL


# ----------------------------------------------------------------------------- pieces

def system_prefix_pieces(
    system_text: str,
    *,
    extra_system_text: str = "",
    tools: Sequence[Any] = (),
    think_mode: str | ThinkMode = ThinkMode.THINK,
    ctx: int,
) -> list[Piece]:
    if not system_text:
        raise TemplateError("the system text must not be empty")
    pieces: list[Piece] = [BOS]
    if effective_think_mode(think_mode, ctx) is ThinkMode.THINK_MAX:
        pieces.append(Text(THINK_MAX_PREFIX, trusted=True))
    pieces.append(Text(system_text, trusted=True))
    extra = trim(extra_system_text or "")
    if extra:
        # Extra system text comes from the CLI / AGENTS.md: untrusted, never a special token.
        pieces += [Text("\n\n", trusted=True), Text(extra)]
    if tools:
        # The block's fixed text is ours (trusted); the schema lines are not: a tool from an MCP
        # server brings its own name, description and schema, and a special string in them must
        # stay plain text. ds4agent's own lines hold none, so their ids are the same either way.
        pieces += [
            Text("\n\n" + TOOLS_BLOCK_HEAD, trusted=True),
            Text("\n".join(tool_schema_line(t) for t in tools)),
            Text(TOOLS_BLOCK_TAIL, trusted=True),
        ]
    return pieces


def system_reminder_pieces(
    system_text: str, *, extra_system_text: str = "", tools: Sequence[Any] = ()
) -> list[Piece]:
    """The system prompt again (system text, extra text, tools block; no BOS, no Think-Max prefix,
    which belong to the start only) between the reminder's wrapper lines. It goes in front of a
    unit's <｜User｜> (the `lead` of a user or results turn): right after the previous EOS, so its
    BPE run starts at a special token and the appended ids equal the whole text's tokenisation."""
    body = system_prefix_pieces(system_text, extra_system_text=extra_system_text, tools=tools,
                                think_mode=ThinkMode.THINK, ctx=0)[1:]
    return [Text(SYSTEM_REMINDER_HEAD, trusted=True), *body, Text(SYSTEM_REMINDER_TAIL, trusted=True)]


# The local date and time, given once per session (the model has no clock of its own). It opens the
# FIRST user turn's text, not a system unit of its own: the system prefix stays byte-identical
# from run to run (its KV cache is keyed by that text, prompt.py), and the transcript keeps its
# layout (system prefix, then user turns at their usual positions), which rewind points, snapshot
# budgets, saves and loads all rely on. One line, then a blank line, then the user's message.
SESSION_DATE_HEAD = "Current local date and time: "


def session_date_line(now: datetime) -> str:
    """`Current local date and time: Tuesday 2026-12-01 23:58 UTC+01:00` for an aware datetime."""
    offset = now.strftime("%z")
    zone = f"UTC{offset[:3]}:{offset[3:]}" if offset else "local time"
    return f"{SESSION_DATE_HEAD}{now.strftime('%A %Y-%m-%d %H:%M')} {zone}"


def strip_session_date(text: str) -> str:
    """The user's own message of a turn text that may open with the session date line."""
    if text.startswith(SESSION_DATE_HEAD):
        line, sep, rest = text.partition("\n\n")
        if sep and "\n" not in line:
            return rest
    return text


def user_turn_pieces(text: str | bytes, *, think_mode: str | ThinkMode,
                     lead: Sequence[Piece] = (), date_line: str = "") -> list[Piece]:
    """`lead`: system text placed before the turn's <｜User｜> (system_reminder_pieces);
    `date_line`: session_date_line(), given on the first user turn of a session only."""
    body = trim(text)
    if not body:
        raise EmptyMessageError("empty message (only whitespace) is not submitted")
    if date_line:
        # One Text: the tokens are the tokenisation of the turn's whole text, as a re-render of
        # the decoded transcript (a stripped session's rebuild) produces them.
        head = date_line + "\n\n"
        body = head + body if isinstance(body, str) else head.encode() + body
    return [*lead, USER, Text(body), ASSISTANT, think_token(think_mode)]


_TR_OPEN = b"<tool_result>"
_TR_CLOSE = b"</tool_result>"
_TR_CLOSE_ESC = b"&lt;/tool_result>"


def escape_tool_result(result: str | bytes) -> bytes:
    """§9: inside R every `</tool_result>` becomes `&lt;/tool_result>`; nothing else changes."""
    return as_bytes(result).replace(_TR_CLOSE, _TR_CLOSE_ESC)


def parse_user_part(data: bytes) -> tuple[list[str], str]:
    """The inverse of a user turn's rendering: (tool results, human text) of the turn's bytes. A
    plain message has no results; a results turn may carry queued text after its last block
    (`\n\n` + text). Bytes that are not UTF-8 read as U+FFFD."""
    results: list[str] = []
    pos = 0
    if not data.startswith(_TR_OPEN):
        # The session's first turn opens with the date line (session_date_line): the agent wrote
        # it, so history, rewind and compaction show only what the user typed.
        return [], strip_session_date(data.decode("utf-8", "replace"))
    while data.startswith(_TR_OPEN, pos):
        end = data.find(_TR_CLOSE, pos + len(_TR_OPEN))
        if end < 0:
            break
        body = data[pos + len(_TR_OPEN):end].replace(_TR_CLOSE_ESC, _TR_CLOSE)
        results.append(body.decode("utf-8", "replace"))
        pos = end + len(_TR_CLOSE)
        if data.startswith(b"\n\n", pos):
            pos += 2
    return results, data[pos:].decode("utf-8", "replace")


def tool_results_pieces(
    results: Sequence[str | bytes],
    *,
    queued: str | Sequence[str] = (),
    think_mode: str | ThinkMode,
    lead: Sequence[Piece] = (),
) -> list[Piece]:
    if not results:
        raise TemplateError("a results turn needs at least one result")
    pieces: list[Piece] = [*lead, USER]
    for i, r in enumerate(results):
        # Results are untrusted whatever produced them (the loop's own texts included) and never trimmed.
        pieces += [
            Text(b"\n\n" + _TR_OPEN if i else _TR_OPEN, trusted=True),
            Text(escape_tool_result(r)),
            Text(_TR_CLOSE, trusted=True),
        ]
    q = join_queued(queued)
    if q:
        pieces += [Text("\n\n", trusted=True), Text(q)]
    pieces += [ASSISTANT, think_token(think_mode)]
    return pieces


def compacted_prefix_pieces(
    system_text: str,
    summary: str | bytes,
    *,
    extra_system_text: str = "",
    tools: Sequence[Any] = (),
    think_mode: str | ThinkMode = ThinkMode.THINK,
    ctx: int,
) -> list[Piece]:
    """System prefix + compaction wrapper (trusted) + summary (untrusted, LF added when it lacks one).
    The prefix and the wrapper share a BPE run, so they must be rendered together (not appended)."""
    pieces = system_prefix_pieces(
        system_text, extra_system_text=extra_system_text, tools=tools, think_mode=think_mode, ctx=ctx
    )
    s = as_bytes(summary)
    if not s.endswith(b"\n"):
        s += b"\n"
    pieces += [Text(COMPACTION_HEAD, trusted=True), Text(s), Text(COMPACTION_TAIL, trusted=True)]
    return pieces


# ----------------------------------------------------------------------------- DSML calls

_DSML = "｜DSML｜"  # the full-width bar (U+FF5C) is the protocol's
PARAM_CLOSE = f"</{_DSML}parameter>"
PARAM_CLOSE_ESCAPED = f"&lt;/{_DSML}parameter>"
# Any tolerant close of a parameter (§8): it would end the value early, so it cannot be rendered.
_TOLERANT_PARAM_CLOSE = re.compile(f"</{_DSML}parameter[ \t\r\n]*｜?[ \t\r\n]*>")  # the full-width bar (U+FF5C) is the protocol's


def escape_dsml_value(value: str) -> str:
    if PARAM_CLOSE_ESCAPED in value:
        raise TemplateError(f"value cannot be written in DSML (holds the literal {PARAM_CLOSE_ESCAPED!r})")
    out = value.replace(PARAM_CLOSE, PARAM_CLOSE_ESCAPED)
    if _TOLERANT_PARAM_CLOSE.search(out):
        raise TemplateError("value cannot be written in DSML (holds a closing parameter tag variant)")
    return out


def _check_attr(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or '"' in name or ">" in name:
        raise TemplateError(f"{kind} name cannot be written in DSML: {name!r}")
    return name


def dsml_call_parts(
    calls: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[tuple[str, bool]]:
    """The canonical block as (text, is_structure) parts: structure is trusted in a rendering (so ｜DSML｜
    becomes id 128825), names and values are untrusted. str values are string="true"; anything else is
    JSON with string="false"."""
    parts: list[tuple[str, bool]] = [(f"\n\n<{_DSML}tool_calls>\n", True)]
    for name, args in calls:
        parts += [(f'<{_DSML}invoke name="', True), (_check_attr("tool", name), False), ('">\n', True)]
        for key, value in args.items():
            _check_attr("parameter", key)
            if isinstance(value, str):
                text, flag = escape_dsml_value(value), "true"
            else:
                try:
                    text = escape_dsml_value(json.dumps(value, ensure_ascii=False))
                except (TypeError, ValueError) as exc:
                    raise TemplateError(f"parameter {key!r} is not JSON-serialisable: {exc}") from exc
                flag = "false"
            parts += [
                (f'<{_DSML}parameter name="', True),
                (key, False),
                (f'" string="{flag}">', True),
                (text, False),
                (PARAM_CLOSE + "\n", True),
            ]
        parts.append((f"</{_DSML}invoke>\n", True))
    parts.append((f"</{_DSML}tool_calls>", True))
    return parts


def render_dsml_block(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Canonical DSML block text for [(tool name, {param: value}), ...] (§8); no LF after the close."""
    if not calls:
        raise TemplateError("a DSML block needs at least one call")
    return "".join(t for t, _ in dsml_call_parts(calls))


def assistant_output_pieces(
    *,
    reasoning: str | None = None,
    text: str = "",
    calls: Sequence[tuple[str, Mapping[str, Any]]] = (),
    think_mode: str | ThinkMode,
    eos: bool = True,
) -> list[Piece]:
    """A canonical assistant output after THINK_TOKEN: [reasoning </think>] text [DSML block] [EOS]."""
    pieces: list[Piece] = []
    if ThinkMode(think_mode) is not ThinkMode.NOTHINK:
        pieces += [Text(reasoning or ""), END_THINK]
    elif reasoning:
        raise TemplateError("nothink mode has no reasoning")
    pieces.append(Text(text))
    if calls:
        pieces += [Text(t, trusted=s) for t, s in dsml_call_parts(calls)]
    if eos:
        pieces.append(EOS)
    return pieces


# ----------------------------------------------------------------------------- ids

def _tok(tokenizer: Tokenizer | None) -> Tokenizer:
    return tokenizer or Tokenizer.load()


def render(pieces: Sequence[Piece], tokenizer: Tokenizer | None = None) -> list[int]:
    """The token ids of a rendering (any `*_pieces` function's result): special ids as they are,
    each run of text pieces BPE-encoded as one unit (prompt-and-dsml.md §2). The tokenizer is
    loaded once when none is given."""
    return _tok(tokenizer).encode_pieces(pieces)


def render_assistant_end() -> list[int]:
    """Every assistant turn ends with exactly one EOS (appended by the agent unless the model sampled it)."""
    return [EOS]


# ---------------------------------------------------------------- the inverse: turns read back
# Read from the ids alone (no side tables), so it works the same on a live transcript, a loaded
# session and a resumed journal: every <｜User｜> opens a turn, its <｜Assistant｜> ends the user
# part, and the assistant output runs to the next EOS.


@dataclass(frozen=True)
class Turn:
    """One `<｜User｜>` turn read back from ids: user part, then the assistant output (EOS excluded).

    think_token: THINK or END_THINK (the token right after `<｜Assistant｜>`), or None when missing;
    complete: the assistant output ended with EOS.
    """

    start: int  # index of the <｜User｜> token
    user: tuple[int, ...]
    think_token: int | None
    output: tuple[int, ...]
    complete: bool


def split_turns(ids: Sequence[int], start: int = 0) -> list[Turn]:
    """All user turns of `ids[start:]`, in order."""
    turns: list[Turn] = []
    n = len(ids)
    i = start
    while i < n and ids[i] != USER:
        i += 1
    while i < n:
        begin = i
        j = i + 1
        while j < n and ids[j] not in (ASSISTANT, USER):
            j += 1
        user = tuple(ids[i + 1 : j])
        if j >= n or ids[j] == USER:  # a user part with no assistant (cut or malformed)
            turns.append(Turn(begin, user, None, (), False))
            i = j
            continue
        k = j + 1
        think = ids[k] if k < n and ids[k] in (THINK, END_THINK) else None
        if think is not None:
            k += 1
        m = k
        while m < n and ids[m] != EOS and ids[m] != USER:
            m += 1
        complete = m < n and ids[m] == EOS
        turns.append(Turn(begin, user, think, tuple(ids[k:m]), complete))
        i = m + 1 if complete else m
        while i < n and ids[i] != USER:
            i += 1
    return turns
