"""Plain-text formatting shared by the TUI and the plain mode (no Textual, no prompt_toolkit here).

Everything in this module is a pure function of its arguments, so both front ends show the same
numbers the same way and the tests can check exact strings.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from ds4agent import textsafe
from ds4agent.agent.events import format_age
from ds4agent.invocation import program

# Context share at which the agent's soft compaction starts (agent-reference.md §8). The status bar
# draws the threshold; the agent may report its own value in a status event, which then wins.
DEFAULT_COMPACT_AT = 0.85
# A prefill shorter than this is not used as "the last prefill speed": its rate is mostly fixed
# per-call overhead (the one-token sync before a save reads as "prefill 34 t/s").
MIN_RATE_TOKENS = 32

STATE_WORDS = {
    "loading": "loading model",
    "idle": "idle",
    "prefill": "prefill",
    "generating": "generating",
    "tool": "running tool",
    "compacting": "compacting",
    "saving": "saving",
    "error": "error",
    "interrupted": "interrupted",
}


# One rule for what reaches a terminal, shared with job output and titles (textsafe.py).
terminal_safe = textsafe.terminal_safe


def human_count(n: int) -> str:
    """Token counts as the reference footer writes them: below 1000 exact, then `N.Nk` / `Nk`, `N.NM`."""
    n = int(n)
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        value, unit = n / 1000, "k"
    else:
        value, unit = n / 1_000_000, "M"
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return text + unit


# A message's size in tokens, guessed from its bytes before it is sent (the UI has no tokenizer;
# DeepSeek's BPE takes about 4 bytes of English or code per token, fewer for other scripts).
BYTES_PER_TOKEN = 3


def big_message_warning(text: str, s: StatusState) -> str:
    """A warning when a message about to be sent would fill the context ("" when it fits): past the
    compaction threshold it forces a compaction first; past the context it cannot be sent."""
    if s.ctx_total <= 0:
        return ""
    tokens = len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN
    room = int(s.ctx_total * s.compact_at) - s.ctx_used
    if tokens <= room:
        return ""
    what = (f"more than the whole context ({human_count(s.ctx_total)} tokens): it will not fit"
            if tokens >= s.ctx_total - s.ctx_used else
            "past the compaction threshold: the conversation is compacted before it is read")
    return (f"this message is about {human_count(tokens)} tokens, {what}. Press Enter again to send it "
            "anyway, or edit it")


def format_size(n_bytes: int) -> str:
    """A file's size in the unit that shows it: a stripped session is a few KiB, not "0.0 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def clip(text: str, width: int) -> str:
    """One display line: newlines flattened, cut with an ellipsis when longer than `width`."""
    flat = " ".join(text.split("\n"))
    if len(flat) <= width:
        return flat
    return flat[: max(0, width - 1)] + "…"


def cells(text: str) -> int:
    """Terminal cells `text` takes: wide (East Asian) characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def fit(text: str, width: int) -> str:
    """One display line of at most `width` cells: newlines flattened; a longer text is cut at a word
    boundary when one is near the end (else mid-word) and ends with an ellipsis."""
    flat = " ".join(text.split())
    if cells(flat) <= width:
        return flat
    if width <= 1:
        return "…"[:max(width, 0)]
    out, used = [], 0
    for ch in flat:
        w = cells(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    cut = "".join(out)
    space = cut.rfind(" ")
    if space >= len(cut) * 2 // 3:  # a word boundary near the end: do not cut a word in half
        cut = cut[:space]
    return cut.rstrip() + "…"


def header_parts(cwd: str, session_id: str, title: str, modes: str, width: int) -> tuple[str, str]:
    """The header's directory and session label for `width` cells, beside `ds4agent ─ … ─ …` and
    the modes on the right, which always stay whole: a long title is cut at a word with an
    ellipsis (or left out), then a long directory keeps its last part."""
    label = f"session {session_id[:8]}" if session_id else "new session"
    room = width - cells("ds4agent ─  ─ ") - cells(modes) - 1 - cells(label)
    place = shorten_home(cwd)
    title = " ".join(title.split()) if session_id else ""
    want = cells(title) + 3 if title else 0           # ' "title"'
    if cells(place) + want > room and title:
        # the directory gives way first, down to a readable tail, then the title is cut
        place = _fit_path(place, max(16, room - min(want, 24)))
    title_room = room - cells(place) - 3
    if title and title_room >= min(8, cells(title)):
        label += f' "{fit(title, title_room)}"'
    elif cells(place) > room:
        place = _fit_path(place, max(1, room))
    return place, label


def _fit_path(path: str, width: int) -> str:
    """A path in `width` cells: its end kept, its start replaced by `…`."""
    if cells(path) <= width:
        return path
    out, used = [], 0
    for ch in reversed(path):
        w = cells(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "…" + "".join(reversed(out))


def queued_label(text: str, width: int = 60) -> str:
    """A queued prompt as one line; long ones say how much was left out, as the reference does."""
    flat = " ".join(text.strip().split("\n"))
    if len(flat) <= width:
        return flat
    return f"{flat[:width]}… {len(flat) - width} characters more"


def shorten_home(path: str | os.PathLike[str]) -> str:
    text = str(path)
    home = str(Path.home())
    if home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


def bar(fraction: float, cells: int = 20, filled: str = "█", empty: str = "·") -> str:
    fraction = min(1.0, max(0.0, fraction))
    n = int(round(fraction * cells))
    return filled * n + empty * (cells - n)


@dataclass
class StatusState:
    """Everything the status line shows; the event boundary updates it, a timer renders it."""

    state: str = "loading"
    detail: str = ""                 # error message, tool name, or compaction reason
    load_fraction: float = 0.0
    prefill_done: int = 0
    prefill_total: int = 0
    prefill_tps: float = 0.0
    gen_tokens: int = 0
    decode_tps: float = 0.0
    last_prefill_tps: float = 0.0
    last_decode_tps: float = 0.0
    ctx_used: int = 0
    ctx_total: int = 0
    compact_at: float = DEFAULT_COMPACT_AT
    permission: str = "ask"
    think_mode: str = "think"
    power: int = 100                 # the device's duty-cycle cap (/power); shown below 100
    session_id: str = ""
    title: str = ""
    device: str = ""                 # where the engine computes ("Metal GPU", "CPU"), from Ready
    experts: str = ""                # which routed-expert backend runs and why, from Ready
    dirty: bool = False
    interrupting: bool = False       # Esc / Ctrl+C pressed: said at once, until the work stops
    _decode_seen: float = 0.0        # the decode speed in the last Status (stale ones repeat it)

    def set_state(self, state: str, detail: str = "") -> None:
        """Switch state; entering prefill forgets the previous prefill's progress (no stale bar)."""
        if state == "prefill" and self.state != "prefill":
            self.prefill_done = self.prefill_total = 0
            self.prefill_tps = 0.0
        if state in ("idle", "error", "loading"):
            self.interrupting = False  # the interrupted work is over
        self.state, self.detail = state, detail

    # -- the agent's events (both front ends apply them the same way) ---------------------------
    def apply_status(self, e) -> None:
        """A Status event. Its speed fields are the worker's *latest* measurements, which stay set
        after the work that produced them (a load or /new still reports the startup prefill), so
        the decode speed is taken while generating or compacting or when it changed, and the
        prefill speed only from PrefillProgress (apply_prefill): the status line never shows a
        rate that nothing just measured."""
        state = e.state.value if hasattr(e.state, "value") else str(e.state)
        self.set_state(state, e.detail)
        if e.progress is not None and state == "loading":
            self.load_fraction = e.progress
        self.ctx_used, self.ctx_total = e.ctx_used, e.ctx_total
        if e.ctx_total > 0 and e.compact_at > 0:
            self.compact_at = e.compact_at / e.ctx_total
        self.gen_tokens = e.generated
        live = state in ("generating", "compacting")
        self.decode_tps = e.decode_tps if live else 0.0
        # A round's final speed arrives with the next state's Status (a short round may send no
        # `generating` Status with a speed at all): a value that changed is a new measurement.
        if e.decode_tps > 0 and (live or e.decode_tps != self._decode_seen):
            self.last_decode_tps = e.decode_tps
        self._decode_seen = e.decode_tps
        self.dirty = e.unsaved
        self.session_id, self.title = e.session_id, e.title
        self.think_mode, self.permission = e.think_mode, e.permission_mode
        self.power = e.power

    def apply_prefill(self, e) -> None:
        """A PrefillProgress event: the live bar, and the speed kept for the idle status line when
        the prefill was long enough to mean something (a one-token sync before a save measures
        call overhead, not prefill speed)."""
        self.set_state("prefill", self.detail if self.state == "prefill" else "")
        self.prefill_done, self.prefill_total, self.prefill_tps = e.done, e.total, e.tps
        if e.tps > 0 and e.total >= MIN_RATE_TOKENS:
            self.last_prefill_tps = e.tps

    def switch_session(self, session_id: str = "", title: str = "", ctx_used: int | None = None) -> None:
        """A loaded or new session: its speeds are not the previous session's (a load prefills
        nothing), so the status line shows none until this session measures its own."""
        self.session_id, self.title = session_id, title
        if ctx_used is not None:
            self.ctx_used = ctx_used
        self.last_prefill_tps = self.last_decode_tps = 0.0
        self.prefill_tps = self.decode_tps = 0.0


def state_segment(s: StatusState) -> str:
    """The state word with its live detail (prefill bar, decode speed, error text)."""
    if s.interrupting and s.state not in ("idle", "error", "loading"):
        return "interrupting…"  # at the key press: a prefill chunk or a tool may take a moment to stop
    if s.state == "loading":
        if s.detail and s.detail != STATE_WORDS["loading"]:
            return f"{s.detail}…"  # after the load itself: e.g. waiting for an MCP server
        return f"loading model… {int(s.load_fraction * 100)}%"
    if s.state == "prefill":
        if s.prefill_total <= 0:
            return f"prefill {s.detail}".rstrip()
        total = s.prefill_total
        frac = s.prefill_done / total
        text = f"prefill {bar(frac, 12)} {human_count(s.prefill_done)}/{human_count(s.prefill_total)} {frac * 100:.1f}%"
        if s.prefill_tps > 0:
            text += f" {s.prefill_tps:.0f} t/s"
        return text
    if s.state == "generating":
        text = f"generating {s.gen_tokens} tokens"
        if s.decode_tps > 0:
            text += f" {s.decode_tps:.1f} t/s"
        return text
    if s.state == "compacting":
        text = "compacting"
        if s.detail:
            text += f" {s.detail}"
        if s.gen_tokens:
            text += f" summary {s.gen_tokens} tokens"
        return text
    if s.state == "tool":
        return f"running tool {s.detail}".rstrip()
    if s.state == "error":
        return f"error: {s.detail}" if s.detail else "error"
    return STATE_WORDS.get(s.state, s.state)


def ctx_segment(s: StatusState, cells: int = 8, *, threshold: bool = True) -> str:
    if s.ctx_total <= 0:
        return "ctx –"
    frac = s.ctx_used / s.ctx_total
    text = f"ctx {human_count(s.ctx_used)}/{human_count(s.ctx_total)} {bar(frac, cells)} {frac * 100:.0f}%"
    return text + f" (compact at {s.compact_at * 100:.0f}%)" if threshold else text


def speed_segment(s: StatusState) -> str:
    """Last measured speeds; the one the state segment already shows live is left out."""
    parts = []
    if s.last_prefill_tps > 0 and s.state != "prefill":
        parts.append(f"prefill {s.last_prefill_tps:.0f} t/s")
    if s.last_decode_tps > 0 and s.state != "generating":
        parts.append(f"decode {s.last_decode_tps:.1f} t/s")
    return " · ".join(parts)


def saved_segment(s: StatusState) -> str:
    return "unsaved ●" if s.dirty else "saved ✓"


def status_line(s: StatusState, width: int | None = None) -> str:
    """The whole status bar as one plain line (plain mode; the TUI colours the same segments).
    With a width it fits: the speeds go first, then the think and permission modes (the device
    stays), and what still does not fit ends in "…"."""
    speed = speed_segment(s)
    full = [state_segment(s), ctx_segment(s), *([speed] if speed else []), saved_segment(s), modes_segment(s)]
    ctx_short = ctx_segment(s).split(" (compact at")[0]  # the meter and percentage without the threshold
    tries = [full, [p for p in full if p != speed],
             [state_segment(s), ctx_segment(s), saved_segment(s), s.device],
             [state_segment(s), ctx_short, saved_segment(s), s.device],
             [state_segment(s), " ".join(w for w in ctx_short.split() if w[0] not in "█·"),  # no meter
              saved_segment(s), s.device]]
    line = ""
    for parts in tries:
        line = " · ".join(p for p in parts if p)
        if width is None or cells(line) <= width:
            return line
    return fit(line, width) if width is not None else line


def modes_segment(s: StatusState) -> str:
    """The think and permission modes, the power cap when one is set, and the device and the
    routed-expert backend once the engine has said which."""
    power = f"power {s.power}%" if s.power < 100 else ""
    experts = f"experts: {s.experts}" if s.experts else ""
    return " · ".join(p for p in (s.think_mode, s.permission, power, s.device, experts) if p)


# -- lines both front ends print for the agent's events (the TUI as notes, plain mode as text) ------
HISTORY_END = "--- end history ---"
NO_HISTORY = "(no user history)"


def ready_line(model: str, ctx: int, experts: str = "") -> str:
    line = f"ready · {model} · context {human_count(ctx)} tokens"
    return line + f" · experts: {experts}" if experts else line


def compacting_line(reason: str) -> str:
    return f"compacting ({reason}): summarising durable task state"


INTERRUPTED_UNREAD = ("interrupted before any answer: the message was taken back out of the conversation "
                      "(it is in the input box to edit and send again)")


def turn_end_note(reason: str, error: str = "", generated: int | None = None) -> tuple[str, str] | None:
    """What the end of a turn says, as (text, level): an interruption (one before the model wrote
    anything, e.g. a large paste's prefill cut short, says how to take the message back), the
    token cap, an error."""
    if reason == "interrupted":
        return (INTERRUPTED_UNREAD if generated == 0 else "interrupted"), "warning"
    if reason == "token_cap":
        return "[the round stopped at the token limit (--tokens)]", "warning"
    if reason == "context_full":
        return "[the answer filled the context and compaction could not free room]", "warning"
    if reason == "error" and error:
        return error, "error"
    return None


def history_heading(turns: int) -> str:
    """Above the turns /history replays."""
    return f"--- session history: last {turns} user turn(s) ---"


def loaded_history_heading(session_id: str, title: str, items) -> str | None:
    """Above a loaded session's replayed turns; None when they hold no user turn (nothing is shown)."""
    turns = sum(1 for item in items if item.kind == "user")
    return f"--- {history_label(session_id, title)}: last {turns} user turn(s) ---" if turns else None


def session_list_lines(directory: str, sessions, now: float) -> list[str]:
    """/list as text: a heading, then one line per saved session (or `(none)`)."""
    lines = [f"saved sessions in {directory}:"]
    for info in sessions:
        title = info.title if len(info.title) <= 70 else info.title[:70] + "..."
        counts = "" if getattr(info, "unreadable", "") else f"{info.tokens} tokens, "  # no tokens to count
        fork = f", fork of {info.forked_from}" if getattr(info, "forked_from", "") else ""
        stripped = ", stripped" if getattr(info, "stripped", False) else ""
        used = info.last_used or getattr(info, "created_at", 0) or now
        lines.append(f"  {info.short_id} ({format_age(now - used)}) {title}  "
                     f"[{counts}{format_size(info.size_bytes)}{stripped}{fork}]")
    if not sessions:
        lines.append("  (none)")
    return lines


def session_label(session_id: str, title: str) -> str:
    if not session_id:
        return "new session"
    label = f"session {session_id[:8]}"
    if title:
        label += f' "{clip(title, 48)}"'
    return label


def history_label(session_id: str, title: str) -> str:
    """Names the session whose turns a load replays; a resumed crash journal has no id yet."""
    name = f"session {session_id[:8]}" if session_id else "unsaved session"
    return f'{name} "{clip(title, 48)}"' if title else name


def rewind_point_line(point, now: float, width: int = 60) -> str:
    """One user turn of the /rewind list: `  N  <age>  <first line>`."""
    age = format_age(now - point.time) if point.time else "earlier"
    return f"{point.number:>3}  {age:<8}  {clip(point.preview, width)}"


def rewind_list_lines(points, note: str, now: float) -> list[str]:
    """/rewind without a turn, as text (plain mode)."""
    if not points:
        return ["no user turns to rewind to yet"]
    lines = ["user turns (1 = the first):"]
    lines += ["  " + rewind_point_line(p, now) for p in points]
    lines.append("/rewind N [both|chat|code|fork]  (default both: code and conversation)")
    if note:
        lines.append(note[:1].upper() + note[1:])
    return lines


def resume_hint(session_id: str) -> str:
    """How to get back to a saved session: the one place that words it, with the program as it
    can be typed here (a demo's sessions live in the demo's own directory: `--demo` finds them)."""
    demo = " --demo" if "--demo" in sys.argv[1:] else ""
    return f"{program()}{demo} --resume {session_id}"


def exit_line(s: StatusState) -> str:
    """The last line on leaving: where the work is. "" when there was no conversation at all."""
    if s.session_id and not s.dirty:
        return f"saved {s.session_id} — resume with {resume_hint(s.session_id)}"
    if s.session_id:
        return (f"the last turns were not saved; session {s.session_id} holds the conversation up to "
                f"its last save — resume with {resume_hint(s.session_id)}")
    if s.dirty:
        return "not saved"
    return ""
