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


def test_every_parallel_kernel_launch_holds_the_split_lock():
    """numba's portable threading layer (workqueue: macOS without libomp) aborts the process on two
    concurrent parallel launches, so every call of a parallel kernel (a `_jit_split` function of
    the kernel modules) sits inside `with SPLIT_LOCK:`, or in the `split` argument of
    qmatrix.by_rows, which calls it under the lock. Read from the source, for every caller."""
    import ast
    from pathlib import Path

    engine = Path(__file__).resolve().parents[2] / "ds4agent" / "engine"
    parallel = set()
    for name in ("fkernels.py", "q8kernels.py", "qkernels.py"):
        for node in ast.parse((engine / name).read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "_jit_split" for d in node.decorator_list):
                parallel.add(node.name)
    assert {"expert_rows_split", "dense_rows_split", "swiglu_weighted", "quantize_split"} <= parallel
    launches, unlocked = 0, []
    for path in sorted(engine.rglob("*.py")):
        if path.name in ("fkernels.py", "q8kernels.py", "qkernels.py"):
            continue  # the kernels themselves (a parallel kernel calls serial ones)

        def visit(node, locked, path=path):
            nonlocal launches
            if isinstance(node, ast.With) and any(
                    isinstance(item.context_expr, ast.Name) and item.context_expr.id == "SPLIT_LOCK"
                    for item in node.items):
                locked = True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in parallel:
                launches += 1
                if not locked:
                    unlocked.append(f"{path.name}:{node.lineno} {node.func.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "by_rows":
                for k, arg in enumerate(node.args):  # by_rows(rows, work, one, split): split runs locked
                    visit(arg, locked or k == 3)
                return
            for child in ast.iter_child_nodes(node):
                visit(child, locked)

        visit(ast.parse(path.read_text()), False)
    assert launches >= 6 and unlocked == []
    # by_rows itself calls `split` inside the lock
    (by_rows,) = [f for f in ast.parse((engine / "qmatrix.py").read_text()).body
                  if isinstance(f, ast.FunctionDef) and f.name == "by_rows"]
    assert any(isinstance(w, ast.With) and any(getattr(i.context_expr, "id", "") == "SPLIT_LOCK" for i in w.items)
               and any(isinstance(c, ast.Call) and getattr(c.func, "id", "") == "split" for c in ast.walk(w))
               for w in ast.walk(by_rows))
