import pytest

from ds4agent.tools import run_tool
from ds4agent.tools.permissions import Answer, PermissionPolicy, command_programs, denied_result


@pytest.mark.parametrize("tool", ["read", "more", "search", "list", "bash_status", "bash_stop", "nope"])
@pytest.mark.parametrize("mode", ["ask", "auto", "read-only"])
def test_reading_tools_never_ask(mode, tool, ctx):
    assert PermissionPolicy(mode).check(tool, {"path": "/etc/passwd"}, ctx).kind == "allow"


def test_auto_allows_bash_and_file_changes_in_the_tree(ctx):
    p = PermissionPolicy("auto")
    assert p.check("bash", {"command": "rm -rf build"}, ctx).allowed
    assert p.check("write", {"path": "notes/new.txt", "content": "x"}, ctx).allowed
    (ctx.cwd / "a.txt").write_text("one\n")
    assert p.check("edit", {"path": "a.txt", "old": "one", "new": "two"}, ctx).allowed


@pytest.mark.parametrize("mode", ["ask", "auto"])
@pytest.mark.parametrize("where", ["~/.bashrc", "../x", "/tmp/elsewhere.txt", ".git/hooks/pre-commit",
                                   "sub/../.git/config"])
def test_file_changes_outside_the_tree_or_in_git_ask_in_every_mode(ctx, mode, where):
    """No sandbox holds the file tools: outside the tree and in .git/ (hooks run code) the user is
    asked, in auto mode too, and the question offers no session-wide answer."""
    (ctx.cwd / ".git" / "hooks").mkdir(parents=True, exist_ok=True)
    d = PermissionPolicy(mode).check("write", {"path": where, "content": "x"}, ctx)
    assert d.kind == "ask" and d.question is not None
    assert d.question.session_label is None and d.question.scope == ()


def test_read_only_refuses_writes_and_bash(ctx):
    p = PermissionPolicy("read-only")
    d = p.check("bash", {"command": "ls"}, ctx)
    assert d.kind == "deny"
    assert d.result().text == ("Tool error: bash is not allowed in read-only mode: no commands can be run "
                               "in this session; use read, search and list instead\n")
    for tool in ("write", "edit"):
        d = p.check(tool, {"path": "a.txt", "content": "x"}, ctx)
        assert d.result().text == (f"Tool error: {tool} is not allowed in read-only mode: files cannot be "
                                   "changed in this session\n")
        assert not d.result().ok


def test_bash_session_answer_covers_the_program(ctx):
    p = PermissionPolicy()
    d = p.check("bash", {"command": "pytest -q tests"}, ctx)
    assert d.kind == "ask"
    q = d.question
    assert (q.title, q.preview, q.preview_kind) == ("Run this shell command?", "pytest -q tests", "command")
    assert q.session_label == "allow `pytest …` commands for this session"
    p.remember(q, Answer.session())
    assert p.check("bash", {"command": "pytest -x tests/tools"}, ctx).allowed
    assert p.check("bash", {"command": "make test"}, ctx).kind == "ask"
    # A compound command runs only if every program in it was allowed.
    d = p.check("bash", {"command": "cd src && pytest | tail -3"}, ctx)
    assert d.question.session_label == "allow `cd …`, `pytest …` and `tail …` commands for this session"
    p.remember(d.question, Answer.session())
    assert p.check("bash", {"command": "cd x; tail -f log"}, ctx).allowed


def test_bash_once_and_deny_are_not_remembered(ctx):
    p = PermissionPolicy()
    q = p.check("bash", {"command": "ls -l"}, ctx).question
    p.remember(q, Answer.once())
    assert p.check("bash", {"command": "ls -l"}, ctx).kind == "ask"
    p.remember(q, Answer.deny("not now"))
    assert p.check("bash", {"command": "ls -l"}, ctx).kind == "ask"
    assert denied_result(Answer.deny("use make instead")).text == (
        "Tool error: permission denied by the user; the user says: use make instead\n")
    assert denied_result(Answer.deny()).text == "Tool error: permission denied by the user\n"
    assert not Answer.deny().allowed and Answer.once().allowed


@pytest.mark.parametrize("command", ["echo $(rm -rf x)", "sudo make install", "ls | xargs rm", "$EDITOR f",
                                     "echo 'unbalanced"])
def test_opaque_commands_offer_no_session_scope(command, ctx):
    p = PermissionPolicy()
    q = p.check("bash", {"command": command}, ctx).question
    assert q.session_label is None and q.scope == ()
    p.remember(q, Answer.session())
    assert p.check("bash", {"command": command}, ctx).kind == "ask"


def test_command_programs():
    assert command_programs("FOO=1 make -j4 2>&1 > log.txt") == ("make",)
    assert command_programs("for f in *.py; do wc -l $f; done") == ("wc",)
    assert command_programs("if test -f x; then cat x; fi\nls") == ("test", "cat", "ls")
    assert command_programs("python -c 'a; b && c'") == ("python",)


def test_write_asks_with_diff_and_session_answer_covers_workspace(ctx):
    (ctx.cwd / "a.txt").write_text("one\ntwo\n")
    run_tool("read", {"path": "a.txt"}, ctx)
    p = PermissionPolicy()
    d = p.check("write", {"path": "a.txt", "content": "one\nTWO\n"}, ctx)
    q = d.question
    assert d.kind == "ask" and q.title == "Overwrite a.txt?" and q.preview_kind == "diff"
    assert "-two\n+TWO\n" in q.preview
    assert q.session_label == "allow write in the working directory for this session"  # fits 80 columns
    assert not q.outside_workspace and q.path == str((ctx.cwd / "a.txt").resolve())
    assert (ctx.cwd / "a.txt").read_text() == "one\ntwo\n"  # checking never writes
    assert p.check("write", {"path": "new.txt", "content": "x"}, ctx).question.title == "Create new.txt?"
    p.remember(q, Answer.session())
    assert p.check("write", {"path": "sub/new.txt", "content": "x"}, ctx).allowed
    assert p.check("edit", {"path": "a.txt", "old": "one", "new": "1"}, ctx).kind == "ask"


def test_writes_outside_the_workspace_always_ask(ctx, tmp_path):
    p = PermissionPolicy()
    q = p.check("write", {"path": "x.txt", "content": "x"}, ctx).question
    p.remember(q, Answer.session())
    outside = tmp_path / "outside.txt"
    for path in (str(outside), "../outside.txt"):
        d = p.check("write", {"path": path, "content": "x"}, ctx)
        assert d.kind == "ask", path
        assert d.question.outside_workspace and d.question.session_label is None
        assert d.question.title.endswith(" (outside the working directory)?")
        p.remember(d.question, Answer.session())
    assert p.check("write", {"path": str(outside), "content": "x"}, ctx).kind == "ask"
    # A symlink inside the workspace that points outside is outside.
    (ctx.cwd / "escape").symlink_to(tmp_path)
    assert p.check("write", {"path": "escape/f.txt", "content": "x"}, ctx).question.outside_workspace


def test_edit_that_would_fail_is_not_asked_about(ctx):
    (ctx.cwd / "a.txt").write_text("x\n")
    p = PermissionPolicy()
    # The guard refuses this edit (nothing read yet): the tool reports it, nothing to approve.
    assert p.check("edit", {"path": "a.txt", "old": "x", "new": "y"}, ctx).allowed
    run_tool("read", {"path": "a.txt"}, ctx)
    d = p.check("edit", {"path": "a.txt", "old": "x", "new": "y"}, ctx)
    assert d.kind == "ask" and d.question.title == "Edit a.txt?"
    assert [(x.kind, x.text) for x in d.question.diff.lines if x.kind in ("add", "remove")] == [
        ("remove", "x"), ("add", "y")]


def test_unknown_mode_is_a_readable_error():
    with pytest.raises(ValueError, match="unknown permission mode 'yolo'; use one of: ask, auto, read-only, plan"):
        PermissionPolicy("yolo")
