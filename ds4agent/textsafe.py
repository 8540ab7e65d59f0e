"""Which characters may reach a terminal, and how the others are shown: the one rule for job
output (tools), session titles (sessions) and everything the plain and headless UIs write (ui).

A leaf module on the ground floor (standard library only), so every room can share the rule.

    UNSHOWABLE                  the code points never written to a terminal as they are: C0 controls
                                but LF and tab, DEL, the C1 controls (a terminal acts on 0x9B as CSI),
                                and the bidi marks, embeddings, overrides and isolates (they make a
                                line read other than it is: "‮gnp.exe" shows as "exe.png")
    escape_controls(text)       each one as an ASCII escape, `\\x1b`, `\\u202e`: readable by the model
                                and by a person, and what a job's output becomes before anyone sees it
    terminal_safe(text)         each one as a visible glyph: C0 as its Control Picture (ESC is ␛), DEL
                                as ␡, C1 and bidi as U+FFFD; for text a UI writes to a terminal
"""

from __future__ import annotations

import re

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
UNSHOWABLE = frozenset([*(c for c in range(0x20) if c not in (0x09, 0x0A)), *range(0x7F, 0xA0), *_BIDI])

_PATTERN = re.compile("[" + "".join(re.escape(chr(c)) for c in sorted(UNSHOWABLE)) + "]")
_GLYPHS = {c: 0x2400 + c if c < 0x20 else 0x2421 if c == 0x7F else 0xFFFD for c in UNSHOWABLE}


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_controls(text: str) -> str:
    """`text` with every UNSHOWABLE character written as its escape (a CR before LF is dropped: a
    Windows line end is a line end, a lone CR overwriting the line is shown as `\\x0d`)."""
    return _PATTERN.sub(_escape, text.replace("\r\n", "\n"))


def terminal_safe(text: str) -> str:
    """`text` with every UNSHOWABLE character shown as a glyph instead of acted on."""
    return text.translate(_GLYPHS)
