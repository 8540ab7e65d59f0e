"""Cutting UTF-8 bytes without splitting a character: the one rule every byte cap uses.

kvc-format.md §12.7 (title clipping) and prompt-and-dsml.md §11.4 (DSML error items) state it, and
the other caps follow it so that a cut looks the same everywhere: cut after `limit` bytes, then move
the cut back, by at most 3 bytes (a UTF-8 character has at most 3 continuation bytes), while the
first byte cut off is a continuation byte (0x80-0xBF). Bytes that are not UTF-8 are cut like any
others; nothing is decoded here.

Ground floor, like fsutil: standard library only, so every room may use it.
"""

from __future__ import annotations


def cut(data: bytes, limit: int) -> bytes:
    """`data` itself when it is at most `limit` bytes long, else its first `limit` bytes or up to 3
    fewer, so that the cut does not fall inside a character."""
    if len(data) <= limit:
        return data
    end = limit
    while end > limit - 3 and end > 0 and 0x80 <= data[end] <= 0xBF:
        end -= 1
    return data[:end]
