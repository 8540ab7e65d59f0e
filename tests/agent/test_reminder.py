"""The system prompt again in a long session: where it goes and how often."""

from __future__ import annotations

from ds4agent.agent import worker as worker_module
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import EOS, USER, Tokenizer
from tests.support.agent_harness import DATE_LINE, AgentHarness
from tests.support.scripted_engine import reply

TOK = Tokenizer.load()
HEAD = template.SYSTEM_REMINDER_HEAD.encode()


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_reminder_goes_between_the_eos_and_the_next_user_turn_once_per_interval(tmp_path, tools, monkeypatch):
    monkeypatch.setattr(worker_module, "SYSTEM_REMINDER_INTERVAL", 300)
    h = AgentHarness.build(tmp_path, [reply("a", think="t"), reply(words(200), think="t"),
                                      reply("b", think="t"), reply("c", think="t")], tools=tools)
    system = h.worker.conv.system
    reminder = TOK.encode_pieces(template.system_reminder_pieces(system.builtin, extra_system_text=system.extra,
                                                                 tools=h.worker.tools))
    h.turn("first")           # the count starts after the system prefix (thousands of tokens)
    h.turn("second")          # this turn's answer passes 300 tokens since the prefix
    assert HEAD not in h.text()
    before = len(h.ids)
    h.turn("third")           # so the reminder leads the next turn
    ids = h.ids
    assert ids[before - 1] == EOS
    assert ids[before:before + len(reminder)] == reminder  # right after the EOS ...
    assert ids[before + len(reminder)] == USER             # ... and right before the <｜User｜>
    assert TOK.decode_bytes(ids[before + len(reminder):]).startswith("<｜User｜>third".encode())
    # It is the whole system prompt (text and tools block), its DSML markers as control tokens.
    text = TOK.decode_bytes(reminder)
    assert text.startswith(HEAD) and system.builtin.encode() in text
    assert template.tools_block(h.worker.tools).encode() in text
    assert reminder.count(128825) == h.worker.conv.system_ids.count(128825) > 0
    # Counted from where it appeared: the next short turn brings no second one.
    h.turn("fourth")
    assert h.text().count(HEAD) == 1
    # The history and the title read the turns, never the reminder.
    turns = template.split_turns(h.ids, h.worker.conv.transcript.system_len)
    assert [TOK.decode_bytes(t.user) for t in turns] == [DATE_LINE.encode() + b"\n\nfirst", b"second",
                                                         b"third", b"fourth"]
    h.stop()


def test_reminder_leads_a_results_turn_too(tmp_path, tools, monkeypatch):
    monkeypatch.setattr(worker_module, "SYSTEM_REMINDER_INTERVAL", 100)
    h = AgentHarness.build(tmp_path, [reply(words(120), think="t", calls=[("alpha", {"x": "1"})]),
                                      reply("done", think="t")], tools=tools)
    h.turn("go")
    text = h.text()
    at = text.index(HEAD)
    assert text[:at].endswith("</｜DSML｜tool_calls><｜end▁of▁sentence｜>".encode())
    assert text[at:].split("<｜User｜>".encode(), 1)[1].startswith(b"<tool_result>A1\n</tool_result>")
    assert text.count(HEAD) == 1
    h.stop()
