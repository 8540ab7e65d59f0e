"""A write killed between its temp file and the rename leaves `.<name>.<hex>.tmp` in the tree; the
agent removes such files when it starts, and nothing else."""

from __future__ import annotations

import os
import time

from ds4agent.tools.leftovers import STALE_SECONDS, remove_stale_temps


def test_stale_write_temps_are_removed_and_nothing_else(tmp_path):
    old = time.time() - STALE_SECONDS - 60
    (tmp_path / "src" / "deep").mkdir(parents=True)
    (tmp_path / "node_modules").mkdir()
    stale = [tmp_path / ".main.py.0a1b2c3d.tmp", tmp_path / "src" / "deep" / ".notes.md.deadbeef.tmp"]
    fresh = tmp_path / "src" / ".lib.py.12345678.tmp"  # another instance may be writing it now
    kept = [tmp_path / "report.tmp", tmp_path / ".cache.tmp", tmp_path / ".x.py.NOTHEX00.tmp",
            tmp_path / "node_modules" / ".pkg.js.0a1b2c3d.tmp", fresh]
    for p in stale + kept:
        p.write_text("partial")
    for p in stale + kept[:-1]:
        os.utime(p, (old, old))
    removed = remove_stale_temps(tmp_path)
    assert sorted(removed) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_the_agent_removes_them_when_it_starts(tmp_path):
    from tests.support.agent_harness import AgentHarness

    work = tmp_path / "work"
    work.mkdir()
    leftover = work / ".app.py.abcdef01.tmp"
    leftover.write_text("half a file")
    old = time.time() - STALE_SECONDS - 1
    os.utime(leftover, (old, old))
    h = AgentHarness.build(tmp_path)
    assert not leftover.exists()
    h.stop()
