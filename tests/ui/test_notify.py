"""Notifications: which terminal gets which escape, when the front ends ring, and the settings
(notify.json under --notify / --notify-after)."""

from __future__ import annotations

import json

import pytest

from ds4agent.agent import events as ev
from ds4agent.agent.notify_config import NotifyConfig, NotifyConfigError, load, resolve
from ds4agent.cli import build_parser
from ds4agent.ui.notify import BEL, Notifier, sequence, terminal_osc
from ds4agent.ui.plain import PlainFrontEnd, PlainRenderer
from tests.ui.fake_agent import FakeAgent


@pytest.mark.parametrize(("environ", "kind"), [
    ({"TERM_PROGRAM": "iTerm.app"}, "osc9"), ({"TERM_PROGRAM": "WezTerm"}, "osc9"), ({"WT_SESSION": "x"}, "osc9"),
    ({"TERM": "xterm-kitty"}, "osc9"), ({"VTE_VERSION": "7600"}, "osc777"), ({"TERM": "rxvt-unicode"}, "osc777"),
    ({"TERM": "xterm-256color"}, ""), ({"TERM_PROGRAM": "iTerm.app", "TMUX": "/tmp/t,1,0"}, ""),
])
def test_the_terminal_decides_the_escape(environ, kind):
    assert terminal_osc(environ) == kind


def test_sequences_are_one_clean_line():
    assert sequence("", "ds4agent", "x") == BEL
    assert sequence("osc9", "ds4agent", "turn\nfinished;\x1b[31m") == "\x1b]9;ds4agent: turn finished[31m\x07\a"
    assert sequence("osc777", "ds4agent", "waiting") == "\x1b]777;notify;ds4agent;waiting\x07\a"


def test_long_turns_and_questions_ring_short_turns_do_not():
    n = Notifier(NotifyConfig("auto", 30.0), {"TERM_PROGRAM": "iTerm.app"})
    assert n.on_event(ev.TurnEnded("done", seconds=42.4)) == "\x1b]9;ds4agent: turn finished after 42 s\x07\a"
    assert n.on_event(ev.TurnEnded("interrupted", seconds=31)) == \
        "\x1b]9;ds4agent: turn stopped (interrupted) after 31 s\x07\a"
    assert n.on_event(ev.TurnEnded("done", seconds=29.9)) == ""
    assert n.on_event(ev.PermissionRequest(id="p", tool="plan", question="Approve this plan?")) == \
        "\x1b]9;ds4agent: waiting for you: Approve this plan?\x07\a"
    assert n.on_event(ev.Notice("hello")) == ""
    assert Notifier(NotifyConfig("bell", 0), {"TERM_PROGRAM": "iTerm.app"}).on_event(ev.TurnEnded("done")) == BEL
    assert Notifier(NotifyConfig("osc", 0), {}).on_event(ev.TurnEnded("done")).startswith("\x1b]9;")
    assert Notifier(NotifyConfig("off", 0), {}).on_event(ev.Question(id="q", kind="save", question="Save?")) == ""


def test_plain_front_end_rings_through_its_ring_hook():
    agent = FakeAgent()
    fe = PlainFrontEnd(agent, PlainRenderer(lambda text, style: None))
    rang: list[str] = []
    fe.notifier, fe.ring = Notifier(NotifyConfig("bell", 10), {}), rang.append
    agent.emit(ev.TurnEnded("done", seconds=3), ev.TurnEnded("done", seconds=12))
    fe.pump()
    assert rang == [BEL]


def test_settings_file_flags_and_readable_errors(tmp_path):
    assert load(tmp_path) == NotifyConfig("auto", 30.0)
    (tmp_path / "notify.json").write_text(json.dumps({"mode": "bell", "after_seconds": 5}))
    assert load(tmp_path) == NotifyConfig("bell", 5.0)
    assert resolve(None, 60, tmp_path) == NotifyConfig("bell", 60.0)
    assert resolve("off", None, tmp_path) == NotifyConfig("off", 5.0)
    (tmp_path / "notify.json").write_text('{"mode": "loud"}')
    with pytest.raises(NotifyConfigError, match=r"notify.json: notification mode must be one of auto, bell, "
                                                r"osc, off \(got 'loud'\)"):
        load(tmp_path)
    (tmp_path / "notify.json").write_text('{"after": 3}')
    with pytest.raises(NotifyConfigError, match=r"unknown setting 'after' \(mode, after_seconds\)"):
        load(tmp_path)
    (tmp_path / "notify.json").write_text("{}")
    with pytest.raises(NotifyConfigError, match=r"--notify-after: after_seconds must be a number of seconds >= 0"):
        resolve(None, -1, tmp_path)
    args = build_parser().parse_args(["--notify", "off", "--notify-after", "5"])
    assert (args.notify, args.notify_after) == ("off", 5.0)
