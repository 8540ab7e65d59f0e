"""The session index beside the KV directory, and undo log going with their session."""

from __future__ import annotations

import io

import pytest

from ds4agent.cli import parse
from ds4agent.commands import kv as kv_command
from ds4agent.sessions import undo
from ds4agent.sessions.index import SessionIndex, index_path
from ds4agent.sessions.store import SessionStore
from ds4agent.sessions.undo import UndoLog

from .helpers import TINY, random_state, session_text


def _saved(store, text, now):
    return store.save_session(session_text(text), random_state(TINY, 9, 64), shape=TINY, quant_bits=2, now=now)


def test_index_lives_beside_the_directory_and_survives_damage(tmp_path):
    kv = tmp_path / "kvcache"
    store = SessionStore(kv)
    a = _saved(store, "a task", 1_760_000_000)
    idx = SessionIndex(kv)
    assert index_path(kv) == tmp_path / "kvcache.index.json"
    idx.record(a.id, cwd=tmp_path / "proj", now=5)
    assert idx.latest_for(tmp_path / "proj") == a.id
    assert list(kv.iterdir()) == [a.path]  # nothing of ours inside the KV directory
    index_path(kv).write_text("{not json")
    assert idx.read() == {} and idx.latest_for(tmp_path / "proj") is None
    # A session whose file is gone is never chosen, and is pruned at the next write.
    idx.record(a.id, cwd=tmp_path / "proj", now=5)
    idx.record("f" * 40, cwd=tmp_path / "proj", now=9)
    assert idx.latest_for(tmp_path / "proj") == a.id
    b = _saved(store, "b task", 1_760_000_100)
    idx.record(b.id, cwd=tmp_path / "other", now=10)
    assert set(idx.read()) == {a.id, b.id}


def test_kv_rm_removes_the_sessions_undo_log_and_index_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(undo, "default_root", lambda: tmp_path / "state" / "checkpoints")
    kv = tmp_path / "kv"
    store = SessionStore(kv)
    s = _saved(store, "a task", 1_760_000_000)
    ck = UndoLog()
    ck.record(str(tmp_path / "f.txt"), None, b"x\n")
    assert ck.dir.is_dir()
    SessionIndex(kv).record(s.id, cwd=tmp_path, undo=ck.key)
    args = parse(["kv", "--kv-dir", str(kv), "rm", s.id[:6]])
    assert kv_command.main(args, out=io.StringIO()) == 0
    assert not ck.dir.exists() and SessionIndex(kv).get(s.id) is None


def test_undo_copies_are_content_addressed_and_survive_a_torn_log_line(tmp_path):
    ck = UndoLog(tmp_path)
    for _ in range(3):
        ck.record(str(tmp_path / "a.txt"), b"same\n", b"same\n")
    assert len(list((ck.dir / "objects").iterdir())) == 1
    with open(ck.dir / "log.jsonl", "a") as f:
        f.write('{"at": 0, "pa')  # a crash mid-append
    assert len(ck.entries()) == 3


def test_sealed_undo_records_are_never_restored(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("new\n")
    ck = UndoLog(tmp_path / "ck")
    ck.at = 500
    ck.record(str(f), b"old\n", b"new\n")
    assert [c.path for c in ck.plan(100).clean] == [str(f)]
    ck.seal()  # a compaction: positions before it mean nothing in the new transcript
    assert ck.plan(0).clean == () and ck.plan(0).conflicts == ()


def test_index_and_undo_files_are_entries_of_their_own_never_written_through_links(tmp_path):
    # The rewind files too: a link planted at their names is replaced.
    kv = tmp_path / "kvcache"
    store = SessionStore(kv)
    a = _saved(store, "a task", 1_760_000_000)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    index_path(kv).symlink_to(victim)
    SessionIndex(kv).record(a.id, cwd=tmp_path, now=5)
    assert victim.read_text() == "keep me"
    assert not index_path(kv).is_symlink() and (index_path(kv).stat().st_mode & 0o777) == 0o600
    assert SessionIndex(kv).latest_for(tmp_path) == a.id

    ckpt = UndoLog(tmp_path / "ckpt")
    ckpt.dir.mkdir(parents=True)
    (ckpt.dir / "log.jsonl").symlink_to(victim)
    with pytest.raises(OSError):  # O_NOFOLLOW refuses the link (ELOOP); the agent warns
        ckpt.record(str(tmp_path / "f"), None, b"x")
    assert victim.read_text() == "keep me"
    (ckpt.dir / "log.jsonl").unlink()
    ckpt.record(str(tmp_path / "f"), b"old", b"x")
    objects = list((ckpt.dir / "objects").iterdir())
    assert len(objects) == 2 and all(p.stat().st_mode & 0o777 == 0o600 for p in objects)
