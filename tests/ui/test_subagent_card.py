"""The subagent card's text and the merging of a subagent's streamed deltas."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.ui import bridge
from ds4agent.ui.widgets.subagent_card import TAIL_LINES, SubagentCard


def test_a_subagents_deltas_merge_per_subagent_and_kind():
    a = [ev.SubagentDelta("s1", "text", "x") for _ in range(3)]
    out = bridge.coalesce([*a, ev.SubagentDelta("s2", "text", "y"), ev.SubagentDelta("s2", "tool", "read"),
                           ev.SubagentDelta("s2", "tool", "read")])
    assert [(e.id, e.kind, e.text, n) for e, n in out] == [
        ("s1", "text", "xxx", 3), ("s2", "text", "y", 1), ("s2", "tool", "read", 1), ("s2", "tool", "read", 1)]


def test_the_card_runs_with_a_short_tail_then_folds_to_its_summary():
    card = SubagentCard("s1", "find where parse is defined")
    card.delta("thinking", "look around", 2)
    card.delta("tool", "search query='def parse'")
    card.delta("result", "1 match shown")
    for i in range(20):
        card.delta("text", f"line {i}\n")
    shown = str(card.render())
    assert "running · 22 tokens" in shown
    assert shown.count("│") == TAIL_LINES and "line 19" in shown and "line 0" not in shown
    card.finish("parse is in a.py line 3.", "done", 2, 58, 3.04)
    folded = str(card.render())
    assert "done · 3.0 s · 58 tokens" in folded and "parse is in a.py line 3." in folded
    assert "line 19" not in folded
    card.toggle()
    unfolded = str(card.render())
    assert "⏺ search query='def parse'" in unfolded and "⎿ 1 match shown" in unfolded and "line 0" in unfolded
    assert "(2 rounds)" in unfolded


def test_a_saved_subagent_replays_folded():
    from ds4agent.agent.identity import SubagentRecord

    record = SubagentRecord("s9", "survey", "All fine.", "", "done", rounds=1, generated=12, seconds=0.5,
                            lines=(("thinking", "hm"), ("tool", "read path='a.py'"), ("text", "All fine.")))
    card = SubagentCard.replay(record)
    assert "▸" in str(card.render()) and "done · 0.5 s · 12 tokens" in str(card.render())
    card.toggle()
    assert "⏺ read path='a.py'" in str(card.render())
