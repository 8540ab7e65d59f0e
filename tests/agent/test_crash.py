"""Crash safety: kill -9 the agent process mid-turn; the next start offers to resume the journal,
loads the nearest saved KV whose text is a prefix, and prefills only the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ds4agent.agent import events as ev
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import EOS
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import os, signal, sys
from pathlib import Path
from tests.support.rec_tool import RecTool
from tests.support.agent_harness import AgentHarness
from tests.support.scripted_engine import reply

root = Path(sys.argv[1])
h = AgentHarness.build(root, [reply("First answer.", think="t"),
                              reply("", think="t", calls=[("alpha", {"x": "1"})]),
                              reply(sys.argv[2], think="t")],
                       tools=[RecTool("alpha", "A1\n"), RecTool("beta", "B1\n")], journal_interval=0)
h.turn("first task")
h.command(h.agent.save)
print("SAVED", len(h.ids), flush=True)

def hook(session, pos):
    if session.tokens[-1] != 1 and pos == 40 and h.engine.responses_started == 3:
        print("KILL", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

h.engine.on_step = hook
h.turn("second task")
print("NOT REACHED", flush=True)
"""


LONG = "This answer never finishes because the process dies while it is being written. " * 3


def test_kill_mid_turn_then_resume(tmp_path, tools):
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), LONG], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == -9, res.stderr
    lines = res.stdout.split()
    assert lines[0] == "SAVED" and "KILL" in lines and "NOT" not in lines
    saved_len = int(lines[1])
    journals = list((tmp_path / "journal").glob("*.journal"))
    assert len(journals) == 1

    h = AgentHarness.build(tmp_path, tools=tools, answer=lambda e: "y")
    q = of(h.events, ev.Question)
    assert [x.kind for x in q] == ["resume"] and "second task" not in q[0].question
    loaded = of(h.events, ev.SessionLoaded)[0]
    assert loaded.resumed
    ids = h.ids
    user2 = template.render(template.user_turn_pieces("second task", think_mode="think"))
    results = template.render(template.tool_results_pieces(["A1\n"], think_mode="think"))
    # Journalled after round 1 of turn 2 (user turn, the tool round, its results) and, during the
    # round that was running when the process died, every 16 tokens (journal_interval=0): its
    # first 32 tokens survive, closed with an EOS (as an interrupt would).
    partial = reply(LONG, think="t")[:32]
    tail = ids[saved_len:]
    assert tail[: len(user2)] == user2
    assert tail[-1] == EOS and tail[-33:-1] == partial
    assert tail[-33 - len(results): -33] == results
    assert h.live == tuple(ids)
    assert loaded.prefilled == len(ids) - saved_len  # only the part after the saved session
    assert [i.text for i in loaded.history if i.kind == "user"] == ["first task", "second task"]
    assert not list(j for j in (tmp_path / "journal").glob("*.journal") if j.name == journals[0].name)
    # The resumed session is unsaved and continues normally.
    assert of(h.events, ev.Status)[-1].unsaved
    h.engine.add([EOS])
    h.turn("third")
    h.stop()


def test_no_offer_after_a_saved_session_exits(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [[EOS]], tools=tools)
    h.turn("x")
    h.command(h.agent.save)
    h.stop()
    assert list((tmp_path / "journal").glob("*.journal")) == []
    h2 = AgentHarness.build(tmp_path, tools=tools, answer=lambda e: "y")
    assert of(h2.events, ev.Question) == []
    h2.stop()


def test_shutdown_with_unsaved_turns_keeps_journal_quit_no_discards(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [[EOS]], tools=tools)
    h.turn("keep me")
    h.stop()  # a plain shutdown (no save question): the journal stays for the next start
    assert len(list((tmp_path / "journal").glob("*.journal"))) == 1
    h2 = AgentHarness.build(tmp_path, [[EOS]], tools=tools, answer=lambda e: "y")
    assert of(h2.events, ev.SessionLoaded)[0].resumed
    h2.turn("more")
    h2.answer = lambda e: "n"  # quit -> "Save current session?" -> no: the journal is discarded
    h2.agent.quit()
    h2.until(lambda e: isinstance(e, ev.Exited))
    assert [q.kind for q in of(h2.events, ev.Question)] == ["resume", "save"]
    assert list((tmp_path / "journal").glob("*.journal")) == []


def test_journal_is_replaced_atomically_private_and_round_trips(tmp_path):
    import os
    import stat

    from ds4agent.agent.journal import Journal, decode

    j = Journal(tmp_path / "j")
    j.write([0, 5, 7], {"cwd": "/x", "title_hex": "e9"})
    j.write([0, 5, 7, 9], {"cwd": "/x", "title_hex": "e9ff"})
    assert sorted(p.suffix for p in (tmp_path / "j").iterdir()) == [".journal", ".lock"]  # no temp left
    assert stat.S_IMODE(os.stat(j.path).st_mode) == 0o600
    assert decode(j.path.read_bytes()) == ([0, 5, 7, 9], {"cwd": "/x", "title_hex": "e9ff"})
    j.close()
    assert list((tmp_path / "j").iterdir()) == []


def test_journal_writes_leave_the_fsyncs_to_the_syncer_thread(tmp_path, monkeypatch):
    # The agent loop writes the journal about twice a round; two fsyncs on the worker thread
    # were most of its own per-token cost. The file is in place when write returns (all a
    # process crash needs); the fsyncs run on the syncer, and close waits for the last one.
    import os
    import threading

    from ds4agent import fsutil
    from ds4agent.agent import journal as jmod

    synced: list[tuple[str, str]] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(("fd", threading.current_thread().name)),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(jmod, "fsync_file", lambda p: (synced.append((str(p), threading.current_thread().name)),
                                                       fsutil.fsync_file(p))[1])
    j = jmod.Journal(tmp_path / "j")
    j.write([0, 5, 7], {"cwd": "/x"})
    assert jmod.decode(j.path.read_bytes())[0] == [0, 5, 7]  # in place before any sync
    j.sync()
    assert (str(j.path), "journal-sync") in synced
    assert all(name == "journal-sync" for _, name in synced)  # none on the writing thread
    j.write([0, 5, 7, 9], {"cwd": "/x"})
    j.close(keep=True)  # waits for the sync still owed
    assert [s for s in synced if s[0] == str(j.path)] == [(str(j.path), "journal-sync")] * 2


def test_a_link_at_the_journal_name_is_replaced_not_written_through(tmp_path):
    from ds4agent.agent.journal import Journal

    j = Journal(tmp_path / "j")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    j.path.symlink_to(victim)
    j.write([0, 5], {"cwd": "/x"})
    assert victim.read_text() == "keep me"
    assert j.path.is_file() and not j.path.is_symlink()
    j.close()


def test_failed_resume_keeps_the_journal_and_starts_clean(tmp_path, tools, monkeypatch):
    from ds4agent.engine import EngineError
    from ds4agent.protocol.tokenizer import USER
    from tests.support.scripted_engine import ScriptedSession

    h = AgentHarness.build(tmp_path, [[EOS]], tools=tools)
    h.turn("keep me")
    kept = h.ids
    h.stop()
    real_sync = ScriptedSession.sync

    def failing_sync(self, tokens, **kw):
        if USER in tokens:
            raise EngineError("the device is gone")
        return real_sync(self, tokens, **kw)

    monkeypatch.setattr(ScriptedSession, "sync", failing_sync)
    h2 = AgentHarness.build(tmp_path, tools=tools, answer=lambda e: "y")
    assert [e.text for e in of(h2.events, ev.Error)] == ["resume failed: the device is gone"]
    assert h2.ids == h2.worker.conv.system_ids and not h2.worker.conv.identity.dirty
    h2.stop()
    monkeypatch.setattr(ScriptedSession, "sync", real_sync)
    h3 = AgentHarness.build(tmp_path, tools=tools, answer=lambda e: "y")  # offered again
    assert of(h3.events, ev.SessionLoaded)[0].resumed and h3.ids == kept
    h3.stop()


def test_a_finished_round_is_journalled_before_its_tools_run(tmp_path):
    # A tool may run for minutes (a build, a test suite): a crash then must keep the round that
    # asked for it, not only the user's message.
    from ds4agent.agent.journal import decode
    from tests.support.rec_tool import RecTool

    seen: list[bytes] = []

    def look(args) -> str:
        [journal] = (tmp_path / "journal").glob("*.journal")
        tokens, _ = decode(journal.read_bytes())
        seen.append(h.worker.tok.decode_bytes(tokens))
        return "done\n"

    h = AgentHarness.build(tmp_path, [reply("Let me look.", think="t", calls=[("alpha", {"x": "1"})]),
                                      reply("Looked.", think="t")],
                           tools=[RecTool("alpha", fn=look)], journal_interval=1e9)
    h.turn("look around")
    [during] = seen
    assert h.text().startswith(during)
    assert b"look around" in during and b"Let me look." in during
    assert "｜DSML｜invoke".encode() in during  # the call that was running
    h.stop()
