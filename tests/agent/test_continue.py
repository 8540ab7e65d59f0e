"""--continue / --resume: reopening a saved session at start (TUI, plain and -p share this)."""

from __future__ import annotations

import io
from dataclasses import replace

from ds4agent.agent import events as ev
from ds4agent.cli import build_parser, parse
from ds4agent.sessions.index import SessionIndex
from ds4agent.sessions.store import SessionStore
from ds4agent.ui import headless
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _save_in(tmp_path, store, name, text, now=None):
    cwd = tmp_path / name
    h = AgentHarness.build(tmp_path / f"run-{name}-{text}", [reply("ok", think="t")], store=store, cwd=cwd)
    cwd.mkdir(exist_ok=True)
    h.turn(text)
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    h.stop()
    return saved


def test_continue_picks_the_newest_session_of_this_directory(tmp_path, tools):
    store = SessionStore(tmp_path / "kv")
    a_old = _save_in(tmp_path, store, "proj-a", "old task in a")
    b = _save_in(tmp_path, store, "proj-b", "task in b")
    a_new = _save_in(tmp_path, store, "proj-a", "new task in a")
    idx = SessionIndex(tmp_path / "kv")
    # Saves in the same second: order them explicitly (the newest save of proj-a is a_new).
    idx.record(a_old.id, cwd=tmp_path / "proj-a", now=100)
    idx.record(a_new.id, cwd=tmp_path / "proj-a", now=200)
    idx.record(b.id, cwd=tmp_path / "proj-b", now=300)
    assert idx.latest_for(tmp_path / "proj-a") == a_new.id
    h = AgentHarness.build(tmp_path / "again", tools=tools, store=store, cwd=tmp_path / "proj-a",
                           continue_session=True)
    loaded = of(h.events, ev.SessionLoaded)[0]
    assert loaded.id == a_new.id and h.worker.conv.identity.session_id == a_new.id
    assert [i.text for i in loaded.history if i.kind == "user"] == ["new task in a"]
    h.stop()
    # A directory with no saved session: said, and a new session starts.
    h = AgentHarness.build(tmp_path / "none", tools=tools, store=store, cwd=tmp_path / "elsewhere",
                           continue_session=True)
    assert of(h.events, ev.Error)[0].text.startswith("cannot continue: no saved session of ")
    assert h.worker.conv.identity.session_id == "" and not of(h.events, ev.SessionLoaded)
    h.stop()


def test_resume_prefix_loads_that_session(tmp_path, tools):
    store = SessionStore(tmp_path / "kv")
    saved = _save_in(tmp_path, store, "p", "the task")
    h = AgentHarness.build(tmp_path / "again", tools=tools, store=store, resume=saved.short_id)
    assert of(h.events, ev.SessionLoaded)[0].id == saved.id
    h.stop()


def test_headless_continue_runs_the_task_in_the_saved_session_and_saves_it(tmp_path, tools, monkeypatch):
    from ds4agent.agent import wiring
    from tests.support.scripted_engine import ScriptedEngine

    store = SessionStore(tmp_path / "kv")
    saved = _save_in(tmp_path, store, "proj", "first part")
    eng = ScriptedEngine([reply("Second part done.", think="t")], ctx=16384)
    monkeypatch.setattr(wiring, "engine_loader", lambda path, ctx, device=None, **pipeline: (lambda progress: eng))
    monkeypatch.chdir(tmp_path / "proj")
    args = parse(["--continue", "-p", "do the second part", "--kv-dir", str(tmp_path / "kv"),
                                      "--permission", "auto"])
    args = replace(args, model_path=tmp_path / "unused.gguf")
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    assert headless.main(args) == 0, err.getvalue()
    assert out.getvalue() == "Second part done.\n"
    assert f"saved session {saved.short_id}" in err.getvalue()
    text = (tmp_path / "kv" / f"{saved.id}.kv").read_bytes()  # the same file, grown
    assert b"first part" in text and b"do the second part" in text


def test_headless_refuses_what_it_cannot_continue(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv, message in ((["--continue"], "cannot continue: no saved session of "),
                          (["--resume"], "--resume needs a session id prefix with -p"),
                          (["--resume", "abcdef"], "cannot continue: no saved session matches abcdef")):
        args = replace(parse(argv + ["-p", "x", "--kv-dir", str(tmp_path / "kv")]), model_path=tmp_path / "unused.gguf")
        assert headless.main(args) == 1
        assert message in capsys.readouterr().err


def test_continue_and_resume_are_exclusive_and_parse():
    p = build_parser()
    assert p.parse_args(["--resume"]).resume == ""
    assert p.parse_args(["--resume", "ab12"]).resume == "ab12"
    assert p.parse_args(["--continue"]).continue_session is True
    assert p.parse_args([]).resume is None
