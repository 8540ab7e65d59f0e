"""Code that reads as code: the bodies of write/edit cards syntax-highlighted.

Answers need nothing here: Textual's Markdown highlights fenced blocks by their language already.
A write/edit card's body is diff lines (`+code`, `-code`, or numbered `+ 12  code`); each keeps
its sign and number in the diff colour, and its code gets the highlighter's styles for the
language the file's extension names (Pygments, through textual.highlight). The code of all the
lines is highlighted as one text, so a string or comment running over several lines is coloured
as one. A file type Pygments does not know, or lines whose count the highlighter changed, fall
back to the plain diff colours.
"""

from __future__ import annotations

import re

from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound
from textual.content import Content
from textual.highlight import highlight

from ds4agent.ui import toolview

CODE_STYLES = frozenset((toolview.ADD, toolview.DEL, toolview.CONTEXT))
_NUMBERED = re.compile(r"([+\- ] +\d*  )(.*)", re.S)
_SIGNED = re.compile(r"([+\- ])(.*)", re.S)


def language_for(path: str | None) -> str | None:
    """The Pygments language of a file name, or None when there is none to highlight."""
    if not path:
        return None
    try:
        lexer = get_lexer_for_filename(path)
    except ClassNotFound:
        return None
    return lexer.aliases[0] if lexer.aliases else None


def code_body(lines: list[tuple[str, str]], path: str | None,
              line_style: dict[str, str]) -> list[Content] | None:
    """One Content per body line (prefix in the line's diff colour, code highlighted), or None
    when the lines are not code of a known language (the caller draws them plainly)."""
    language = language_for(path)
    code_lines = [text for style, text in lines if style in CODE_STYLES]
    if language is None or not code_lines:
        return None
    pattern = _NUMBERED if all(_NUMBERED.fullmatch(t) for t in code_lines) else _SIGNED
    parts: list[tuple[str, str] | None] = []
    for style, text in lines:
        m = pattern.fullmatch(text) if style in CODE_STYLES else None
        parts.append((m.group(1), m.group(2)) if m else None)
    codes = [p[1] for p in parts if p is not None]
    if any(("\r" in c or "\x0b" in c or "\x0c" in c) for c in codes):
        return None  # the highlighter splits lines on these too: the rows would not line up
    painted = highlight("\n".join(codes), language=language).split("\n", allow_blank=True)
    if len(painted) < len(codes):
        return None
    out: list[Content] = []
    k = 0
    for (style, text), part in zip(lines, parts, strict=True):
        colour = line_style.get(style, "")
        if part is None:
            out.append(Content.styled(text, colour))
            continue
        out.append(Content.styled(part[0], colour) + painted[k])
        k += 1
    return out
