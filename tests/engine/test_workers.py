"""The CPU products' Python thread pool (experts/cpu.py Workers): the calling thread takes the
first part, the others run on worker threads, results come back in order, errors after all."""

from __future__ import annotations

import threading

import pytest

from ds4agent.engine.experts.cpu import workers


def test_the_first_part_runs_on_the_calling_thread_and_results_keep_their_order():
    me = threading.get_ident()
    got = workers(3).run([lambda: (0, threading.get_ident()), lambda: (1, threading.get_ident()),
                          lambda: (2, threading.get_ident())])
    assert [i for i, _ in got] == [0, 1, 2]
    assert got[0][1] == me and got[1][1] != me and got[2][1] not in (me, got[1][1])


def test_an_error_is_raised_once_every_part_has_finished():
    finished = threading.Event()

    def slow() -> int:
        finished.wait(5)
        return 1

    def fail() -> int:
        finished.set()
        raise ValueError("part 0 failed")

    with pytest.raises(ValueError, match="part 0 failed"):
        workers(2).run([fail, slow])
    assert finished.is_set()
    assert workers(2).run([lambda: "a", lambda: "b"]) == ["a", "b"]  # the pool still works
    with pytest.raises(ValueError, match="3 parts for a pool of 2 threads"):
        workers(2).run([lambda: 0] * 3)
