"""An Engine loaded on one thread is usable from any other (the TUI loads the model in a worker).

MLX streams are thread-local: an array that is still a lazy graph when it crosses to another
thread cannot be evaluated there ("There is no Stream(cpu, 0) in current thread"). The engine
therefore hands out only materialised arrays (weights at load, the empty state, imported states);
these tests move an engine, its sessions and their snapshots between threads and check that the
results are the same bits as a run that never left one thread.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ds4agent.engine import load_engine
from ds4agent.testmodels import make_test_model

TOKENS = [3, 17, 250, 9, 44, 101, 7, 500, 12, 33, 64, 2]


def _in_thread(fn, *args):
    """Run fn(*args) on a fresh thread; return its result or re-raise its exception here."""
    box: dict[str, object] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # re-raised on the calling thread
            box["error"] = err

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_test_model(tmp_path_factory.mktemp("threads") / "micro.gguf", "micro", seed=5)


@pytest.fixture(scope="module")
def reference(model_path):
    """Logits after the prompt and after two decode steps, all on the main thread."""
    s = load_engine(model_path, ctx=32, chunk=4).new_session()
    s.sync(TOKENS)
    first = s.logits.copy()
    return first, s.step(5).copy(), s.step(6).copy()


def test_engine_loaded_in_worker_runs_on_other_threads(model_path, reference):
    engine = _in_thread(lambda: load_engine(model_path, ctx=32, chunk=4))
    session = _in_thread(engine.new_session)  # created on a third thread
    _in_thread(session.sync, TOKENS)  # prefill on a fourth
    assert np.array_equal(session.logits, reference[0])
    assert np.array_equal(session.step(5), reference[1])  # decode on the main thread
    assert np.array_equal(_in_thread(session.step, 6), reference[2])


def test_snapshot_and_import_cross_threads(model_path, reference):
    engine = load_engine(model_path, ctx=32, chunk=4)  # main thread this time
    session = engine.new_session()
    _in_thread(session.sync, TOKENS)
    snap = _in_thread(session.snapshot)
    payload = _in_thread(session.export_state)
    session.step(5)
    _in_thread(session.rewind, snap)
    assert np.array_equal(_in_thread(session.step, 5), reference[1])

    other = engine.new_session()
    _in_thread(other.import_state, payload)  # imported on one thread, continued on another
    assert np.array_equal(other.step(5), reference[1])
    assert np.array_equal(_in_thread(other.step, 6), reference[2])
