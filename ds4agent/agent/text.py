"""Small text rules shared by the agent (prompt-and-dsml.md §3, kvc-format.md §12.7)."""

from __future__ import annotations

# C-locale isspace: exactly these six characters (U+00A0, U+3000 and other Unicode spaces are
# kept), so str.strip() with no argument would be wrong here.
C_SPACE = " \t\n\v\f\r"


def trim(text: str) -> str:
    """Trim user / queued / extra-system text: leading and trailing C-locale whitespace only."""
    return text.strip(C_SPACE)
