"""The sandbox through the agent loop: a session answer for a program does not open the boundary;
a refusal leads to one question for that command (outside the sandbox once, or git metadata)."""

from __future__ import annotations

import subprocess

import pytest

from ds4agent.agent import events as ev
from ds4agent.tools import default_tools, sandbox
from ds4agent.tools.permissions import git_metadata_question
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

pytestmark = pytest.mark.skipif(not sandbox.availability().available, reason="no OS sandbox on this machine")


def _bash(*commands):
    return reply("", think="t", calls=[("bash", {"command": c}) for c in commands])


def _answers(*keys):
    it = iter(keys)
    return lambda e: next(it) if isinstance(e, ev.PermissionRequest) else None


def test_session_answer_then_escape_attempts_are_refused_and_denied(tmp_path):
    (tmp_path / "work").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    commands = ["echo ok \r# ; cp /etc/hostname ../outside/STOLEN", "echo x > ../outside/direct"]
    # "s": allow `echo` for the session (the first command passes the scan as a plain echo); "n" to
    # its run-outside question; "n" to the second, whose scan sees its outside target: its one
    # question is the run-outside question itself.
    h = AgentHarness.build(tmp_path, [_bash(*commands), reply("done", think="")], tools=default_tools(),
                           permission="ask", answer=_answers("s", "n", "n"))
    evs = h.turn("go")
    reqs = of(evs, ev.PermissionRequest)
    assert [r.question.startswith("The sandbox refused writing to") for r in reqs] == [False, True, False]
    assert reqs[2].question.startswith("Run this shell command outside the sandbox (it can then write anywhere)?")
    assert [k for k, _ in reqs[1].options] == ["y", "n"] and [k for k, _ in reqs[2].options] == ["y", "n"]
    results = of(evs, ev.ToolResult)
    assert "The user did not allow it outside the sandbox" in results[0].text
    assert "permission denied by the user" in results[1].text
    assert list(outside.iterdir()) == []
    h.stop()


def test_allow_once_outside_the_sandbox_runs_it_again(tmp_path):
    # A write the scan cannot see (a carriage return hides it): the sandbox refuses, then asks once.
    (tmp_path / "work").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    h = AgentHarness.build(tmp_path, [_bash("echo ok \r# ; echo x > ../outside/f"), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=_answers("y", "y"))
    evs = h.turn("go")
    assert len(of(evs, ev.PermissionRequest)) == 2
    res = of(evs, ev.ToolResult)[0]
    assert res.ok and res.text.startswith("The user allowed this command outside the sandbox; it ran again:\n")
    assert (outside / "f").read_text() == "x\n"
    h.stop()


def test_a_write_the_scan_sees_outside_the_tree_asks_once(tmp_path):
    (tmp_path / "work").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    h = AgentHarness.build(tmp_path, [_bash("echo x > ../outside/f", "echo y > ../outside/g"),
                                      reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=_answers("y", "n"))
    evs = h.turn("go")
    reqs = of(evs, ev.PermissionRequest)
    assert len(reqs) == 2  # one per command: no second question from the sandbox
    assert all(r.question.startswith("Run this shell command outside the sandbox") for r in reqs)
    first, second = of(evs, ev.ToolResult)
    assert first.ok and "The sandbox refused" not in first.text
    assert (outside / "f").read_text() == "x\n"
    assert not second.ok and not (outside / "g").exists()  # the grant was for the first command only
    h.stop()


def test_a_write_into_git_metadata_asks_once(tmp_path):
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    h = AgentHarness.build(tmp_path, [_bash("echo note > .git/description"), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=_answers("y"))
    evs = h.turn("go")
    reqs = of(evs, ev.PermissionRequest)
    assert len(reqs) == 1 and reqs[0].question.startswith("Run this shell command with git metadata writable?")
    assert of(evs, ev.ToolResult)[0].ok
    assert (work / ".git/description").read_text() == "note\n"
    h.stop()


def test_git_commit_asks_about_metadata_once_for_the_session(tmp_path, monkeypatch):
    for name in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(name, "t")
    for name in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(name, "t@t")
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    commit = "git commit -q --allow-empty -m {}"
    h = AgentHarness.build(tmp_path, [_bash(commit.format("one"), commit.format("two")), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=_answers("s", "s"))
    evs = h.turn("commit")
    reqs = of(evs, ev.PermissionRequest)
    assert [r.question for r in reqs][1:] == [git_metadata_question((str((work / ".git").resolve()),))]
    assert "hooks" in reqs[1].question and [k for k, _ in reqs[1].options] == ["y", "s", "n"]
    assert all(r.ok for r in of(evs, ev.ToolResult))
    log = subprocess.run(["git", "-C", str(work), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log == "two\none\n"
    h.stop()


def test_auto_mode_keeps_the_boundary_without_asking(tmp_path):
    (tmp_path / "work").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    h = AgentHarness.build(tmp_path, [_bash("echo x > ../outside/f"), reply("done", think="")],
                           tools=default_tools(), permission="auto")
    evs = h.turn("go")
    assert of(evs, ev.PermissionRequest) == []
    assert "sandbox: the OS sandbox refused writing to" in of(evs, ev.ToolResult)[0].text
    assert list(outside.iterdir()) == []
    h.stop()


def test_no_sandbox_is_said_at_start_and_every_command_asks(tmp_path, monkeypatch):
    monkeypatch.setenv(sandbox.SWITCH, "off")
    sandbox.availability.cache_clear()
    try:
        h = AgentHarness.build(tmp_path, [_bash("echo a", "echo b"), reply("done", think="")],
                               tools=default_tools(), permission="ask", start=False, answer=_answers("y", "y"))
        start = h.start()
        notes = [e.text for e in of(start, ev.Notice) if "no OS sandbox" in e.text]
        assert len(notes) == 1 and "switched off" in notes[0]
        evs = h.turn("go")
        reqs = of(evs, ev.PermissionRequest)
        assert len(reqs) == 2 and all([k for k, _ in r.options] == ["y", "n"] for r in reqs)
        h.stop()
    finally:
        monkeypatch.delenv(sandbox.SWITCH)
        sandbox.availability.cache_clear()


FAMILIES = {
    "cr-comment": "echo ok \r# ; cp /etc/hostname ../outside/STOLEN",
    "sort-o": "sort -o ../outside/sorted /etc/hostname",
    "git-ls-remote": "git ls-remote --upload-pack='touch ../outside/up; git-upload-pack' .",
    "tar-into-hooks": ("mkdir -p x && echo evil > x/pre-commit && tar -cf a.tar x"
                       " && tar -xf a.tar --transform 's,^x,.git/hooks,'"),
    "symlink-then-write": "ln -s ../outside l2 && echo x > l2/f",
    "find-delete": "find . -name HEAD -delete",
}


def _snapshot(root):
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
                  for p in root.rglob("*"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_escape_families_through_the_loop_with_session_answers(tmp_path, name):
    work, outside = tmp_path / "work", tmp_path / "outside"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    outside.mkdir()
    before = (_snapshot(outside), _snapshot(work / ".git"))
    asked = []

    def answer(e):
        if not isinstance(e, ev.PermissionRequest):
            return None
        asked.append(e.question)
        keys = [k for k, _ in e.options]
        if e.question.startswith(("The sandbox refused", "Allow git", "Run this shell command outside the sandbox",
                                  "Run this shell command with git metadata writable")):
            return "n"  # the boundary question: no
        return "s" if "s" in keys else "y"  # anything else: yes, for the session where offered

    h = AgentHarness.build(tmp_path, [_bash(FAMILIES[name], FAMILIES[name]), reply("done", think="")],
                           tools=default_tools(), permission="ask", answer=answer)
    h.turn("go")
    h.stop()
    assert (_snapshot(outside), _snapshot(work / ".git")) == before
