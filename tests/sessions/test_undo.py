"""The undo log survive what a crash leaves: a torn last log line, a restore killed midway
(no temp file in the work tree, and the next rewind sees the restored files as the agent's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds4agent.sessions.undo import UndoLog
from tests.support.timeouts import within

ROOT = Path(__file__).resolve().parents[2]


def _written(ckpt: UndoLog, path: Path, before: bytes | None, after: bytes) -> None:
    """What the write tool does: the file changes, then the undo log records it."""
    path.write_bytes(after)
    ckpt.record(str(path), before, after)


@pytest.mark.parametrize("torn", [b'{"at": 3, "path": "/x/a", "bef', b'{"at": 3, "path": "/x/a", "before": null, "after": "00"}'])
def test_a_record_after_a_torn_last_line_starts_its_own_line(tmp_path, torn):
    ckpt = UndoLog(tmp_path / "ckpt")
    ckpt.at = 1
    ckpt.record("/w/one", None, b"1")
    with open(ckpt.dir / "log.jsonl", "ab") as f:
        f.write(torn)  # a power cut in the middle of the next append: no newline at the end
    ckpt.at = 2
    ckpt.record("/w/two", b"1", b"2")
    entries = ckpt.entries()
    complete = torn.endswith(b"}")
    assert [e["path"] for e in entries] == ["/w/one", *(["/x/a"] if complete else []), "/w/two"]
    assert entries[-1] == {"at": 2, "path": "/w/two", "before": entries[-1]["before"], "after": entries[-1]["after"]}
    # The next record is on a line of its own as well.
    ckpt.record("/w/three", None, b"3")
    assert [e["path"] for e in ckpt.entries()][-2:] == ["/w/two", "/w/three"]


def test_a_huge_sparse_file_at_a_recorded_path_is_not_read(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    ckpt = UndoLog(tmp_path / "ckpt")
    ckpt.at = 4
    _written(ckpt, work / "a.txt", b"old\n", b"new\n")
    with open(work / "a.txt", "r+b") as f:
        f.truncate(1 << 40)  # a terabyte of holes: hashing it would never end
    with within(10):
        plan = ckpt.plan(4)
    assert plan.clean == () and [c.reason for c in plan.conflicts] == ["changed since the agent last wrote it"]


CHILD = r"""
import os, signal, sys
from pathlib import Path
import ds4agent.sessions.undo as cp

work, root, cross = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
ck = cp.UndoLog(root, "ab" * 16)
ck.at = 7
for name in ("a.txt", "b.txt", "c.txt"):
    (work / name).write_bytes(b"agent wrote " + name.encode() + b"\n")
    ck.record(str(work / name), b"before " + name.encode() + b"\n", b"agent wrote " + name.encode() + b"\n")
if cross:
    cp.UndoLog._stages_for = lambda self, fd: False  # as if the tree were on another filesystem
real_replace, calls = os.replace, []

def replace(*a, **k):
    calls.append(a)
    if len(calls) == 2:  # the second restored file: its new content is written, not yet in place
        print("KILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(*a, **k)

os.replace = replace
ck.apply(ck.plan(7))
print("NOT REACHED", flush=True)
"""


@pytest.mark.parametrize("cross", [False, True], ids=["staged", "cross-filesystem"])
def test_kill_during_a_restore_leaves_no_temp_file_and_no_false_conflict(tmp_path, cross):
    work, root = tmp_path / "work", tmp_path / "ckpt"
    work.mkdir()
    res = subprocess.run([sys.executable, "-c", CHILD, str(work), str(root), "1" if cross else "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr
    assert res.stdout.split() == ["KILL"]
    names = sorted(p.name for p in work.iterdir())
    if not cross:
        # Staged in the undo directory: nothing but the user's files in the tree, even now.
        assert names == ["a.txt", "b.txt", "c.txt"]
    restored_first = [n for n in ("a.txt", "b.txt", "c.txt") if (work / n).read_bytes().startswith(b"before")]
    assert len(restored_first) == 1

    ck = UndoLog(root, "ab" * 16)
    plan = ck.plan(7)
    # The next rewind: no temp file left anywhere in the tree, and the file the killed restore
    # already put back is not "changed by someone else".
    assert sorted(p.name for p in work.iterdir()) == ["a.txt", "b.txt", "c.txt"]
    assert plan.conflicts == () and len(plan.clean) == 3
    restored, refused = ck.apply(plan)
    assert refused == () and len(restored) == 3
    assert {n: (work / n).read_bytes() for n in ("a.txt", "b.txt", "c.txt")} == {
        n: b"before " + n.encode() + b"\n" for n in ("a.txt", "b.txt", "c.txt")}
    assert ck.entries() == [] and not list((root / ck.key / "staging").iterdir())
    assert not (root / ck.key / "restoring.jsonl").exists()


def test_a_restore_does_not_follow_a_directory_swapped_for_a_link(tmp_path):
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    ckpt = UndoLog(tmp_path / "ckpt")
    ckpt.at = 1
    _written(ckpt, work / "sub" / "f.txt", b"old\n", b"new\n")
    os.rename(work / "sub", work / "sub.moved")
    os.symlink(outside, work / "sub")
    (outside / "f.txt").write_bytes(b"new\n")  # what the agent wrote, so only the path tells
    plan = ckpt.plan(1)
    assert [c.reason for c in plan.conflicts] == ["a directory on its path is now a symbolic link"]
    restored, refused = ckpt.apply(plan, force=True)
    assert restored == () and len(refused) == 1 and (outside / "f.txt").read_bytes() == b"new\n"
    assert json.loads((ckpt.dir / "log.jsonl").read_text().splitlines()[0])["path"] == str(work / "sub" / "f.txt")
