"""Replaying past turns for display (/history, and after /load): read back from the token ids.

The transcript holds everything: a human turn's text, a results turn's `<tool_result>` blocks (and
text queued into it), and each assistant output, which is fed through the same stream parser as
live generation so thinking, answer text and tool calls come back as they were shown (never
executed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ds4agent.agent import events as ev
from ds4agent.agent.stream import AssistantStream
from ds4agent.protocol.template import SESSION_DATE_HEAD, Turn, parse_user_part, split_turns
from ds4agent.sessions.titles import USER_MARK, derive_title

if TYPE_CHECKING:
    from ds4agent.protocol.tokenizer import Tokenizer

def session_title(text: bytes) -> bytes:
    """The title derived from a rendered transcript (titles.derive_title), without the date line
    the agent put in front of the first user message: a title says what the user asked."""
    start = text.find(USER_MARK)
    if start >= 0:
        body = start + len(USER_MARK)
        if text.startswith(SESSION_DATE_HEAD.encode(), body):
            end = text.find(b"\n\n", body)
            if end >= 0 and b"\n" not in text[body:end]:
                text = text[:body] + text[end + 2:]
    return derive_title(text)


def is_human(tok: Tokenizer, turn: Turn) -> bool:
    data = tok.decode_bytes(turn.user)
    results, text = parse_user_part(data)
    return not results or bool(text)


def turn_items(tok: Tokenizer, turn: Turn) -> list[ev.HistoryItem]:
    items: list[ev.HistoryItem] = []
    results, text = parse_user_part(tok.decode_bytes(turn.user))
    for r in results:
        items.append(ev.HistoryItem("tool_result", text=r))
    if text:
        items.append(ev.HistoryItem("user", text=text))
    if turn.think_token is None:
        return items
    stream = AssistantStream(tok, thinking=turn.think_token == tok.THINK)
    thinking: list[str] = []
    answer: list[str] = []

    def flush() -> None:
        if thinking:
            items.append(ev.HistoryItem("thinking", text="".join(thinking)))
            thinking.clear()
        if answer:
            items.append(ev.HistoryItem("text", text="".join(answer)))
            answer.clear()

    def take(e: ev.Event) -> None:
        if isinstance(e, ev.ThinkingDelta):
            thinking.append(e.text)
        elif isinstance(e, ev.TextDelta):
            if thinking:
                flush()
            answer.append(e.text)
        elif isinstance(e, ev.ToolCallEnd):
            flush()
            items.append(ev.HistoryItem("tool_call", name=e.name, args=dict(e.args)))
        elif isinstance(e, ev.ToolCallInvalid):
            flush()
            items.append(ev.HistoryItem("note", text=f"[invalid tool call: {e.reason}]"
                                        if e.kind == "error" else f"[{e.reason}]"))

    for t in turn.output:
        for e in stream.feed(t, tok.token_bytes(t)):
            take(e)
        if stream.closed:
            break
    for e in stream.finish():
        take(e)
    flush()
    return items


def last_turns(tok: Tokenizer, ids: Sequence[int], system_len: int, n: int) -> list[ev.HistoryItem]:
    """Items of the last `n` human turns and everything after them (tool rounds included)."""
    turns = split_turns(ids, system_len)
    starts = [i for i, t in enumerate(turns) if is_human(tok, t)]
    if not starts:
        return []
    first = starts[-n] if len(starts) >= n else starts[0]
    items: list[ev.HistoryItem] = []
    for t in turns[first:]:
        items.extend(turn_items(tok, t))
    return items
