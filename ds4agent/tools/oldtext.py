"""What an edit's `old` selects (select_old), the guard on it, and the search for close candidates.

old matches exactly once, or is written HEAD[upto]TAIL; the selected span must lie in lines the
model has seen since they last changed (SeenLines). upto_ready says when the streamed start of
old already picks its place (the agent then writes [upto] itself: agent/edit_assist.py).
"""

from __future__ import annotations

import bisect
import difflib
import heapq
import re
from collections import Counter
from collections.abc import Callable

from ds4agent.tools.context import ToolContext
from ds4agent.tools.results import ToolError
from ds4agent.tools.textlines import (
    file_eol,
    line_at,
    line_starts,
    line_text,
    numbered_clipped,
    split_lines,
    splits_crlf,
    to_eol,
)


def guard(ctx: ToolContext, key: str, path: str, lines: list[bytes], a: int, b: int) -> None:
    """Lines a..b must all have been shown to the model since they last changed."""
    rec = ctx.seen.get(key) or {}
    for n in range(a, b + 1):
        crc = rec.get(n)
        if crc is None:
            raise ToolError(
                f"old covers line {n} of {path}, which was not shown recently or moved after an edit; "
                f"read lines {a}-{b} again before editing"
            )
        if crc != ctx.seen.crc(lines[n - 1]):
            raise ToolError(f"file changed around line {n} of {path}; read lines {a}-{b} again before editing")


# The near-match search is bounded on any input. Lines worth scoring are found by C-speed
# substring search for the rarest words of old's first line (each counted and found with
# bytes.count/find: linear in the file), at most NEAR_LINES of them; without such a word only the
# first NEAR_LINES lines are scored. A line is scored by its first NEAR_CLIP characters (a
# character-count overlap, linear), and the full SequenceMatcher (quadratic in its inputs) runs
# only on the NEAR_FULL best windows, clipped to NEAR_WINDOW characters. The interrupt is polled
# every NEAR_POLL lines.
NEAR_CLIP = 500


NEAR_LINES = 4096


NEAR_FULL = 6


NEAR_WINDOW = 300


NEAR_POLL = 512


_WORD = re.compile(r"\w{3,}")


def lines_to_score(data: bytes, starts: list[int], first: str) -> list[int]:
    """0-based numbers of the lines the near-match search scores (see above)."""
    words = {w.encode("utf-8") for w in _WORD.findall(first)}
    anchors = sorted((n, w) for w in words if (n := data.count(w)))[:3]
    if not anchors:
        return list(range(min(len(starts), NEAR_LINES)))
    picked: dict[int, None] = {}
    for _, word in anchors:
        pos = data.find(word)
        while pos >= 0 and len(picked) < NEAR_LINES:
            n = bisect.bisect_right(starts, pos) - 1
            picked[n] = None
            nxt = starts[n + 1] if n + 1 < len(starts) else len(data)
            pos = data.find(word, nxt)  # the next line holding it
    return sorted(picked)


def candidates(data: bytes, lines: list[bytes], old: str, should_stop: Callable[[], bool] = lambda: False,
                limit: int = 3) -> list[tuple[int, int, float]] | None:
    """Closest windows of len(old lines) lines: (first line, last line, similarity), best first;
    None when interrupted."""
    want = old.split("\n")
    if want and want[-1] == "":
        want.pop()
    k = max(1, len(want))
    if not lines:
        return []
    first = want[0].strip()[:NEAR_CLIP] if want else ""
    # difflib's quick_ratio (2 * common characters / total length, counted as multisets), with
    # the counting done by Counter in C.
    want_counts = Counter(first)
    scored: list[tuple[float, int]] = []
    for done, i in enumerate(lines_to_score(data, line_starts(lines), first)):
        if done % NEAR_POLL == 0 and should_stop():
            return None
        text = lines[i][: 4 * NEAR_CLIP].decode("utf-8", errors="replace").strip()[:NEAR_CLIP]
        total = len(text) + len(first)
        if not total or 2 * min(len(text), len(first)) < 0.3 * total:
            continue  # real_quick_ratio: the lengths alone rule it out
        score = 2 * sum((Counter(text) & want_counts).values()) / total
        if score >= 0.3:
            scored.append((score, -i))
    target = "\n".join(w[:NEAR_CLIP] for w in want)[:NEAR_WINDOW]
    best: list[tuple[int, int, float]] = []
    for _, neg in heapq.nlargest(NEAR_FULL, scored):
        if should_stop():
            return None
        i = -neg
        j = min(len(lines), i + k)
        window = "\n".join(line_text(x[: 4 * NEAR_CLIP])[:NEAR_CLIP] for x in lines[i:j])[:NEAR_WINDOW]
        ratio = difflib.SequenceMatcher(None, window, target, autojunk=False).ratio()
        best.append((i + 1, j, ratio))
    best.sort(key=lambda t: (-t[2], t[0]))
    picked: list[tuple[int, int, float]] = []
    for cand in best:
        if cand[2] < 0.4:
            break
        if all(cand[1] < p[0] or cand[0] > p[1] for p in picked):
            picked.append(cand)
        if len(picked) == limit:
            break
    return picked


def show_lines(lines: list[bytes], a: int, b: int, key: str, shown: list[tuple[str, int, bytes]]) -> str:
    b = min(b, a + 7)  # a candidate is shown by at most 8 lines
    text, seen = numbered_clipped(lines, list(range(a, b + 1)), indent="    ")
    shown.extend((key, n, raw) for n, raw in seen)
    return text


MAX_OCCURRENCES = 1000


def occurrences(data: bytes, needle: bytes, lo: int = 0) -> tuple[list[int], bool]:
    """Start offsets of needle, overlapping ones included ("aa" occurs twice in "aaa": an
    ambiguous replacement, so it must not count as unique), and whether there were more than the
    MAX_OCCURRENCES listed (a one-byte needle in a 16 MiB file must not build millions)."""
    out: list[int] = []
    pos = data.find(needle, lo)
    while pos >= 0:
        if len(out) == MAX_OCCURRENCES:
            return out, True
        out.append(pos)
        pos = data.find(needle, pos + 1)
    return out, False


UPTO = "[upto]"


# The streamed start of `old` after which the agent writes `[upto]` itself (agent/edit_assist.py):
# long enough and spread over enough lines that the model has clearly chosen its place.
UPTO_MIN_BYTES = 64


UPTO_MIN_LINES = 2


def _find(data: bytes, lines: list[bytes], text: str, lo: int = 0) -> tuple[bytes, list[int], bool]:
    """(the form found, its start offsets at or after lo, more than listed) of typed text in the
    file. The forms old may take: with the file's own ending first, as typed, then the other
    endings (a mixed file); the first form found is the one meant."""
    typed = text.encode("utf-8")
    eol = file_eol(lines)
    forms = [to_eol(typed, eol), typed, to_eol(typed, b"\r\n"), to_eol(typed, b"\r")] if b"\n" in typed else [typed]
    for form in dict.fromkeys(forms):
        found, more = occurrences(data, form, lo)
        found = [o for o in found if not splits_crlf(data, o, len(form))]
        if found:
            return form, found, more
    return typed, [], False


def upto_ready(data: bytes, prefix: str) -> bool:
    """Whether the streamed start of `old` already picks its place: at least UPTO_MIN_BYTES,
    UPTO_MIN_LINES lines with text, ending at a line end, no [upto] yet, and found exactly once
    in the file. The rest of old would then be copied for nothing: HEAD[upto]TAIL says it in a
    line or two."""
    if not prefix.endswith("\n") or UPTO in prefix or len(prefix.encode("utf-8")) < UPTO_MIN_BYTES:
        return False
    if sum(1 for ln in prefix.split("\n") if ln.strip()) < UPTO_MIN_LINES:
        return False
    _, offsets, _ = _find(data, split_lines(data), prefix)
    return len(offsets) == 1


def _not_found(ctx: ToolContext, path: str, key: str, data: bytes, lines: list[bytes], what: str,
               needle: str) -> ToolError:
    shown: list[tuple[str, int, bytes]] = []
    msg = f"{what} not found in {path} (0 occurrences; the match is exact and case-sensitive)."
    cands = candidates(data, lines, needle, ctx.should_stop)
    if cands is None:
        msg += " The search for close candidates was interrupted.\n"
    elif cands:
        msg += " Closest candidates:\n"
        for a, b, r in cands:
            where = f"line {a}" if a == b else f"lines {a}-{b}"
            msg += f"  {where} ({r:.0%} similar):\n" + show_lines(lines, a, b, key, shown)
        msg += "Retry with old copied exactly from these lines.\n"
    else:
        msg += "\n"
    return ToolError(msg, shown=shown)


def _not_unique(path: str, key: str, lines: list[bytes], what: str, offsets: list[int], more: bool,
                hint: str) -> ToolError:
    shown: list[tuple[str, int, bytes]] = []
    starts = line_starts(lines)
    nums = list(dict.fromkeys(line_at(starts, o) for o in offsets))
    listed = ", ".join(str(n) for n in nums[:20]) + (", ..." if len(nums) > 20 else "")
    count = len(offsets)
    msg = (f"{what} is not unique ({'more than ' if more else ''}{count} occurrences in {path}, "
           f"starting at lines {listed}); {hint}:\n")
    for n in nums[:5]:
        msg += show_lines(lines, n, n, key, shown)
    return ToolError(msg, shown=shown)


_WIDEN = "add lines around it until it occurs once"
_WIDEN_UPTO = _WIDEN + ", or write old as HEAD[upto]TAIL"


def select_old(ctx: ToolContext, path: str, key: str, data: bytes, old: str) -> tuple[int, int]:
    """The byte span [start, end) of the file that `old` selects; ToolError saying why not.

    old matches exactly once, or (only with ctx.edit_upto: --edit-upto) is written HEAD[upto]TAIL:
    HEAD found once in the file, TAIL found once after HEAD, the span running from the start of HEAD to the end of TAIL (the
    newlines right after [upto] are not part of TAIL; an empty TAIL ends the span with HEAD,
    which is what a model means when [upto] came just as its old was complete). The span must
    lie in lines the model has seen since they last changed (the guard): an edit never
    overwrites text the model has not read."""
    if old == "":
        raise ToolError("old text is empty; give the exact text to replace (read the file first)")
    rec = ctx.seen.get(key)
    if not rec:
        # Before any candidate is shown: the model gets no content of a file it has not read.
        raise ToolError(f"edit requires a recent read/search of {path}; read the lines before editing")
    lines = split_lines(data)
    form, offsets, more = _find(data, lines, old)
    if len(offsets) == 1:
        span = offsets[0], offsets[0] + len(form)
    elif ctx.edit_upto and UPTO in old:
        head, _, tail = old.partition(UPTO)
        tail = tail.lstrip("\r\n")
        if head == "":
            raise ToolError("HEAD[upto]TAIL needs the text of the first lines to replace before [upto]")
        hform, hoffs, hmore = _find(data, lines, head)
        if not hoffs:
            raise _not_found(ctx, path, key, data, lines, "HEAD (old before [upto])", head)
        if len(hoffs) > 1:
            raise _not_unique(path, key, lines, "HEAD (old before [upto])", hoffs, hmore,
                              "add lines to HEAD until it occurs once")
        head_end = hoffs[0] + len(hform)
        if tail == "":
            span = hoffs[0], head_end
        else:
            tform, toffs, tmore = _find(data, lines, tail, head_end)
            if not toffs:
                where = line_at(line_starts(lines), head_end - 1)
                err = _not_found(ctx, path, key, data, lines, f"TAIL (old after [upto]) after HEAD (line {where})",
                                 tail)
                raise err
            if len(toffs) > 1:
                raise _not_unique(path, key, lines, "TAIL (old after [upto]) after HEAD", toffs, tmore,
                                  "add lines to TAIL until its first occurrence after HEAD is the only one")
            span = hoffs[0], toffs[0] + len(tform)
    elif not offsets:
        err = _not_found(ctx, path, key, data, lines, "old text", old)
        if UPTO in old:  # the model wrote the form this run does not offer: say so once
            err.message += (f"{UPTO} is plain text here: give old as the exact text (HEAD{UPTO}TAIL "
                            "selection is off; the user enables it with --edit-upto).\n")
        raise err
    else:
        raise _not_unique(path, key, lines, "old text", offsets, more, _WIDEN_UPTO if ctx.edit_upto else _WIDEN)
    starts = line_starts(lines)
    guard(ctx, key, path, lines, line_at(starts, span[0]), line_at(starts, span[1] - 1))
    return span
