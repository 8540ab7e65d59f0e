"""Ringing the terminal when the user is wanted: a long turn ended, or a question waits.

    terminal_osc(environ) -> "osc9" | "osc777" | ""   the desktop-notification escape the terminal shows
    sequence(kind, title, body) -> str                  the bytes for one notification
    Notifier(config, environ).on_event(event) -> str    what to write for an agent event ("" for nothing)

BEL works everywhere a bell is configured; OSC 9 (iTerm2, WezTerm, Windows Terminal, Ghostty,
kitty) and OSC 777 (VTE terminals such as GNOME Terminal, foot, urxvt) also raise a desktop
notification. An unknown terminal gets the BEL only: an OSC it does not know could show as text.
Inside tmux or screen the OSC would reach tmux, not the terminal, so only the BEL is sent there.
"""

from __future__ import annotations

from collections.abc import Mapping

from ds4agent.agent import events as ev
from ds4agent.agent.notify_config import NotifyConfig
from ds4agent.agent.settings import AgentRun

TITLE = "ds4agent"
BEL = "\a"
_OSC9_PROGRAMS = {"iTerm.app", "WezTerm", "ghostty"}


def terminal_osc(environ: Mapping[str, str]) -> str:
    if environ.get("TMUX") or environ.get("STY"):
        return ""
    term = environ.get("TERM", "")
    if (environ.get("TERM_PROGRAM") in _OSC9_PROGRAMS or environ.get("WT_SESSION")
            or environ.get("KITTY_WINDOW_ID") or term == "xterm-kitty" or term == "xterm-ghostty"):
        return "osc9"
    if environ.get("VTE_VERSION") or term.startswith(("rxvt", "foot")):
        return "osc777"
    return ""


def _clean(text: str) -> str:
    """One line without control characters or the separators the escapes use."""
    return "".join(ch for ch in " ".join(text.split()) if ch.isprintable() and ch != ";")[:200]


def sequence(kind: str, title: str, body: str) -> str:
    if kind == "osc9":
        return f"\x1b]9;{_clean(title)}: {_clean(body)}\x07{BEL}"
    if kind == "osc777":
        return f"\x1b]777;notify;{_clean(title)};{_clean(body)}\x07{BEL}"
    return BEL


class Notifier:
    def __init__(self, config: NotifyConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.kind = {"auto": terminal_osc(environ), "osc": "osc9"}.get(config.mode, "")

    def on_event(self, event: ev.Event) -> str:
        if self.config.mode == "off":
            return ""
        if isinstance(event, ev.TurnEnded) and event.seconds >= self.config.after:
            how = "finished" if event.reason == "done" else f"stopped ({event.reason})"
            return sequence(self.kind, TITLE, f"turn {how} after {event.seconds:.0f} s")
        if isinstance(event, ev.PermissionRequest | ev.Question):
            return sequence(self.kind, TITLE, f"waiting for you: {event.question}")
        return ""


def for_run(run: AgentRun, environ: Mapping[str, str]) -> Notifier:
    """The notifier of an interactive run: --notify / --notify-after over notify.json
    (NotifyConfigError, readable, for a bad flag or file)."""
    from ds4agent.agent.notify_config import resolve

    return Notifier(resolve(run.notify, run.notify_after), environ)
