"""Session titles and how their bytes are shown (kvc-format.md §12.7, §5.2).

    derive_title(text)      the first user message of a rendered text, whitespace normalised
    normalise_title(raw)    C whitespace trimmed, each run one space (derived and given titles)
    clip_title(title)       cut for a listing without splitting a UTF-8 character
    display_text(data)      bytes for a screen: control characters and bidi overrides shown as U+FFFD

A title's bytes are its identity (the file name hashes them): they are stored as given and only
their display is cleaned.
"""

from __future__ import annotations

import re

from ds4agent import utf8
from ds4agent.textsafe import UNSHOWABLE

LIST_TITLE_BYTES = 70

USER_MARK = "<｜User｜>".encode()
ASSISTANT_MARK = "<｜Assistant｜>".encode()
NO_USER_PROMPT = b"(no user prompt)"
EMPTY_USER_PROMPT = b"(empty user prompt)"
_C_SPACE = b" \t\n\v\f\r"  # C-locale isspace: exactly these six bytes (§12.7)
_C_SPACE_RUN = re.compile(rb"[ \t\n\v\f\r]+")


def derive_title(text: bytes) -> bytes:
    """The session title from rendered text: the first user message, C-whitespace normalised."""
    start = text.find(USER_MARK)
    if start < 0:
        return NO_USER_PROMPT
    start += len(USER_MARK)
    ends = [i for i in (text.find(ASSISTANT_MARK, start), text.find(USER_MARK, start)) if i >= 0]
    body = text[start:min(ends)] if ends else text[start:]
    return normalise_title(body) or EMPTY_USER_PROMPT


def normalise_title(raw: bytes) -> bytes:
    """A title as stored: C whitespace trimmed and each run of it one space (b"" when blank).
    Used for derived titles and for the one the user gives (/save TITLE) alike."""
    return _C_SPACE_RUN.sub(b" ", raw.strip(_C_SPACE))


def clip_title(title: bytes, limit: int = LIST_TITLE_BYTES) -> bytes:
    """Cut a title after `limit` bytes without splitting a UTF-8 character, appending `...`."""
    if len(title) <= limit:
        return title
    return utf8.cut(title, limit) + b"..."


def display_text(data: bytes) -> str:
    """Bytes for display: invalid UTF-8, control characters and bidi overrides become U+FFFD;
    never fails (§5.2). The bytes themselves (a title's identity) are left as they are."""
    text = data.decode("utf-8", errors="replace")
    # LF and tab too: a title is one line (textsafe.UNSHOWABLE is the rule for everything else).
    return "".join("\ufffd" if ord(c) in UNSHOWABLE or c in "\n\t" else c for c in text)
