"""Crash safety: a save killed at any moment leaves the old file or the new one, never a partial .kv,
and the orphaned temp file is cleaned up by a later open once it is stale."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ds4agent.sessions.kvc import is_scan_name, verify_kvc
from ds4agent.sessions.store import SessionStore

from .helpers import TINY, random_state, session_text

REPO = Path(__file__).resolve().parents[2]

CHILD_PRELUDE = """
import sys, time
sys.path.insert(0, {repo!r})
from ds4agent.sessions import kvc
from ds4agent.sessions.store import SessionStore
from tests.sessions.helpers import TINY, random_state, session_text
from ds4agent.sessions.payload import FLASH_SHAPE
store = SessionStore({directory!r})
"""


def _spawn(code: str, directory: Path) -> subprocess.Popen:
    script = CHILD_PRELUDE.format(repo=str(REPO), directory=str(directory)) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def _kill_after(child: subprocess.Popen, marker: str, count: int = 1) -> None:
    seen = 0
    for line in child.stdout:
        if line.strip() == marker:
            seen += 1
            if seen == count:
                break
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL


def test_kill_in_the_middle_of_the_payload_keeps_the_old_file(tmp_path):
    store = SessionStore(tmp_path)
    old = store.save_session(session_text("crash me"), random_state(TINY, 5, 64), shape=TINY, quant_bits=2)
    before = old.path.read_bytes()
    child = _spawn(f"""
        def stalled(f, state, shape):
            f.write(b"\\0" * 4096)
            f.flush()
            print("MID", flush=True)
            time.sleep(600)
        kvc.write_payload = stalled
        store.save_session(session_text("crash me", "second turn"), random_state(TINY, 9, 64), shape=TINY,
                           quant_bits=2, title={old.title!r}, created_at={old.created_at})
    """, tmp_path)
    _kill_after(child, "MID")
    assert old.path.read_bytes() == before
    kv_files = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".kv"))
    assert kv_files == [old.path.name]
    temps = [p for p in tmp_path.iterdir() if ".kv.tmp." in p.name]
    assert len(temps) == 1 and temps[0].name.startswith(old.path.name + ".tmp.")
    assert [s.id for s in store.list_sessions()] == [old.id]
    # a later open removes the orphan once it is stale (younger ones may be another writer's)
    SessionStore(tmp_path)
    assert temps[0].exists()
    os.utime(temps[0], (1, 1))
    SessionStore(tmp_path)
    assert not temps[0].exists()


def test_kill_during_repeated_large_saves_never_leaves_a_partial_file(tmp_path):
    child = _spawn("""
        state = random_state(FLASH_SHAPE, 1, 4096)
        i = 0
        while True:
            store.save_session(session_text(f"turn {i % 3}"), state, shape=FLASH_SHAPE, quant_bits=2,
                               title=f"t{i % 3}".encode(), created_at=1000)
            i += 1
            print("SAVED", flush=True)
    """, tmp_path)
    _kill_after(child, "SAVED", count=4)
    kv = [p for p in tmp_path.iterdir() if is_scan_name(p.name)]
    assert 1 <= len(kv) <= 3
    for path in kv:
        result = verify_kvc(path, quant_bits=2)
        assert result.ok, result.error
        assert result.payload.header.n_tokens == 1
    assert all(p.name.endswith(".kv") or ".kv.tmp." in p.name for p in tmp_path.iterdir())
