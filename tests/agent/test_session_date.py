"""The local date and time: the first user turn of a session opens with it, later turns do not,
and what the user sees (history, rewind, the title) is only what they typed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ds4agent.agent import events as ev
from ds4agent.agent import rewind
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import Tokenizer
from tests.support.agent_harness import DATE_LINE, AgentHarness, of
from tests.support.scripted_engine import reply

TOK = Tokenizer.load()


def test_date_line_format():
    now = datetime(2026, 3, 14, 9, 26, 53, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))
    assert template.session_date_line(now) == "Current local date and time: Saturday 2026-03-14 09:26 UTC-05:30"
    line = template.session_date_line(now)
    assert template.strip_session_date(f"{line}\n\nhello\n\nworld") == "hello\n\nworld"
    assert template.strip_session_date("Current local date and time: is what I ask") == \
        "Current local date and time: is what I ask"


def test_first_turn_carries_the_date_and_later_turns_do_not(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")])
    system = list(h.ids)
    h.turn("first question")
    h.turn("second question")
    assert h.ids[:len(system)] == system  # the system prefix (and its KV cache key) unchanged
    turns = template.split_turns(h.ids, h.worker.conv.transcript.system_len)
    assert [TOK.decode_bytes(t.user) for t in turns] == [
        b"Current local date and time: Saturday 2026-03-14 09:26 UTC+01:00\n\nfirst question",
        b"second question"]
    assert DATE_LINE == "Current local date and time: Saturday 2026-03-14 09:26 UTC+01:00"
    # Shown as typed: the rewind list, the history and the saved title.
    assert [p.preview for p in rewind.points(h.worker)] == ["first question", "second question"]
    items = of(h.command(lambda: h.agent.history(5)), ev.History)[0].items
    assert [i.text for i in items if i.kind == "user"] == ["first question", "second question"]
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.title == "first question"
    # A new session gives the date again, once.
    h.command(h.agent.new)
    h.engine.add(reply("A3", think="t"))
    h.turn("third")
    assert h.text().count(b"Current local date and time: ") == 1
    h.stop()
