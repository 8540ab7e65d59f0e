"""Session files seen from the agent: unreadable files in /list and /load, [S] files from
earlier ds4 builds, a KV directory open to other users, a private --trace file."""

from __future__ import annotations

import os

from ds4agent.agent import events as ev
from ds4agent.protocol.tokenizer import Tokenizer
from tests.support.agent_harness import AgentHarness, of

TOK = Tokenizer.load()


def test_trace_file_is_created_private(tmp_path, tools):
    """A trace holds the transcript: it is created 0600 whatever the umask allows."""
    trace = tmp_path / "private-trace.log"
    old = os.umask(0o022)
    try:
        h = AgentHarness.build(tmp_path, tools=tools, trace=trace)
        h.stop()
    finally:
        os.umask(old)
    assert trace.stat().st_mode & 0o777 == 0o600
    assert trace.read_text().strip()


def test_kv_directory_that_stays_open_to_others_is_reported_at_startup(tmp_path, tools, monkeypatch):
    from ds4agent.sessions.store import SessionStore

    (tmp_path / "kv").mkdir()
    os.chmod(tmp_path / "kv", 0o755)
    real_chmod = os.chmod

    def refuse(path, mode, **kw):
        if str(path) == str(tmp_path / "kv"):
            raise PermissionError(1, "Operation not permitted")
        return real_chmod(path, mode, **kw)

    monkeypatch.setattr(os, "chmod", refuse)
    h = AgentHarness.build(tmp_path, tools=tools, store=SessionStore(tmp_path / "kv"))
    h.stop()
    warnings = [e.text for e in of(h.events, ev.Notice) if e.level == "warning"]
    assert warnings == [f"KV directory {tmp_path / 'kv'} is open to other users (mode 0755) and could not "
                        "be restricted to 0700: Operation not permitted"]


def test_unreadable_session_files_are_listed_explained_and_deletable(tmp_path, tools):
    """A damaged session file shows up in /list (and the picker) with the
    reason, /load of its prefix says why it cannot be loaded, and it can be deleted."""
    from ds4agent.ui import fmt

    h = AgentHarness.build(tmp_path, tools=tools)
    bad = tmp_path / "kv" / ("ab" + "0" * 38 + ".kv")
    bad.write_bytes(b"KVC\x01 broken")
    lst = of(h.command(h.agent.list_sessions), ev.SessionList)[0]
    assert [(s.short_id, s.title, s.unreadable, s.size_bytes) for s in lst.sessions] == [
        ("ab000000", "(unreadable session: invalid KV header)", "invalid KV header", 11)]
    assert fmt.session_list_lines(lst.directory, lst.sessions, now=lst.sessions[0].last_used)[1] == \
        "  ab000000 (0s ago) (unreadable session: invalid KV header)  [11 B]"
    evs = h.command(lambda: h.agent.load("AB00"))
    assert of(evs, ev.Error)[0].text == "load failed: session ab000000 cannot be loaded: invalid KV header"
    evs = h.command(lambda: h.agent.load("zzz"))
    assert of(evs, ev.Error)[0].text == "load failed: no saved session matches zzz"
    assert h.agent.delete_session(lst.sessions[0].id) == str(bad) and not bad.exists()
    assert of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions == ()
    h.stop()


def test_s_file_from_an_earlier_ds4_loads_and_the_resave_keeps_it(tmp_path, tools, monkeypatch):
    """kvc-format.md §13: an [S] file (byte 20 = 0, payload version 1, no title,
    named SHA-1 of its text) loads like a legacy session; the next save writes an [L] file under
    the title identity and leaves the [S] file exactly as it was (an earlier ds4 may share it)."""
    from ds4agent.sessions.kvc import session_identity
    from tests.sessions.helpers import s_layout
    from tests.support.untitled_session import untitled_session

    h, old = untitled_session(tmp_path, tools, monkeypatch, "question from an old build")
    old.write_bytes(s_layout(old.read_bytes()))
    s_bytes = old.read_bytes()
    listed = of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions
    assert [(s.id, s.title) for s in listed] == [(old.stem, "question from an old build")]
    loaded = of(h.command(lambda: h.agent.load(old.stem[:10])), ev.SessionLoaded)[0]
    assert loaded.title == "question from an old build" and loaded.prefilled == 0
    h.turn("more")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.id == session_identity(b"question from an old build", 1_700_000_000)
    new = (tmp_path / "kv" / f"{saved.id}.kv").read_bytes()
    assert new[20] == 2 and new[6] & 0x08
    assert old.read_bytes() == s_bytes
    h.stop()
