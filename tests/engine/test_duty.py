"""The duty cycle (engine/duty.py): its arithmetic on an injected clock and sleep, and the rests it
puts between prefill chunks and decoded tokens, which change no token and no state."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import DutyCycle, EngineError, generate, load_engine
from ds4agent.engine.sampler import Sampler
from ds4agent.testmodels.writer import make_test_model


class FakeTime:
    """A clock that only moves when told to (work) or when slept on (a rest)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.tick = tick  # how far each read moves the clock: work the test does not model
        self.now = 100.0
        self.reads = 0
        self.slept: list[float] = []

    def clock(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def work(self, seconds: float) -> None:
        self.now += seconds


def duty(percent: int, t: FakeTime) -> DutyCycle:
    return DutyCycle(percent, clock=t.clock, sleep=t.sleep)


def test_rest_is_busy_time_scaled_by_the_idle_share():
    t = FakeTime()
    d = duty(25, t)
    d.begin()
    t.work(1.0)
    assert d.pause() == pytest.approx(3.0)  # 1 s busy at 25%: 3 s idle
    t.work(0.5)
    assert d.pause() == pytest.approx(1.5)  # measured from the end of the last rest
    assert t.slept == pytest.approx([3.0, 1.5])


def test_over_a_run_the_device_computes_the_asked_share_of_the_time():
    t = FakeTime()
    d = duty(40, t)
    start = t.now
    d.begin()
    busy = 0.0
    for w in (0.3, 0.05, 1.2, 0.7):
        t.work(w)
        busy += w
        d.pause()
    assert busy / (t.now - start) == pytest.approx(0.40)


def test_idle_time_before_begin_is_not_work():
    t = FakeTime()
    d = duty(50, t)
    d.begin()
    t.work(1.0)
    d.pause()
    t.work(600.0)  # the user was away between two runs
    d.begin()
    t.work(0.2)
    assert d.pause() == pytest.approx(0.2)


def test_full_power_never_sleeps_nor_reads_the_clock():
    t = FakeTime()
    d = duty(100, t)
    reads = t.reads
    d.begin()
    t.work(5.0)
    assert d.pause() == 0.0
    assert t.slept == [] and t.reads == reads


def test_a_new_percent_applies_from_the_next_pause_without_counting_the_past():
    t = FakeTime()
    d = duty(100, t)
    d.begin()
    t.work(30.0)  # at full power: no mark kept
    d.percent = 50
    t.work(1.0)
    assert d.pause() == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, 101, -5, 50.0, True])
def test_out_of_range_percent_is_refused(bad):
    with pytest.raises(EngineError, match="from 1 to 100"):
        DutyCycle(bad)
    d = DutyCycle(70)
    with pytest.raises(EngineError, match="from 1 to 100"):
        d.percent = bad
    assert d.percent == 70


# --------------------------------------------------------------------------- on a micro model

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_test_model(tmp_path_factory.mktemp("duty") / "micro.gguf", "micro", seed=5)
    return load_engine(path, ctx=64, chunk=8)


def _run(engine, prompt, d):
    s = engine.new_session()
    s.sync(prompt, duty=d)
    logits = np.asarray(s.logits).copy()
    out = list(generate(s, Sampler(temperature=1.0, seed=3), max_tokens=10, duty=d))
    return out, logits, s.tokens


def test_power_50_decodes_the_same_tokens_as_full_power(engine):
    prompt = [int(x) for x in np.random.default_rng(2).integers(0, 512, size=21)]  # 3 chunks of 8
    t = FakeTime(tick=0.01)
    half = duty(50, t)
    full_tokens, full_logits, full_state = _run(engine, prompt, DutyCycle(100))
    half_tokens, half_logits, half_state = _run(engine, prompt, half)
    assert half_tokens == full_tokens and len(set(full_tokens)) > 1
    assert np.array_equal(half_logits, full_logits)
    assert half_state == full_state
    # A rest after each of the 3 prefill chunks and between each of the 10 tokens (none after
    # the last one: it is handed out without a step).
    assert len(t.slept) == 3 + 9
