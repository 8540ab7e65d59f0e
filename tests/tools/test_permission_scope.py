"""Session answers cover programs and tools, never writes outside the working tree or into .git/
: such a command or write is asked about every time, with no session choice."""

import os

import pytest

from ds4agent.tools import run_tool
from ds4agent.tools.permissions import Answer, PermissionPolicy
from ds4agent.tools.shellscan import scan


def _allowing(ctx, *commands):
    p = PermissionPolicy()
    for command in commands:
        d = p.check("bash", {"command": command}, ctx)
        assert d.kind == "ask" and d.question.session_label, command
        p.remember(d.question, Answer.session())
    return p


def _asks_every_time(p, ctx, command):
    d = p.check("bash", {"command": command}, ctx)
    assert d.kind == "ask", command
    assert d.question.session_label is None and d.question.scope == (), command
    p.remember(d.question, Answer.session())  # even a "session" answer leaves nothing behind
    assert p.check("bash", {"command": command}, ctx).kind == "ask", command
    return d.question


PROGRAMS = ["echo a", "tee a", "cp a b", "mv a b", "rm a", "install a b", "dd if=a of=b", "cd a", "cat a",
            "find .", "git status", "sed s/a/b/ a", "awk 1 a", "touch a", "ln -s a b", "mkdir a"]


@pytest.mark.parametrize("command", [
    "echo owned > ../outside",
    "echo 'export X=1' >> ~/.profile",
    "echo x >/tmp/elsewhere",
    "echo x 2> ../err.log",
    "echo x &> ../both.log",
    "echo x >& ../both.log",
    "echo x > $OUT",
    "echo x > .git/hooks/pre-commit",
    "echo x > sub/.git/config",
    "echo x | tee -a ../f",
    "echo x | tee .git/hooks/post-checkout",
    "cp payload ../x",
    "cp -t ../dir payload",
    "cp -rt ../dir payload",
    "cp --target-directory=/tmp payload",
    "cp hook .git/hooks/pre-commit",
    "mv ../theirs mine",
    "rm -rf /tmp/x",
    "rm -rf ../*",
    "rm .gi*/config",
    "install -m 755 tool ~/bin/tool",
    "dd if=a of=../b",
    "touch ~/.bashrc",
    "ln -s x ../link",
    "mkdir -p /tmp/d",
    "find .. -name '*.pyc' -delete",
    "sed -i s/a/b/ ../x.txt",
    "sed -i.bak s/a/b/ ~/.profile",
    "sed 's/a/b/w /etc/x' in.txt",
    "sed 's/a/b/w/etc/x' in.txt",
    "awk '{print > \"/etc/x\"}' in.txt",
    "cd .. && echo x > y",
    "cd /tmp; rm -rf *",
    "cd $SOMEWHERE && touch f",
    "git -C ../other commit -am x",
    "git config core.pager 'rm -rf ~'",
    "git clone https://example.invalid/r.git /tmp/r",
    "ln -s /etc/passwd innocent && echo x >> innocent",
    "ln ~/.bashrc hb",
    "cp -s /etc/passwd here",
    "cp f {..,.}/y",
    "dd if=f of=~/x",
])
def test_writes_outside_or_into_git_are_asked_every_time(ctx, command):
    p = _allowing(ctx, *PROGRAMS)
    q = _asks_every_time(p, ctx, command)
    assert q.title.startswith(("Run this shell command outside the sandbox (it can then write anywhere)? It writes to ",
                               "Run this shell command with git metadata writable? It writes to "))
    assert q.grant == ("outside" if q.outside_workspace else "git")


def test_the_question_names_the_target(ctx):
    q = _allowing(ctx, "echo a").check("bash", {"command": "echo owned > ../outside"}, ctx).question
    assert q.title == ("Run this shell command outside the sandbox (it can then write anywhere)? It writes to "
                       "../outside (outside the working directory).")
    assert q.outside_workspace and q.grant == "outside"
    q = _allowing(ctx, "cp a b").check("bash", {"command": "cp h .git/hooks/pre-commit"}, ctx).question
    assert q.title == "Run this shell command with git metadata writable? It writes to .git/hooks/pre-commit (inside .git/)."
    assert not q.outside_workspace and q.grant == "git"


def test_a_symlink_out_of_the_tree_is_outside(ctx, tmp_path):
    (tmp_path / "deep").mkdir()
    (ctx.cwd / "escape").symlink_to(tmp_path / "deep")
    p = _allowing(ctx, "echo a")
    _asks_every_time(p, ctx, "echo x > escape/f")
    # link/.. is the parent of the link's target, not the working directory.
    _asks_every_time(p, ctx, "echo x > escape/../f")


def test_a_file_with_other_hard_links_is_asked_about(ctx, tmp_path):
    (tmp_path / "profile").write_text("x\n")
    os.link(tmp_path / "profile", ctx.cwd / "hb")
    _asks_every_time(_allowing(ctx, "echo a"), ctx, "echo evil >> hb")


@pytest.mark.parametrize("command", [
    "echo hi > out.txt",
    "echo hi >> logs/run.log 2>&1",
    "echo hi > /dev/null 2>&1",
    "echo x | tee out.txt",
    "cp ../template.txt here.txt",
    "cp -r /usr/share/doc/x docs/",
    "mv a b",
    "rm -rf build dist",
    "dd if=/dev/zero of=blob bs=1k count=1",
    "find . -name '*.pyc' -delete",
    "cd sub && rm -f out.txt",
    "sed -n 1,5p /etc/hosts",
    "sed -i s/a/b/ notes.txt",
    "awk '$3 > 100' data.txt",
    "git status && git diff > changes.diff",
    "git config --get user.name",
    "git log --format=%H -n 3",
    "cat > f.txt <<'EOF'\necho $(rm -rf ~) > /etc/x\nEOF",
])
def test_writes_inside_the_tree_stay_covered(ctx, command):
    p = _allowing(ctx, *PROGRAMS)
    assert p.check("bash", {"command": command}, ctx).allowed, command


@pytest.mark.parametrize("command", [
    "find . -name x -exec rm {} ;",
    "find . -execdir sh -c 'echo > /etc/x' ;",
    "sh -c 'echo > ../x'",
    "bash -c 'echo hi'",
    "git -c alias.x='!rm -rf ~' x",
    "git -c core.pager=evil log",
    "git rebase -x 'make test' main",
    "git submodule foreach 'rm -rf /'",
    "awk '{system(\"rm -rf ~\")}' f",
    "sed 's/x/rm -rf ~/e' f",
    "cat > f.txt <<EOF\n$(rm -rf ~)\nEOF",
    "echo 'unbalanced > ../x",
    "eval 'echo > ../x'",
    "echo `id` > out",
    "GIT_PAGER='rm -rf ~' git log",
    "export GIT_SSH_COMMAND=evil; git fetch",
    "PATH=.:$PATH ls",
    "alias ls='rm -rf ~'\nls",
])
def test_commands_that_cannot_be_analysed_are_asked_every_time(ctx, command):
    assert scan(command, ctx.cwd) is None
    _asks_every_time(_allowing(ctx, *PROGRAMS), ctx, command)


def test_quoted_operators_are_words_not_redirections(ctx):
    s = scan("echo '> ../x' \"; rm -rf /\" \\> ../y", ctx.cwd)
    assert (s.programs, s.risky_writes) == (("echo",), ())


def test_assignments_and_quoted_names():
    assert scan("CC=clang FLAGS='-O2 -g' make -j4", "/tmp").programs == ("make",)
    # A quoted name is no assignment: sh runs a program named A=1.
    assert scan('"A"=1 x', "/tmp").programs == ("A=1",)


def test_write_and_edit_into_git_are_never_covered_by_a_session_answer(ctx):
    (ctx.cwd / ".git" / "hooks").mkdir(parents=True)
    (ctx.cwd / ".git" / "config").write_text("[core]\n")
    (ctx.cwd / "a.txt").write_text("x\n")
    run_tool("read", {"path": "a.txt"}, ctx)
    run_tool("read", {"path": ".git/config"}, ctx)
    p = PermissionPolicy()
    for tool, args in (("write", {"path": "a.txt", "content": "y\n"}), ("edit", {"path": "a.txt", "old": "x", "new": "y"})):
        p.remember(p.check(tool, args, ctx).question, Answer.session())
        assert p.check(tool, args, ctx).allowed
    for tool, args in (("write", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\nrm -rf ~\n"}),
                       ("edit", {"path": ".git/config", "old": "[core]", "new": "[core]\n\tpager = evil"})):
        d = p.check(tool, args, ctx)
        assert d.kind == "ask" and d.question.session_label is None and d.question.scope == ()
        assert d.question.title.endswith(" (inside .git/)?")
