"""Thinking levels: /think N and --think-level N name DeepSeek V4's three reasoning-effort forms
(0 nothink, 1 think, 2 think-max), and the next turn's generation prompt follows the level."""

from __future__ import annotations

import pytest

from ds4agent.agent import events as ev
from ds4agent.agent.settings import AgentSettings, think_mode_named
from ds4agent.cli import build_parser, parse
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import END_THINK, THINK
from tests.support.agent_harness import DATE_LINE, AgentHarness, of
from tests.support.scripted_engine import reply


def test_levels_and_names_map_to_the_templates_forms():
    assert [think_mode_named(w) for w in ("0", "1", "2", "think-max", " NoThink ")] == [
        "nothink", "think", "think-max", "think-max", "nothink"]
    with pytest.raises(ValueError, match=r"unknown thinking level: '3' \(0 nothink, 1 think, 2 think-max"):
        think_mode_named("3")
    assert AgentSettings(think_mode="think-max").think_level == 2


def test_think_level_flag_reaches_the_settings_and_a_bad_one_is_a_usage_error(capsys):
    parser = build_parser()
    assert parse(["--think-level", "0"]).settings.think_mode == "nothink"
    assert parse(["--think-level", "2"]).settings.think_mode == "think-max"
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["--think-level", "5"])
    assert err.value.code == 2
    assert "unknown thinking level: '5'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one way to say the mode: the flags exclude each other
        parser.parse_args(["--think-level", "0", "--think-max"])


def test_think_0_makes_the_next_turn_nothink_and_the_status_says_so(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("Plain answer.", think=None)])
    evs = h.command(lambda: h.agent.set_think_mode("0"))
    assert "thinking mode: nothink" in [e.text for e in of(evs, ev.Notice)]
    assert of(evs, ev.Status)[-1].think_mode == "nothink"
    sys_len = len(h.ids)
    h.turn("hi")
    suffix = h.ids[sys_len:]
    assert suffix == template.render(template.user_turn_pieces("hi", think_mode="nothink", date_line=DATE_LINE)) + reply(
        "Plain answer.", think=None)
    prompt_end = suffix.index(END_THINK)
    assert THINK not in suffix[:prompt_end]
    h.stop()


def test_think_2_below_384k_stays_think_with_a_warning_and_bad_levels_are_refused(tmp_path):
    h = AgentHarness.build(tmp_path, [])
    evs = h.command(lambda: h.agent.set_think_mode("2"))
    warnings = [e.text for e in of(evs, ev.Notice) if e.level == "warning"]
    assert warnings and warnings[0].startswith("think-max needs a context of at least 393216 tokens")
    assert of(evs, ev.Status)[-1].think_mode == "think"
    evs = h.command(lambda: h.agent.set_think_mode("7"))
    assert [e.text for e in of(evs, ev.Error)] == [
        "unknown thinking level: '7' (0 nothink, 1 think, 2 think-max; DeepSeek V4 has these three "
        "reasoning-effort forms)"]
    h.stop()
