"""/power N: the device's duty cycle, set on the agent (the engine's DutyCycle does the resting)."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.engine import DutyCycle
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _script():
    return [reply("first answer", think="t"), reply("second answer", think="u")]


def _transcript(tmp_path, power, duty=None):
    h = AgentHarness.build(tmp_path, _script(), power=power)
    if duty is not None:
        h.worker.duty = duty
    h.turn("one")
    h.turn("two")
    ids = list(h.ids)
    h.stop()
    return ids


def test_half_power_gives_the_same_transcript_and_rests_between_steps(tmp_path):
    slept: list[float] = []
    now = [0.0]

    def clock():
        now[0] += 0.001  # every read: a little work
        return now[0]

    def sleep(s):
        slept.append(s)
        now[0] += s

    full = _transcript(tmp_path / "full", 100)
    half = _transcript(tmp_path / "half", 50, DutyCycle(50, clock=clock, sleep=sleep))
    assert half == full
    # Rests after the prefills and between decoded tokens, each as long as the one clock tick of
    # work before it (50%: busy and idle alike).
    assert len(slept) >= 6
    assert all(abs(s - 0.001) < 1e-9 for s in slept)


def test_power_command_sets_confirms_and_shows_in_status(tmp_path):
    h = AgentHarness.build(tmp_path, [])
    assert h.worker.duty.percent == 100
    evs = h.command(lambda: h.agent.set_power(30))
    assert [n.text for n in of(evs, ev.Notice)] == [
        "power: 30% (the device rests 70% of the time; output unchanged)"]
    assert of(evs, ev.Status)[-1].power == 30
    assert h.worker.duty.percent == 30 and h.worker.settings.power == 30
    evs = h.command(lambda: h.agent.set_power())
    assert [n.text for n in of(evs, ev.Notice)] == [
        "power: 30% (the device rests 70% of the time; output unchanged)"]
    h.stop()


def test_power_out_of_range_is_refused_and_changes_nothing(tmp_path):
    h = AgentHarness.build(tmp_path, [], power=60)
    for bad in (0, 101):
        evs = h.command(lambda bad=bad: h.agent.set_power(bad))
        assert [e.text for e in of(evs, ev.Error)] == [
            f"/power takes a whole number from 1 to 100 (got {bad}); 100 is full power"]
        assert of(evs, ev.Status) == []
    assert h.worker.duty.percent == 60 and h.worker.settings.power == 60
    h.stop()
