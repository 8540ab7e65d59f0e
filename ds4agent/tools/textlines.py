"""Lines of a file's bytes and their endings, shared by the file tools (files.py, oldtext.py).

Lines split on LF, CRLF or a lone CR and keep their own terminators. The model sees lines without
them and types new text with LF only; in a CRLF or CR-only file its LFs are written as the file's
own ending, and its old text is matched in that form, so an edit neither inserts LF-only lines nor
doubles a CR.
"""

from __future__ import annotations

import bisect
import re

# Lines in edit context and error candidates are clipped beyond this many characters.
CLIP_CHARS = 2000


_EOL = re.compile(rb"\r\n|\r|\n")


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their own terminators (LF, CRLF or lone CR); a last line may have none."""
    lines: list[bytes] = []
    pos = 0
    for m in _EOL.finditer(data):
        lines.append(data[pos : m.end()])
        pos = m.end()
    if pos < len(data):
        lines.append(data[pos:])
    return lines


def strip_eol(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    if line.endswith((b"\n", b"\r")):
        return line[:-1]
    return line


def line_text(line: bytes) -> str:
    return strip_eol(line).decode("utf-8", errors="replace")


def numbered(lines: list[bytes], first: int, last: int) -> str:
    """`LINENO TEXT\\n` for lines first..last (1-based, inclusive)."""
    return "".join(f"{n} {line_text(lines[n - 1])}\n" for n in range(first, last + 1))


def eol_of(line: bytes) -> bytes:
    """A line's terminator (b"" for a last line without one)."""
    if line.endswith(b"\r\n"):
        return b"\r\n"
    return line[-1:] if line.endswith((b"\n", b"\r")) else b""


def file_eol(lines: list[bytes]) -> bytes:
    """The ending most of the file's lines use (LF for a file without any, or on a tie with LF)."""
    counts = {b"\n": 0, b"\r\n": 0, b"\r": 0}
    for x in lines:
        end = eol_of(x)
        if end:
            counts[end] += 1
    best = max(counts.values())
    return b"\n" if counts[b"\n"] == best else b"\r\n" if counts[b"\r\n"] == best else b"\r"


def region_eol(lines: list[bytes], a: int, b: int) -> bytes:
    """The ending new text takes where it replaces lines a..b (1-based): the one those lines all
    use; else (none of them ends a line: the file's last line) the previous line's; else the
    file's."""
    ends = {eol_of(x) for x in lines[a - 1 : b]} - {b""}
    if len(ends) == 1:
        return ends.pop()
    if not ends and a > 1 and eol_of(lines[a - 2]):
        return eol_of(lines[a - 2])
    return file_eol(lines)


_LONE_LF = re.compile(rb"(?<!\r)\n")


def to_eol(data: bytes, eol: bytes) -> bytes:
    """The LFs of typed text (those not already part of a CRLF) as `eol`."""
    return data if eol == b"\n" else _LONE_LF.sub(eol, data)


def splits_crlf(data: bytes, off: int, n: int) -> bool:
    """A match that starts on the LF of a CRLF or ends on its CR would cut the pair in two."""
    starts_inside = off > 0 and data[off - 1 : off] == b"\r" and data[off : off + 1] == b"\n"
    ends_inside = data[off + n - 1 : off + n] == b"\r" and data[off + n : off + n + 1] == b"\n"
    return starts_inside or ends_inside


def numbered_clipped(lines: list[bytes], nums: list[int], indent: str = "") -> tuple[str, list[tuple[int, bytes]]]:
    """Numbered lines for error/context blocks; a line over CLIP_CHARS is clipped and not recorded
    for the guard (the model did not see all of it)."""
    out: list[str] = []
    seen: list[tuple[int, bytes]] = []
    for n in nums:
        t = line_text(lines[n - 1])
        if len(t) > CLIP_CHARS:
            t = t[:CLIP_CHARS] + f" [... {len(t) - CLIP_CHARS} more chars]"
        else:
            seen.append((n, lines[n - 1]))
        out.append(f"{indent}{n} {t}\n")
    return "".join(out), seen


def line_starts(lines: list[bytes]) -> list[int]:
    starts, pos = [], 0
    for x in lines:
        starts.append(pos)
        pos += len(x)
    return starts


def line_at(starts: list[int], offset: int) -> int:
    """1-based number of the line containing byte `offset`."""
    return bisect.bisect_right(starts, offset)
