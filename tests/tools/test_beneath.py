"""File tools act beneath the real path that was checked: a path or file that changed between the
permission question and the write is refused, never written through; NUL bytes are tool errors."""

import os

import pytest

import ds4agent.tools.files as files
from ds4agent.tools import run_tool
from ds4agent.tools.permissions import PermissionPolicy


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "f.txt").write_text("outside original\n")
    return d


def _snapshot(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_file_swapped_for_a_link_after_the_question_is_not_written_through(ctx, outside):
    (ctx.cwd / "f.txt").write_text("one\n")
    run_tool("read", {"path": "f.txt"}, ctx)  # edit needs the lines read
    policy = PermissionPolicy("ask")
    args = {"path": "f.txt", "old": "one", "new": "two"}
    d = policy.check("edit", args, ctx)
    assert d.kind == "ask" and d.question.path == str(ctx.cwd / "f.txt")
    os.unlink(ctx.cwd / "f.txt")
    os.symlink(outside / "f.txt", ctx.cwd / "f.txt")
    (outside / "f.txt").write_text("one\n")  # the same text, so only the path differs
    r = run_tool("edit", args, ctx)
    # Refused either way: the file behind the link was never read (the guard), and the path
    # leads elsewhere than when it was approved.
    assert not r.ok
    assert (outside / "f.txt").read_text() == "one\n"


def test_a_directory_replaced_by_a_link_to_outside_after_a_session_answer(ctx, outside):
    (ctx.cwd / "sub").mkdir()
    policy = PermissionPolicy("ask", allowed_tools={"write"})
    args = {"path": "sub/f.txt", "content": "planted\n"}
    assert policy.check("write", args, ctx).kind == "allow"
    os.rename(ctx.cwd / "sub", ctx.cwd / "sub.old")
    os.symlink(outside, ctx.cwd / "sub")
    before = _snapshot(outside)
    r = run_tool("write", args, ctx)
    assert not r.ok and "nothing was written" in r.text
    assert _snapshot(outside) == before and not (ctx.cwd / "sub.old" / "f.txt").exists()


def test_a_directory_swapped_between_resolving_and_writing_is_refused(ctx, outside, monkeypatch):
    """The window inside one run (no question at all): the path was resolved, then a directory on
    it became a link before the write walked it."""
    (ctx.cwd / "sub").mkdir()
    real = files.replace_file

    def swap_then_write(*a, **k):
        os.rename(ctx.cwd / "sub", ctx.cwd / "sub.old")
        os.symlink(outside, ctx.cwd / "sub")
        return real(*a, **k)

    monkeypatch.setattr(files, "replace_file", swap_then_write)
    before = _snapshot(outside)
    r = run_tool("write", {"path": "sub/f.txt", "content": "planted\n"}, ctx)
    assert not r.ok and "changed since its path was checked" in r.text and "/sub is no longer a directory" in r.text
    assert _snapshot(outside) == before


def test_a_file_edited_after_the_diff_was_shown_is_refused(ctx):
    target = ctx.cwd / "f.txt"
    target.write_text("alpha\nbeta\n")
    run_tool("read", {"path": "f.txt"}, ctx)  # edit needs the lines read
    policy = PermissionPolicy("ask")
    args = {"path": "f.txt", "old": "alpha", "new": "ALPHA"}
    d = policy.check("edit", args, ctx)
    assert d.kind == "ask" and "+ALPHA" in d.question.preview
    target.write_text("alpha\nbeta\nadded by the user\n")  # the edit would still apply, to other text
    r = run_tool("edit", args, ctx)
    assert not r.ok and "changed since the diff was shown" in r.text
    assert target.read_text() == "alpha\nbeta\nadded by the user\n"
    # Asked again, on the current text, it goes through.
    assert policy.check("edit", args, ctx).kind == "ask"
    assert run_tool("edit", args, ctx).ok and target.read_text() == "ALPHA\nbeta\nadded by the user\n"


def test_a_write_over_a_file_replaced_after_the_question_is_refused(ctx):
    target = ctx.cwd / "f.txt"
    target.write_text("same size 1\n")
    policy = PermissionPolicy("ask")
    args = {"path": "f.txt", "content": "new\n"}
    assert policy.check("write", args, ctx).kind == "ask"
    tmp = ctx.cwd / "other"
    tmp.write_text("same size 2\n")
    os.replace(tmp, target)  # an editor's atomic save: another inode
    r = run_tool("write", args, ctx)
    assert not r.ok and "changed since the diff was shown" in r.text and target.read_text() == "same size 2\n"


def test_a_file_changed_while_the_write_is_prepared_is_left_alone(ctx, monkeypatch):
    target = ctx.cwd / "f.txt"
    target.write_text("one\n")
    run_tool("read", {"path": "f.txt"}, ctx)  # edit needs the lines read
    real = files.replace_file

    def edit_then_write(*a, **k):
        with open(target, "a") as f:
            f.write("the user's line\n")
        return real(*a, **k)

    monkeypatch.setattr(files, "replace_file", edit_then_write)
    r = run_tool("edit", {"path": "f.txt", "old": "one", "new": "two"}, ctx)
    assert not r.ok and "changed on disk since this change was planned" in r.text
    assert target.read_text() == "one\nthe user's line\n"
    assert sorted(p.name for p in ctx.cwd.iterdir()) == ["f.txt"]  # no temp file left


def test_a_call_that_failed_its_check_and_then_would_succeed_is_refused(ctx):
    policy = PermissionPolicy("ask")
    args = {"path": "later.txt", "old": "x", "new": "y"}
    assert policy.check("edit", args, ctx).kind == "allow"  # nothing to edit: the tool will say so
    (ctx.cwd / "later.txt").write_text("x\n")
    run_tool("read", {"path": "later.txt"}, ctx)
    r = run_tool("edit", args, ctx)
    assert not r.ok and "changed since the permission check" in r.text
    assert (ctx.cwd / "later.txt").read_text() == "x\n"


def test_an_approval_covers_only_the_call_checked(ctx):
    (ctx.cwd / "f.txt").write_text("one\n")
    run_tool("read", {"path": "f.txt"}, ctx)  # edit needs the lines read
    policy = PermissionPolicy("ask")
    assert policy.check("edit", {"path": "f.txt", "old": "one", "new": "two"}, ctx).kind == "ask"
    (ctx.cwd / "f.txt").write_text("one\nmore\n")
    # Another call (auto mode runs without a check): the stale approval does not refuse it.
    assert run_tool("write", {"path": "g.txt", "content": "g\n"}, ctx).ok
    assert run_tool("edit", {"path": "f.txt", "old": "one", "new": "two"}, ctx).ok
    assert (ctx.cwd / "f.txt").read_text() == "two\nmore\n"


def test_links_that_exist_when_the_path_is_resolved_are_still_followed(ctx, outside):
    (ctx.cwd / "real").mkdir()
    os.symlink("real", ctx.cwd / "alias")
    os.symlink("real/t.txt", ctx.cwd / "t-link")
    assert run_tool("write", {"path": "alias/t.txt", "content": "via dir link\n"}, ctx).ok
    assert run_tool("edit", {"path": "t-link", "old": "via", "new": "through"}, ctx).ok
    assert (ctx.cwd / "real" / "t.txt").read_text() == "through dir link\n"
    assert os.path.islink(ctx.cwd / "t-link")
    assert run_tool("read", {"path": "alias/t.txt"}, ctx).text.endswith("1 through dir link\n")
    assert "t.txt" in run_tool("list", {"path": "alias"}, ctx).text


NUL_CALLS = [
    ("read", {"path": "a\0b"}),
    ("write", {"path": "a\0b", "content": "x"}),
    ("edit", {"path": "a\0b", "old": "x", "new": "y"}),
    ("edit", {"path": "a\0b", "old": "x", "new": ""}),
    ("list", {"path": "sub\0"}),
    ("search", {"query": "x", "path": "a\0b"}),
]


@pytest.mark.parametrize(("name", "args"), NUL_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(NUL_CALLS)])
def test_a_nul_byte_in_a_path_is_a_tool_error(ctx, name, args):
    r = run_tool(name, args, ctx)
    assert not r.ok and r.text == "Tool error: invalid path: it contains a NUL byte\n"


@pytest.mark.parametrize("mode", ["ask", "read-only"])
@pytest.mark.parametrize("name", ["write", "edit"])
def test_the_policy_refuses_a_nul_path_instead_of_raising(ctx, name, mode):
    policy = PermissionPolicy(mode, allowed_tools={"write", "edit"})
    d = policy.check(name, {"path": "x\0y", "content": "c", "old": "a", "new": "b"}, ctx)
    assert d.kind == "deny" and d.result().text.startswith("Tool error: ")
    if mode == "ask":
        assert d.reason == "invalid path: it contains a NUL byte"


def test_the_policy_never_raises_on_a_nul_in_a_command(ctx):
    d = PermissionPolicy("ask").check("bash", {"command": "cat a\0b > ../x"}, ctx)
    assert d.kind in ("ask", "deny")


def test_more_after_a_read_of_a_nul_path_has_nothing_to_continue(ctx):
    run_tool("read", {"path": "a\0b"}, ctx)
    assert run_tool("more", {}, ctx).text == "Tool error: no previous output to continue\n"
