"""Streaming DSML parser and greedy-sampling classifier (prompt-and-dsml.md §8, §11, §12).

One `DsmlParser` per round. The agent feeds every sampled token (its id and text bytes) and gets back a
list of small frozen events; between tokens it reads `parser.in_syntax` (sample greedily) and
`parser.stop` (the block closed or failed: stop generating, append EOS). At the end of the round it calls
`finish()` and reads `parser.outcome`.

    p = DsmlParser(thinking=True)            # think / think-max rounds start inside thinking
    events = p.feed(token_id, token_bytes)   # token_bytes defaults to Tokenizer.token_bytes(token_id)
    p.in_syntax, p.in_payload, p.state       # §12 classification of the text so far
    p.stop                                   # DONE or ERROR reached: sample nothing more
    events = p.finish()                      # flush held-back bytes (call once, however the round ended)
    p.outcome                                # RoundOutcome: calls to run, or the single error result
    p.raw_block, p.block_open, p.in_thinking, p.thinking_violation

Design notes (why it looks like this):
* Ids drive the thinking gate (only token 128822 leaves thinking, and only once); bytes drive markers and
  blocks. A block starts only where the `｜DSML｜` of its first tag was sampled as the special token
  128825: DSML the model quotes as plain text (ordinary tokens: an explanation, a file it repeats) is
  text and never runs, so the two typo markers, which hold no whole `｜DSML｜`, are text too.
  `special_tokens_only=False` drops that rule (bytes fed without ids: the byte grammar's tests).
* Outside a block, bytes that could still grow into a start marker are held back (never shown), but the
  held tail is at most one marker long, so nothing is rescanned: each token costs O(token + marker).
* Inside a block the parser is a byte state machine: between items / inside a tag / inside a value.
  Values keep one pending close candidate and a search position, so a token is scanned once.
* Events carry decoded text (UTF-8 with U+FFFD for invalid sequences, decoded incrementally, so a
  character split across tokens is shown once whole).
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ds4agent import utf8
from ds4agent.protocol.dsml_events import (  # re-exported: the parser's vocabulary
    INCOMPLETE_REASON,
    SYNTAX_REMINDER,
    THINKING_ERROR_REASON,
    THINKING_NOTE,
    UNTERMINATED_NOTE,
    BlockDone,
    BlockError,
    BlockStart,
    Event,
    InvokeEnd,
    InvokeStart,
    Param,
    ParamDelta,
    ParamEnd,
    ParamStart,
    RoundOutcome,
    TextPart,
    ThinkingEnd,
    ThinkingPart,
    ThinkingViolation,
    ToolCall,
    error_result,
    syntax_error_result,
)
from ds4agent.protocol.tokenizer import DSML, END_THINK, EOS, Tokenizer

__all__ = [
    "BARE_INVOKE", "INCOMPLETE_REASON", "ITEM_CUT", "ITEM_FOREIGN_LIMIT", "ITEM_LIMIT", "MARKER_CANONICAL",
    "START_MARKERS", "SYNTAX_REMINDER", "THINKING_ERROR_REASON", "THINKING_NOTE", "UNTERMINATED_NOTE",
    "BlockDone", "BlockError", "BlockStart", "DsmlParseError", "DsmlParser", "Event", "GreedyState",
    "InvokeEnd", "InvokeStart", "Param", "ParamDelta", "ParamEnd", "ParamStart", "RoundOutcome", "TextPart",
    "ThinkingPart", "ThinkingEnd", "ThinkingViolation", "ToolCall", "error_result", "syntax_error_result",
]

# ----------------------------------------------------------------------------- constants

_BAR = "｜".encode()  # U+FF5C, 3 bytes EF BD 9C
MARKER_CANONICAL = b"<" + _BAR + b"DSML" + _BAR + b"tool_calls>"
# The spec (prompt-and-dsml.md §11.2) also opens a block at the two typo markers below. They hold no
# whole ｜DSML｜, so they can never carry the special token that makes a block real (module docstring):
# they stay listed, and always read as text. The boundary wins over the spec here on purpose: a block
# the model did not mark with the special token would be text it quoted, and quoted text must not run.
START_MARKERS = (
    MARKER_CANONICAL,
    b"<DSML" + _BAR + b"tool_calls>",  # first bar missing (a typo the model makes)
    b"<|DSML|tool_calls>",  # ASCII bars
)
_OPEN = b"<" + _BAR + b"DSML" + _BAR  # "<｜DSML｜"
_CLOSE = b"</" + _BAR + b"DSML" + _BAR  # "</｜DSML｜"
# An invoke without the tool_calls block around it still counts: a one-invoke block.
BARE_INVOKE = _OPEN + b"invoke"
# Outside a block, the start of any other DSML tag is stray DSML: a tool error, not text.
_STRAY = (_OPEN, _CLOSE)
_MAX_MARKER = max(len(m) for m in (*START_MARKERS, BARE_INVOKE, *_STRAY))
_PARAM_CLOSE_HEAD = _CLOSE + b"parameter"
_PARAM_CLOSE_ESCAPED = b"&lt;" + _PARAM_CLOSE_HEAD[1:] + b">"
_PARAM_CLOSE = _PARAM_CLOSE_HEAD + b">"
# Inside thinking these mark the round failed (§11.3).
_THINKING_TRIGGERS = (_BAR + b"DSML" + _BAR, b"|DSML|", START_MARKERS[1])
_THINK_TAIL = max(len(t) for t in _THINKING_TRIGGERS) - 1
_W = b" \t\r\n"
_NAME_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

ITEM_CUT = 80  # an ERROR shows at most this many bytes of the offending item
ITEM_FOREIGN_LIMIT = 80  # an item that cannot be a DSML tag is reported after this many bytes
ITEM_LIMIT = 256  # any item without '>' is reported after this many bytes


class GreedyState(Enum):
    """§12 sampling classes. STRUCTURAL and JSON_STRUCTURAL sample with argmax."""

    OUTSIDE = "outside"
    STRUCTURAL = "structural"
    STRING_BODY = "string_body"
    JSON_STRUCTURAL = "json_structural"
    JSON_STRING = "json_string"


_GREEDY = frozenset((GreedyState.STRUCTURAL, GreedyState.JSON_STRUCTURAL))
_PAYLOAD = frozenset((GreedyState.STRING_BODY, GreedyState.JSON_STRING, GreedyState.JSON_STRUCTURAL))



class DsmlParseError(Exception):
    """Misuse of the parser API (feeding after finish); malformed DSML is an event, never an exception."""


# ----------------------------------------------------------------------------- helpers

def _cut_item(item: bytes) -> str:
    """ITEM for an error message: up to and including the first '>', at most 80 bytes, not splitting a
    UTF-8 character (the cut moves back at most 3 bytes while the first byte cut off is a continuation)."""
    gt = item.find(b">")
    if gt >= 0:
        item = item[: gt + 1]
    return utf8.cut(item, ITEM_CUT).decode("utf-8", "replace")


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _parse_attrs(body: bytes) -> dict[bytes, bytes]:
    """Attributes of an open tag body (the bytes after NAME, '>' excluded): KEY="VALUE" preceded by a W byte,
    KEY directly followed by '="', VALUE up to the next '"'; first occurrence of a key wins."""
    attrs: dict[bytes, bytes] = {}
    n = len(body)
    i = 0
    while i < n:
        if body[i] not in _W:
            i += 1
            continue
        # a W byte: a key may start right after it
        k = i + 1
        j = k
        while j < n and body[j] not in _W and body[j] not in b'="\'':
            j += 1
        if j > k and body.startswith(b'="', j):
            end = body.find(b'"', j + 2)
            if end < 0:
                break  # unterminated value: not an attribute, and nothing after it can be one
            attrs.setdefault(body[k:j], body[j + 2:end])
            i = end + 1
        else:
            i = k if j == k else j
    return attrs


def _json_scan(buf: bytes | bytearray, pos: int, in_str: bool, esc: bool) -> tuple[bool, bool]:
    """Advance the JSON string-literal tracker of §12 over buf[pos:]."""
    n = len(buf)
    while pos < n:
        if esc:
            esc = False
            pos += 1
            continue
        if in_str:
            q = buf.find(b'"', pos)
            b = buf.find(b"\\", pos)
            if q < 0 and b < 0:
                return True, False
            if b >= 0 and (q < 0 or b < q):
                esc = True
                pos = b + 1
            else:
                in_str = False
                pos = q + 1
        else:
            q = buf.find(b'"', pos)
            if q < 0:
                return False, False
            in_str = True
            pos = q + 1
    return in_str, esc


# Close-candidate match results
_PARTIAL = -1
_FAIL = -2


def _match_param_close(buf: bytes | bytearray, at: int) -> int:
    """Match `</｜DSML｜parameter` W [｜] W `>` at buf[at:]: end offset when complete, _PARTIAL when the buffer
    ends inside a possible close, _FAIL when it cannot be one."""
    n = len(buf)
    head = _PARAM_CLOSE_HEAD
    m = min(n - at, len(head))
    if buf[at:at + m] != head[:m]:
        return _FAIL
    if m < len(head):
        return _PARTIAL
    j = at + len(head)
    while j < n and buf[j] in _W:
        j += 1
    if j == n:
        return _PARTIAL
    if buf[j] == 0xEF:  # maybe the optional full-width bar
        k = min(n - j, 3)
        if buf[j:j + k] == _BAR[:k]:
            if k < 3:
                return _PARTIAL
            j += 3
            while j < n and buf[j] in _W:
                j += 1
            if j == n:
                return _PARTIAL
    return j + 1 if buf[j] == 0x3E else _FAIL


# ----------------------------------------------------------------------------- the parser

# block sub-states
_BETWEEN = 0
_TAG = 1
_VALUE = 2


@dataclass
class _Value:
    invoke: int
    name: str
    is_json: bool
    buf: bytearray = field(default_factory=bytearray)
    cand: int = -1  # start of a pending (incomplete) close candidate at the end of buf, or -1
    search: int = 0  # where to look for the next "</"
    shown: int = 0  # bytes of buf already emitted as ParamDelta
    json_pos: int = 0
    json_in_str: bool = False
    json_esc: bool = False
    decoder: Any = None


class DsmlParser:
    """Streaming parser for one round. See the module docstring."""

    def __init__(self, *, thinking: bool, tokenizer: Tokenizer | None = None, special_tokens_only: bool = True):
        self._tok = tokenizer
        self._tokens_only = special_tokens_only
        self._text_end = 0  # bytes fed as visible text so far (outside thinking, before a block)
        self._dsml_at: set[int] = set()  # where among them the DSML token's bytes begin
        self.in_thinking = thinking
        self.thinking_violation = False
        self._think_tail = b""
        self._held = b""  # outside thinking, before a block: bytes that may grow into a start marker
        self._text_dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._think_dec = codecs.getincrementaldecoder("utf-8")("replace")
        # block state
        self.block_open = False
        self._sub = _BETWEEN
        self._item = bytearray()
        self._in_invoke = False
        self._bare = False  # the block began with a bare invoke (no tool_calls tag around it)
        self._invoke_name = ""
        self._invoke_params: list[Param] = []
        self._calls: list[ToolCall] = []
        self._n_invokes = 0  # invokes opened so far
        self._value: _Value | None = None
        self._raw = bytearray()  # the block's sampled bytes (for the error stanza)
        self._result: str | None = None  # "done" | "error"
        self._error: str | None = None
        self._finished = False

    # ------------------------------------------------------------------ public state
    @property
    def stop(self) -> bool:
        """The block closed (DONE) or failed (ERROR): sample nothing more this round."""
        return self._result is not None

    @property
    def state(self) -> GreedyState:
        if not self.block_open or self._result is not None:
            return GreedyState.OUTSIDE
        if self._sub != _VALUE:
            return GreedyState.STRUCTURAL
        v = self._value
        assert v is not None
        if v.cand >= 0:
            return GreedyState.STRUCTURAL
        if not v.is_json:
            return GreedyState.STRING_BODY
        if v.json_pos < len(v.buf):
            v.json_in_str, v.json_esc = _json_scan(v.buf, v.json_pos, v.json_in_str, v.json_esc)
            v.json_pos = len(v.buf)
        return GreedyState.JSON_STRING if v.json_in_str else GreedyState.JSON_STRUCTURAL

    @property
    def in_syntax(self) -> bool:
        """Sample the next token greedily (§12: STRUCTURAL or JSON_STRUCTURAL)."""
        return self.state in _GREEDY

    @property
    def in_payload(self) -> bool:
        """Inside a parameter value (string or JSON), not at a closing tag."""
        return self.state in _PAYLOAD

    @property
    def raw_block(self) -> bytes:
        """The open/closed block's bytes so far (canonical marker + sampled bytes), for display."""
        return bytes(self._raw)

    @property
    def outcome(self) -> RoundOutcome:
        if self._result == "done":
            return RoundOutcome("done", tuple(self._calls), None, self.thinking_violation)
        if self._result == "error":
            return RoundOutcome("error", (), self._error, self.thinking_violation)
        if self.block_open:
            return RoundOutcome("unterminated", (), None, self.thinking_violation)
        return RoundOutcome("none", (), None, self.thinking_violation)

    # ------------------------------------------------------------------ feeding
    def feed(self, token_id: int | None, data: bytes | None = None) -> list[Event]:
        """Feed one sampled token. `data` defaults to the token's text bytes; with token_id None, `data` is
        treated as ordinary text bytes (tests, replays). EOS and stop tokens end the round: they produce no
        event here; call finish(). Feeding after DONE/ERROR returns no events (those bytes are unparsed)."""
        if self._finished:
            raise DsmlParseError("feed() after finish()")
        if self._result is not None:
            return []
        if token_id is not None:
            if token_id == END_THINK and self.in_thinking:
                self.in_thinking = False
                out: list[Event] = []
                tail = self._think_dec.decode(b"", True)
                if tail:
                    out.append(ThinkingPart(tail))
                out.append(ThinkingEnd())
                return out
            if token_id == EOS or Tokenizer.is_stop(token_id):
                return []
            if data is None:
                if token_id == DSML:
                    data = _BAR + b"DSML" + _BAR
                else:
                    if self._tok is None:
                        self._tok = Tokenizer.load()
                    data = self._tok.token_bytes(token_id)
        elif data is None:
            raise DsmlParseError("feed() needs a token id or bytes")
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if not data:
            return []
        out = []
        if self.in_thinking:
            self._feed_thinking(data, out)
        elif self.block_open:
            self._raw += data
            self._feed_block(data, out)
        else:
            base = self._text_end - len(self._held)
            if token_id == DSML:
                self._dsml_at.add(self._text_end)
            self._text_end += len(data)
            self._feed_text(data, out, base)
        return out

    def finish(self) -> list[Event]:
        """End of the round (EOS, stop token, cap, interrupt, DONE or ERROR): flush held-back text."""
        if self._finished:
            return []
        self._finished = True
        out: list[Event] = []
        if self.in_thinking:
            t = self._think_dec.decode(b"", True)
            if t:
                out.append(ThinkingPart(t))
        elif not self.block_open:
            t = self._text_dec.decode(self._held, True)
            self._held = b""
            if t:
                out.append(TextPart(t))
        return out

    # ------------------------------------------------------------------ thinking
    def _feed_thinking(self, data: bytes, out: list[Event]) -> None:
        if not self.thinking_violation:
            window = self._think_tail + data
            if b"DSML" in window and any(t in window for t in _THINKING_TRIGGERS):
                self.thinking_violation = True
                out.append(ThinkingViolation())
            self._think_tail = window[-_THINK_TAIL:]
        t = self._think_dec.decode(data)
        if t:
            out.append(ThinkingPart(t))

    # ------------------------------------------------------------------ visible text and start markers
    def _tag_at(self, base: int, i: int, tag: bytes) -> bool:
        """Whether `tag` found at buf[i] counts: its `｜DSML｜` was the special token (see the module
        docstring); every spelling counts with special_tokens_only=False."""
        if not self._tokens_only:
            return True
        bar = tag.find(_BAR + b"DSML" + _BAR)
        return bar >= 0 and base + i + bar in self._dsml_at

    def _find_tag(self, buf: bytes, base: int, tag: bytes, end: int | None = None) -> int:
        """The first position of `tag` in buf[:end] that counts (_tag_at), else -1."""
        i = buf.find(tag, 0, end)
        while i >= 0 and not self._tag_at(base, i, tag):
            i = buf.find(tag, i + 1, end)
        return i

    def _feed_text(self, data: bytes, out: list[Event], base: int) -> None:
        buf = self._held + data if self._held else data
        if b"<" not in buf:  # fast path: no marker can start here
            self._held = b""
            t = self._text_dec.decode(buf)
            if t:
                out.append(TextPart(t))
            return
        best = -1
        marker = b""
        for m in START_MARKERS:
            i = self._find_tag(buf, base, m)
            if i >= 0 and (best < 0 or i < best):
                best, marker = i, m
        stray = self._find_stray(buf, best, base)
        if stray is not None:
            at, bare = stray
            t = self._text_dec.decode(buf[:at], True)
            if t:
                out.append(TextPart(t))
            self._held = b""
            self.block_open = True
            rest = buf[at:]
            self._raw += rest
            # Parsed as a one-invoke block (any other tag then fails naming the whole tag).
            self._bare = True
            if bare:
                out.append(BlockStart(BARE_INVOKE))
            self._feed_block(rest, out)
            return
        if best >= 0:
            self._held = b""
            t = self._text_dec.decode(buf[:best], True)
            if t:
                out.append(TextPart(t))
            self.block_open = True
            self._sub = _BETWEEN
            out.append(BlockStart(marker))
            rest = buf[best + len(marker):]
            # The block is parsed as if the canonical marker had been sampled (§11.2).
            self._raw += MARKER_CANONICAL
            if rest:
                self._raw += rest
                self._feed_block(rest, out)
            return
        # Hold back the longest suffix that is a proper prefix of a marker.
        hold = 0
        start = max(0, len(buf) - _MAX_MARKER + 1)
        i = buf.find(b"<", start)
        while i >= 0:
            tail = buf[i:]
            if any(m.startswith(tail) for m in (*START_MARKERS, BARE_INVOKE, *_STRAY)):
                hold = len(tail)
                break
            i = buf.find(b"<", i + 1)
        emit = buf[: len(buf) - hold]
        self._held = buf[len(buf) - hold:] if hold else b""
        t = self._text_dec.decode(emit)
        if t:
            out.append(TextPart(t))

    def _find_stray(self, buf: bytes, before: int, base: int) -> tuple[int, bool] | None:
        """(position, is a bare invoke) of the first DSML tag before a start marker at `before`
        (-1: none); None when there is none, or it may still grow into a start marker."""
        limit = len(buf) if before < 0 else before
        found = -1
        for tag in _STRAY:
            i = self._find_tag(buf, base, tag, limit + len(tag) - 1)
            if i >= 0 and i < limit and (found < 0 or i < found):
                found = i
        rest = buf[found:] if found >= 0 else b""
        if not rest:
            return None
        if rest.startswith(BARE_INVOKE):
            return found, True
        if any(m.startswith(rest) for m in (MARKER_CANONICAL, BARE_INVOKE)):
            return None  # e.g. "<｜DSML｜too": wait for the rest of the tag
        return found, False

    # ------------------------------------------------------------------ the block
    def _feed_block(self, data: bytes, out: list[Event]) -> None:
        pos = 0
        n = len(data)
        while pos < n and self._result is None:
            if self._sub == _VALUE:
                pos = self._feed_value(data, pos, out)
            elif self._sub == _TAG:
                pos = self._feed_tag(data, pos, out)
            else:
                while pos < n and data[pos] in _W:
                    pos += 1
                if pos < n:
                    self._sub = _TAG
                    self._item.clear()

    def _fail(self, reason: str, out: list[Event]) -> None:
        self._result = "error"
        self._error = reason
        out.append(BlockError(reason, _decode(bytes(self._raw))))

    def _feed_tag(self, data: bytes, pos: int, out: list[Event]) -> int:
        gt = data.find(b">", pos)
        end = len(data) if gt < 0 else gt + 1
        item = self._item
        item += data[pos:end]
        if gt < 0:
            if len(item) >= ITEM_LIMIT or (
                len(item) >= ITEM_FOREIGN_LIMIT
                and not _OPEN.startswith(item[: len(_OPEN)])
                and not _CLOSE.startswith(item[: len(_CLOSE)])
            ):
                self._fail(f"unexpected DSML tag: {_cut_item(bytes(item))}", out)
            return end
        if len(item) > ITEM_LIMIT:  # the '>' came after the 256-byte limit
            self._fail(f"unexpected DSML tag: {_cut_item(bytes(item))}", out)
            return end
        self._sub = _BETWEEN
        tag = bytes(item)
        self._on_item(tag, out, data[end:])
        return end

    def _on_item(self, tag: bytes, out: list[Event], after: bytes) -> None:
        kind, name, body = _classify(tag)
        unexpected = f"unexpected DSML tag: {_cut_item(tag)}"
        if kind == "close" and name == b"tool_calls":
            if self._in_invoke:
                self._end_invoke(out)
            if not self._calls:
                self._fail("empty tool call block", out)
                return
            self._result = "done"
            out.append(BlockDone(tuple(self._calls), after))
            return
        if not self._in_invoke:
            if kind == "open" and name == b"invoke":
                attrs = _parse_attrs(body)
                tool = attrs.get(b"name")
                if not tool:
                    self._fail("tool invoke without name", out)
                    return
                self._in_invoke = True
                self._invoke_name = _decode(tool)
                self._invoke_params = []
                out.append(InvokeStart(self._n_invokes, self._invoke_name))
                self._n_invokes += 1
                return
            self._fail(unexpected, out)
            return
        if kind == "open" and name == b"parameter":
            attrs = _parse_attrs(body)
            pname = attrs.get(b"name")
            if not pname:
                self._fail("tool parameter without name", out)
                return
            is_json = attrs.get(b"string") == b"false"
            v = _Value(self._n_invokes - 1, _decode(pname), is_json)
            v.decoder = codecs.getincrementaldecoder("utf-8")("replace")
            self._value = v
            self._sub = _VALUE
            out.append(ParamStart(v.invoke, v.name, is_json))
            return
        if kind == "close" and name == b"invoke":
            self._end_invoke(out)
            if self._bare:
                # A bare invoke is a block of its one call: done at its close.
                self._result = "done"
                out.append(BlockDone(tuple(self._calls), after))
            return
        self._fail(unexpected, out)

    def _end_invoke(self, out: list[Event]) -> None:
        call = ToolCall(self._n_invokes - 1, self._invoke_name, tuple(self._invoke_params))
        self._calls.append(call)
        self._in_invoke = False
        out.append(InvokeEnd(call))

    def _feed_value(self, data: bytes, pos: int, out: list[Event]) -> int:
        v = self._value
        assert v is not None
        base = len(v.buf)
        v.buf += data[pos:]
        buf = v.buf
        close_end = -1
        while True:
            if v.cand < 0:
                i = buf.find(b"</", v.search)
                if i < 0:
                    # a final "<" may still start a close
                    v.search = len(buf) - 1 if buf.endswith(b"<") else len(buf)
                    break
                v.cand = i
            r = _match_param_close(buf, v.cand)
            if r >= 0:
                close_end = r
                break
            if r == _PARTIAL:
                break
            v.search = v.cand + 1
            v.cand = -1
        if close_end < 0:
            # show what cannot be part of a close
            limit = v.cand if v.cand >= 0 else v.search
            if limit > v.shown:
                t = v.decoder.decode(bytes(buf[v.shown:limit]))
                v.shown = limit
                if t:
                    out.append(ParamDelta(v.invoke, v.name, t))
            return len(data)
        start = v.cand
        if start > v.shown:
            t = v.decoder.decode(bytes(buf[v.shown:start]), True)
            if t:
                out.append(ParamDelta(v.invoke, v.name, t))
        self._end_value(bytes(buf[:start]), out)
        # bytes of this token after the close continue the block
        return pos + (close_end - base)

    def _end_value(self, raw: bytes, out: list[Event]) -> None:
        v = self._value
        assert v is not None
        raw = raw.replace(_PARAM_CLOSE_ESCAPED, _PARAM_CLOSE)
        text = _decode(raw)
        value: Any = text
        err = None
        if v.is_json:
            try:
                value = json.loads(text)
            except ValueError as exc:
                err = f"parameter {v.name!r}: invalid JSON ({exc}); passed on as text"
                value = text
        p = Param(v.name, value, text, v.is_json, err)
        self._invoke_params.append(p)
        self._value = None
        self._sub = _BETWEEN
        out.append(ParamEnd(v.invoke, p))


def _classify(tag: bytes) -> tuple[str, bytes, bytes]:
    """('open'|'close'|'other', NAME, body after NAME without '>') for a complete item ending in '>'."""
    if tag.startswith(_OPEN):
        i = len(_OPEN)
        j = i
        while j < len(tag) and tag[j] in _NAME_CHARS:
            j += 1
        # NAME must be followed by a W byte or '>' (so `<｜DSML｜invokes>` is not an invoke)
        if j > i and (tag[j] in _W or tag[j] == 0x3E):
            return "open", tag[i:j], tag[j:-1]
        return "other", b"", b""
    if tag.startswith(_CLOSE):
        i = len(_CLOSE)
        j = i
        while j < len(tag) and tag[j] in _NAME_CHARS:
            j += 1
        if j == i:
            return "other", b"", b""
        k = j
        while tag[k] in _W:
            k += 1
        if tag.startswith(_BAR, k):
            k += 3
            while tag[k] in _W:
                k += 1
        if k == len(tag) - 1:  # only '>' left
            return "close", tag[i:j], b""
        return "other", b"", b""
    return "other", b"", b""
