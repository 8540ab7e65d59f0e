"""The OS sandbox around bash jobs: real escape attempts through run_tool with a default ToolContext.

Each attempt runs in a git work tree whose sibling directory is the "outside"; afterwards nothing
outside and nothing in .git/ may have changed, while ordinary writes in the tree and in the job's
TMPDIR still work. The permission policy plays no part here (run_tool runs what it is given): the
sandbox alone holds the boundary.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds4agent.tools import ToolContext, run_tool, sandbox
from ds4agent.tools.permissions import PermissionPolicy, git_metadata_question

pytestmark = pytest.mark.skipif(not sandbox.availability().available, reason="no OS sandbox on this machine")
linux_only = pytest.mark.skipif(sandbox.availability().kind != "landlock", reason="Landlock (Linux) only")


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry beneath root: its kind and content (or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def tree(tmp_path: Path):
    work = tmp_path / "tree"
    outside = tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "existing").write_text("keep me\n")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "file.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"],
                   check=True)
    (work / "sub").mkdir()
    os.symlink("../outside", work / "inlink")  # a symlink inside the tree that leads out
    out_dir = tmp_path / "joblogs"
    out_dir.mkdir()
    ctx = ToolContext(cwd=work, output_dir=out_dir)
    before = (_snapshot(outside), _snapshot(work / ".git"))
    yield ctx, work, outside
    ctx.close()
    assert _snapshot(outside) == before[0], "something changed outside the tree"
    assert _snapshot(work / ".git") == before[1], "something changed in .git/"


def _bash(ctx: ToolContext, command: str):
    return run_tool("bash", {"command": command, "refresh_sec": 60}, ctx)


@contextlib.contextmanager
def _mode(ctx: ToolContext, monkeypatch, mode: str):
    """The jobs of `ctx` in one of the sandbox's modes: "namespace" (the default here),
    "entries" (no user namespace: rules per entry) or "git-granted" (git may write .git/)."""
    if mode == "entries":
        monkeypatch.setenv(sandbox.SWITCH, "entries")
    if mode == "git-granted":
        ctx.sandbox.git_writable = True
    sandbox.availability.cache_clear()
    sandbox.entries_only.cache_clear()
    try:
        yield
    finally:
        monkeypatch.delenv(sandbox.SWITCH, raising=False)
        sandbox.availability.cache_clear()
        sandbox.entries_only.cache_clear()


ESCAPES = {
    "cr-comment": "echo ok \r# ; cp /etc/hostname ../outside/STOLEN",
    "backslash-newline-in-quotes": 'echo "a\\\nb" > "../outside/b\\\ns"; echo x > ../outside/bs',
    "heredoc-delimiter": 'cat > ../outside/hd <<"E\\\nOF"\nbody\nE\\\nOF\nx\nEOF\n',
    "cdpath": "CDPATH=.. cd outside && echo x > cdpath",
    "cd-through-in-tree-symlink": "cd inlink && echo x > via-link && echo y >> existing",
    "for-home": "for HOME in ../outside; do echo x > ~/home; done",
    "read-path": "read P <<EOF\n../outside/readpath\nEOF\necho x > \"$P\"",
    "sort-o": "sort -o ../outside/sorted /etc/hostname",
    "uniq-out": "uniq /etc/hostname ../outside/uniq",
    "xxd-r": "xxd /etc/hostname > dump && xxd -r dump ../outside/xxd",
    "iconv-o": "iconv -f utf-8 -t utf-8 -o ../outside/iconv /etc/hostname",
    "gzip-k": "gzip -k ../outside/existing",
    "git-ls-remote-upload-pack": "git ls-remote --upload-pack='touch ../outside/up; git-upload-pack' . ",
    "git-clone-hookspath": "git clone -q -c core.hooksPath=/tmp . ../outside/clone",
    "tar-checkpoint-exec": "tar --checkpoint=1 --checkpoint-action=exec='touch ../outside/tar' -cf /dev/null /etc/hostname",
    "sed-e": "echo x | sed 'e touch ../outside/sed'",
    "awk-f-stdin": "echo 'BEGIN { print \"x\" > \"../outside/awk\" }' | awk -f -",
    "git-init-template": ("mkdir -p tpl/hooks && printf '#!/bin/sh\\ntouch ../outside/hook\\n' > tpl/hooks/post-commit"
                          " && chmod +x tpl/hooks/post-commit && git init -q --template=tpl ."),
    "git-init-separate-git-dir": "git init -q --separate-git-dir=../outside/sep .",
    "tar-transform-into-hooks": ("mkdir -p x && printf '#!/bin/sh\\necho pwned\\n' > x/pre-commit && tar -cf a.tar x"
                                 " && tar -xf a.tar --transform 's,^x,.git/hooks,'"),
    "find-delete-head": "find . -name HEAD -delete",
    "symlink-then-write": "ln -s ../outside l2 && echo x > l2/made-then-written",
    # Variants of our own.
    "python-open": "python3 -c \"open('../outside/py', 'w').write('x')\"",
    "move-git-away": "mv .git moved-git",
    "remove-git": "rm -rf .git",
    "git-config-hook": "git config core.hooksPath /tmp",
    "hard-link-into-git": "ln .git/config cfg && echo '[core] pager = touch ../outside/pg' >> cfg",
    "unmount-git": "umount .git; umount -l .git; echo x > .git/hooks/post-checkout",
    "new-namespace-remount": "unshare -Urm sh -c 'mount -o remount,rw .git; echo x > .git/new'",
    "absolute-path": "echo x > \"$(cd ..; pwd)/outside/abs\"",
    "setsid-background": "setsid sh -c 'echo x > ../outside/later' & wait",
    "symlink-swap-dir": "mv sub sub2 && ln -s ../outside sub && echo x > sub/swap",
    "rename-into-outside": "echo x > f && mv f ../outside/moved",
    "truncate-outside": "truncate -s 0 ../outside/existing; : > ../outside/existing",
    "env-cleared": "env -i /bin/sh -c 'echo x > ../outside/envi'",
    "lessopen": "LESSOPEN='|touch ../outside/less %s' less -f /etc/hostname > /dev/null",
    "git-alias": "git -c alias.x='!touch ../outside/alias' x",
    "perl-e": "perl -e 'open(F, \">../outside/perl\"); print F 1'",
    "vim-ex": "vim -es -c 'w! ../outside/vim' -c 'q!' /etc/hostname",
    "home-dotfile": "HOME=../outside; echo x >> ~/.bashrc",
    "git-hooks-via-config-file": "printf '[core]\\n\\thooksPath = /tmp\\n' >> .git/config",
    "cp-into-git": "cp /etc/hostname .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
    "rsync-like-tar-pipe": "tar -cf - -C /etc hostname | tar -xf - -C ../outside",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_attempts_change_nothing_outside_or_in_git(tree, name):
    ctx, work, outside = tree
    result = _bash(ctx, ESCAPES[name])
    assert "status=done" in result.text


def test_the_system_temp_directory_is_outside_too(tree):
    ctx, work, _ = tree
    target = Path("/tmp") / f"ds4agent-escape-{os.getpid()}-{id(ctx)}"
    result = _bash(ctx, f"echo x > {target}; echo y > \"$TMPDIR/ok\" && cat \"$TMPDIR/ok\"")
    assert not target.exists()
    assert "y\n" in result.text and [r.path for r in result.sandbox_refusals] == [str(target)]


def test_ordinary_writes_in_the_tree_and_tmpdir_work(tree):
    ctx, work, _ = tree
    # Without a mount namespace the tree's top directory takes no new entries (see sandbox.py).
    top = "sub/" if sandbox.entries_only() else ""
    result = _bash(ctx, f'echo hi > {top}new.txt && mkdir -p {top}d/e && echo y > {top}d/e/f && echo t > "$TMPDIR/t" '
                        f'&& cat "$TMPDIR/t" && mv {top}new.txt {top}d/ && echo > file.txt && echo > /dev/null '
                        '&& echo done')
    assert "exit_status=0" in result.text, result.text
    assert "t\ndone\n" in result.text
    assert (work / top / "d" / "new.txt").read_text() == "hi\n"
    assert (work / top / "d" / "e" / "f").read_text() == "y\n"
    assert (work / "file.txt").read_text() == "\n"


def test_git_reads_work_and_a_commit_names_git_metadata(tree):
    ctx, work, _ = tree
    assert "exit_status=0" in _bash(ctx, "git status --short && git log --oneline").text
    result = _bash(ctx, "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m two")
    assert "exit_status=128" in result.text
    assert result.sandbox_refusals and all(r.in_git for r in result.sandbox_refusals)
    assert "sandbox: the OS sandbox refused writing to " in result.text
    assert "git metadata (.git/) is read-only" in result.text
    q = PermissionPolicy("ask").escalation("git commit", result.sandbox_refusals, sandbox.git_paths(str(work)))
    assert q is not None and q.title == git_metadata_question((str(work / ".git"),)) and "hooks" in q.title
    assert str(work / ".git") in q.title  # the question names what the grant opens
    assert q.session_label and q.scope == ("git",)


def test_git_metadata_granted_for_the_session_lets_git_commit(tmp_path):
    work = tmp_path / "w"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    ctx = ToolContext(cwd=work, output_dir=tmp_path)
    ctx.sandbox.git_writable = True
    result = _bash(ctx, "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m one && git log --oneline")
    assert "exit_status=0" in result.text and "one" in result.text
    ctx.reset_session()  # /new forgets it
    result = _bash(ctx, "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m two")
    assert "exit_status=128" in result.text
    ctx.close()


def test_a_write_outside_is_named_in_the_result(tree):
    ctx, work, outside = tree
    result = _bash(ctx, "echo x > ../outside/new")
    assert not result.ok
    target = str(outside / "new")
    assert [r.path for r in result.sandbox_refusals] == [target]
    assert f"sandbox: the OS sandbox refused writing to {target}: commands may write only inside" in result.text
    q = PermissionPolicy("ask").escalation("echo x > ../outside/new", result.sandbox_refusals)
    assert q is not None and q.session_label is None and "outside the sandbox" in q.title
    assert PermissionPolicy("auto").escalation("echo", result.sandbox_refusals) is None


def test_outside_once_runs_one_job_unconfined(tmp_path):
    work, outside = tmp_path / "w", tmp_path / "o"
    work.mkdir()
    outside.mkdir()
    ctx = ToolContext(cwd=work, output_dir=tmp_path)
    ctx.sandbox.outside_once = True
    assert "exit_status=0" in _bash(ctx, "echo x > ../o/once").text
    assert (outside / "once").read_text() == "x\n"
    assert "exit_status=2" in _bash(ctx, "echo x > ../o/twice").text
    assert not (outside / "twice").exists()
    ctx.close()


@linux_only
def test_entries_fallback_keeps_git_read_only(tree, monkeypatch):
    """Without a mount namespace: rules per top-level entry; .git stays read-only, subdirectories
    writable, and creating a top-level entry is refused and reported."""
    ctx, work, _ = tree
    monkeypatch.setenv(sandbox.SWITCH, "entries")
    sandbox.availability.cache_clear()
    sandbox.entries_only.cache_clear()
    try:
        assert sandbox.entries_only()
        assert "exit_status=0" in _bash(ctx, "echo y > sub/inside && cat file.txt").text
        assert (work / "sub" / "inside").read_text() == "y\n"
        assert "status=done" in _bash(ctx, ESCAPES["tar-transform-into-hooks"].replace("mkdir -p x", "mkdir -p sub/x")
                                      .replace("-cf a.tar x", "-cf sub/a.tar -C sub x").replace("-xf a.tar", "-xf sub/a.tar")).text
        result = _bash(ctx, "touch top-level-new")
        assert [r.path for r in result.sandbox_refusals] == [str(work / "top-level-new")]
    finally:
        monkeypatch.delenv(sandbox.SWITCH)
        sandbox.availability.cache_clear()
        sandbox.entries_only.cache_clear()


def test_a_job_cannot_signal_the_agent(tree):
    ctx, _, _ = tree
    result = _bash(ctx, f"kill -0 {os.getpid()} && echo reached || echo refused")
    assert "refused" in result.text


# --------------------------------------------------------------------------------------------------
# Pure functions


def test_seatbelt_profile_allows_the_tree_and_temp_and_denies_git(tmp_path):
    work = tmp_path / 'we"ird'
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    text = sandbox.seatbelt_profile(sandbox.Boundary(str(work), str(tmp_path / "t")))
    root = os.path.realpath(work).replace('"', '\\"')
    assert text.startswith("(version 1)\n(allow default)\n(deny file-write*)\n(allow file-write*\n")
    assert f'(subpath "{root}")' in text
    assert f'(subpath "{os.path.realpath(tmp_path / "t")}")' in text
    assert text.rstrip().endswith(f'(deny file-write* (subpath "{root}/.git"))')
    granted = sandbox.seatbelt_profile(sandbox.Boundary(str(work), str(tmp_path / "t"), git_writable=True))
    assert "(deny file-write* (subpath" not in granted


def test_seatbelt_profile_for_a_linked_worktree_names_its_git_dirs(tmp_path):
    main = tmp_path / "main"
    subprocess.run(["git", "init", "-q", str(main)], check=True)
    subprocess.run(["git", "-C", str(main), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(tmp_path / "wt")], check=True)
    paths = sandbox.git_paths(str(tmp_path / "wt"))
    assert paths[0] == str(tmp_path / "wt" / ".git")
    assert os.path.realpath(main / ".git" / "worktrees" / "wt") in paths
    assert os.path.realpath(main / ".git") in paths
    granted = sandbox.seatbelt_profile(sandbox.Boundary(str(tmp_path / "wt"), str(tmp_path), git_writable=True))
    assert f'(subpath "{os.path.realpath(main / ".git")}")' in granted


def test_refusals_read_the_usual_messages(tmp_path, monkeypatch):
    """Without a mount namespace Landlock refuses with EACCES/EPERM, so those name refusals (where
    the file's own mode would have let the user write: else it was no sandbox's doing)."""
    monkeypatch.setattr(sandbox, "entries_only", lambda: True)
    tree, o = tmp_path / "tree", tmp_path / "o"
    (tree / "sub").mkdir(parents=True)
    o.mkdir()
    (o / "c").write_text("")
    (o / "locked").write_text("")
    (o / "locked").chmod(0o444)
    b = sandbox.Boundary(str(tree), "/tmp/job")
    out = ("/bin/sh: 1: cannot create ../o/a: Permission denied\n"
           f"touch: cannot touch '{o}/b': Permission denied\n"
           f"PermissionError: [Errno 13] Permission denied: '{o}/c'\n"
           "rm: cannot remove 'sub/inside': Permission denied\n"  # inside the tree: the file's own mode
           f"cp: cannot create regular file ‘{o}/d’: Operation not permitted\n"
           f"cat: {o}/locked: Permission denied\n"  # its own mode refuses writing: not the sandbox
           "ls: cannot access '/proc/1/root/etc': Permission denied\n")
    got = [r.path for r in sandbox.refusals(out, str(tree), b)]
    assert got == [str(o / "a"), str(o / "b"), str(o / "c"), str(o / "d")]


def test_with_a_mount_namespace_only_read_only_errors_are_refusals(tmp_path, monkeypatch):
    """There a refused write says EROFS; "Permission denied" is a read the file's mode refused
    (no question to run it outside), and an unresolvable /proc path is no error."""
    monkeypatch.setattr(sandbox, "entries_only", lambda: False)
    b = sandbox.Boundary(str(tmp_path), "/tmp/job")
    out = ("cat: /root/secret: Permission denied\n"
           "ls: cannot access '/proc/1/root/etc': Permission denied\n"
           "grep: /proc/1/root/etc/shadow: Read-only file system\n"
           "/bin/sh: 1: cannot create ../elsewhere/a: Read-only file system\n"
           "mv: cannot move 'x' to '/opt/y': Invalid cross-device link\n")
    got = [r.path for r in sandbox.refusals(out, str(tmp_path), b)]
    assert got[-2:] == [os.path.normpath(tmp_path / ".." / "elsewhere" / "a"), "/opt/y"]
    assert "/root/secret" not in got


@linux_only
def test_landlock_abi_and_handled_rights():
    assert sandbox.landlock_abi() >= 1
    fs1, size1, scoped1 = sandbox.handled_rights(1)
    fs7, size7, scoped7 = sandbox.handled_rights(7)
    assert (size1, scoped1) == (8, 0) and size7 == 24 and scoped7 == 3
    assert fs7 & ~fs1 == (1 << 13) | (1 << 14) | (1 << 15)  # refer, truncate, ioctl_dev


def test_switched_off_means_no_sandbox_and_every_command_asks(tmp_path, monkeypatch):
    monkeypatch.setenv(sandbox.SWITCH, "off")
    sandbox.availability.cache_clear()
    try:
        avail = sandbox.availability()
        assert not avail.available and "switched off" in avail.describe()
        policy = PermissionPolicy("ask", allowed_programs={"echo"})
        ctx = ToolContext(cwd=tmp_path)
        decision = policy.check("bash", {"command": "echo hi"}, ctx)
        assert decision.kind == "ask" and decision.question.session_label is None
        assert "no OS sandbox" in decision.question.title
        assert sandbox.wrap(["/bin/sh", "-c", "true"], sandbox.Boundary(str(tmp_path), str(tmp_path))) == \
            ["/bin/sh", "-c", "true"]
    finally:
        monkeypatch.delenv(sandbox.SWITCH)
        sandbox.availability.cache_clear()


def test_info_says_whether_there_is_a_sandbox(tmp_path, capsys, monkeypatch):
    from ds4agent import cli
    from ds4agent.testmodels import make_test_model

    model = make_test_model(tmp_path / "micro.gguf", "micro", seed=1)
    assert cli.main(["info", str(model)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("sandbox ")]
    assert lines == [f"sandbox     {sandbox.availability().detail}"]
    assert lines[0].startswith(("sandbox     Landlock ABI", "sandbox     Seatbelt"))
    monkeypatch.setenv(sandbox.SWITCH, "off")
    sandbox.availability.cache_clear()
    try:
        assert cli.main(["info", str(model)]) == 0
        assert "\nsandbox     none (switched off by DS4AGENT_SANDBOX=off)\n" in capsys.readouterr().out
    finally:
        monkeypatch.delenv(sandbox.SWITCH)
        sandbox.availability.cache_clear()


def test_a_tree_inside_a_repository_knows_the_repository_git_dir(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "pkg").mkdir()
    ctx = ToolContext(cwd=repo / "pkg", output_dir=tmp_path)
    assert sandbox.git_paths(str(repo / "pkg")) == (str(repo / ".git"),)
    commit = "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m one"
    refused = _bash(ctx, commit)
    assert refused.sandbox_refusals and all(r.in_git for r in refused.sandbox_refusals)
    ctx.sandbox.git_once = True
    assert "exit_status=0" in _bash(ctx, commit).text
    assert "exit_status=128" in _bash(ctx, commit).text  # the one-time grant is used up
    ctx.close()


# --------------------------------------------------------------------------------------------------
# Privileges: a job keeps no capability, even as root, in every mode


def _cap_lines(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())
            if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}


@linux_only
@pytest.mark.parametrize("mode", ["namespace", "entries", "git-granted"])
def test_a_job_holds_no_capability_and_makes_no_device_node(tree, monkeypatch, mode):
    ctx, work, _ = tree
    with _mode(ctx, monkeypatch, mode):
        result = _bash(ctx, "grep '^Cap' /proc/self/status; mknod sub/nullish c 1 3; mknod sub/disk b 8 0;"
                            " mkdir -p sub/d && echo x > sub/d/f && chmod +x sub/d/f && echo made")
    caps = _cap_lines(result.text)
    assert caps == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), "0000000000000000"), result.text
    assert not (work / "sub" / "nullish").exists() and not (work / "sub" / "disk").exists()
    # Ordinary work in the tree is untouched by the dropped privileges.
    assert "made" in result.text and os.access(work / "sub" / "d" / "f", os.X_OK)


# --------------------------------------------------------------------------------------------------
# Code the agent runs outside the sandbox is out of a job's reach


@linux_only
@pytest.mark.parametrize("mode", ["namespace", "entries", "git-granted"])
def test_the_agents_own_code_in_the_tree_is_read_only_to_jobs(tree, monkeypatch, mode):
    """A checkout of ds4agent, or a project venv holding it, inside the working tree: a job must
    not rewrite what the agent itself runs next, unconfined."""
    ctx, work, _ = tree
    for rel in ("pkg/ds4agent/tools", ".venv/bin", "src/deep/venv/lib"):
        (work / rel).mkdir(parents=True)
    (work / "pkg/ds4agent/tools/sandbox.py").write_text("# launcher\n")
    (work / ".venv/bin/rg").write_text("#!/bin/sh\n")
    (work / "src/deep/fine").write_text("old\n")  # beside a protected place: edited in every mode
    protected = (str(work / "pkg/ds4agent"), str(work / ".venv"), str(work / "src/deep/venv"))
    monkeypatch.setattr(sandbox, "agent_code", lambda: protected)
    with _mode(ctx, monkeypatch, mode):
        _bash(ctx, "echo 'import os' >> pkg/ds4agent/tools/sandbox.py; echo x > .venv/bin/rg;"
                   " rm -rf .venv/bin; mv pkg/ds4agent pkg/moved; echo y > src/deep/venv/lib/site.py")
        result = _bash(ctx, "echo ok > src/deep/fine && mkdir -p sub/other && echo ok > sub/other/fine"
                            " && echo ok > sub/fine && echo done")
    assert (work / "pkg/ds4agent/tools/sandbox.py").read_text() == "# launcher\n"
    assert (work / ".venv/bin/rg").read_text() == "#!/bin/sh\n"
    assert not (work / "src/deep/venv/lib/site.py").exists() and not (work / "pkg/moved").exists()
    assert "done" in result.text, result.text
    assert all((work / rel).read_text() == "ok\n" for rel in ("src/deep/fine", "sub/other/fine", "sub/fine"))


@linux_only
def test_the_launcher_runs_the_text_read_at_start_not_the_file_as_it_is_now(tree, tmp_path, monkeypatch):
    """The launcher's text (launcher.py and seccomp.py) is taken when the agent loads sandbox.py:
    rewriting those files afterwards (a job in a checkout of ds4agent) changes nothing about the
    next job's boundary."""
    import importlib.util

    ctx, work, outside = tree
    here = Path(sandbox.__file__).parent
    for name in ("sandbox", "launcher", "seccomp"):
        (tmp_path / f"{name}.py").write_text((here / f"{name}.py").read_text())
    spec = importlib.util.spec_from_file_location("copied_sandbox", tmp_path / "sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "copied_sandbox", module)
    spec.loader.exec_module(module)
    # The rewrite a job would make: the launcher leaves before building the boundary.
    (tmp_path / "launcher.py").write_text("import os, sys\ndef main(argv):\n    os.execv(argv[2], argv[2:])\n")
    (tmp_path / "seccomp.py").write_text("")
    temp = tmp_path / "jobtemp"
    temp.mkdir()
    argv = module.wrap(["/bin/sh", "-c", "echo x > ../outside/escaped"], sandbox.Boundary(str(work), str(temp)))
    assert not any(a.endswith(".py") for a in argv)  # text, not files to run
    subprocess.run(argv, cwd=work, check=False, capture_output=True)
    assert not (outside / "escaped").exists()


@linux_only
def test_a_replaced_rg_runs_inside_the_sandbox(tree, monkeypatch):
    from ds4agent.tools import search

    ctx, work, outside = tree
    fake = work / ".venv" / "bin" / "rg"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho pwned > {outside}/from-rg\necho pwned > {work}/sub/from-rg\n")
    fake.chmod(0o755)
    monkeypatch.setattr(search, "find_rg", lambda: str(fake))
    run_tool("search", {"query": "hello"}, ctx)
    assert not (outside / "from-rg").exists()
    assert (work / "sub" / "from-rg").read_text() == "pwned\n"  # it did run, confined like a job


@linux_only
def test_the_git_grant_keeps_the_git_directories_found_before_any_job(tmp_path):
    """A job with git's grant rewrites `.git` into a file naming a directory outside (`gitdir:`):
    the next granted job still gets only the git metadata the tree had."""
    work, outside = tmp_path / "tree", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    ctx = ToolContext(cwd=work, output_dir=tmp_path)
    try:
        ctx.sandbox.git_writable = True
        assert "exit_status=0" in _bash(ctx, f"rm -rf .git && printf 'gitdir: {outside}\\n' > .git").text
        _bash(ctx, "echo x > ../outside/through-gitdir")
    finally:
        ctx.close()
    assert not (outside / "through-gitdir").exists()
    assert sandbox.git_paths(str(work)) == (str(work / ".git"),)


# --------------------------------------------------------------------------------------------------
# Unix sockets outside the tree: refused unless the user allowed them


@pytest.fixture
def socket_server(tmp_path):
    """A Unix socket server outside the tree (a stand-in for tmux, docker or an ssh agent): every
    connection it accepts is recorded."""
    import socket
    import threading

    path = tmp_path / "outside-sockets" / "server.sock"
    path.parent.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2)
                try:
                    accepted.append(conn.recv(100))
                except OSError:
                    accepted.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, accepted
    stop.set()
    thread.join(5)
    server.close()


_CONNECT = ("python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.sendall(b'hello'); print('connected')\" {}")


@linux_only
@pytest.mark.parametrize("mode", ["namespace", "entries"])
def test_a_job_cannot_reach_a_unix_socket_outside_unless_allowed(tree, monkeypatch, socket_server, mode):
    ctx, work, _ = tree
    path, accepted = socket_server
    with _mode(ctx, monkeypatch, mode):
        refused = _bash(ctx, _CONNECT.format(path))
        # A job's own socket pairs work (multiprocessing, test suites).
        local = _bash(ctx, "python3 -c \"import socket; a,b=socket.socketpair(); a.send(b'x'); print(b.recv(1))\"")
        ctx.sockets = (str(path),)
        allowed = _bash(ctx, _CONNECT.format(path))
    assert "connected" not in refused.text and "exit_status=1" in refused.text, refused.text
    assert "b'x'" in local.text
    assert "connected" in allowed.text, allowed.text
    assert accepted == [b"hello"]  # only the allowed job's connection reached the server


def test_multiplexer_and_agent_variables_leave_the_job_environment(tree, monkeypatch):
    ctx, _, _ = tree
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,123,0")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/docker.sock")
    result = _bash(ctx, "echo T=${TMUX-unset} S=${SSH_AUTH_SOCK-unset} D=${DOCKER_HOST-unset}")
    assert "T=unset S=unset D=unset" in result.text
    ctx.sockets = ("/tmp/ssh-x/agent.1",)
    assert "S=/tmp/ssh-x/agent.1" in _bash(ctx, "echo S=${SSH_AUTH_SOCK-unset}").text


# --------------------------------------------------------------------------------------------------
# Metadata outside the tree: modes, times, extended attributes


def _metadata(path: Path) -> tuple:
    st = os.lstat(path)
    try:
        attrs = sorted(os.listxattr(path))
    except OSError:
        attrs = []
    return st.st_mode, st.st_mtime_ns, st.st_uid, attrs


@linux_only
@pytest.mark.parametrize("mode", ["namespace", "entries", "git-granted"])
def test_a_job_changes_no_metadata_outside_the_tree(tree, monkeypatch, mode):
    """chmod (setuid included), touch -d, setxattr, chown outside the tree: refused with EROFS in
    every mode (read-only mounts in the namespace, the seccomp supervisor without one), while the
    same calls in the tree work."""
    ctx, work, outside = tree
    target = outside / "existing"
    before = _metadata(target), _metadata(outside)
    with _mode(ctx, monkeypatch, mode):
        result = _bash(ctx, "chmod u+s,g+w ../outside/existing; chmod 777 ../outside; touch -d 2001-01-01 ../outside/existing;"
                            " python3 -c \"import os; os.setxattr('../outside/existing', 'user.x', b'1')\";"
                            " chown nobody ../outside/existing;"
                            " echo x > sub/mine && chmod +x sub/mine && touch -d 2001-01-01 sub/mine && mkdir -p sub/made"
                            " && echo done")
    assert (_metadata(target), _metadata(outside)) == before
    assert "Read-only file system" in result.text  # what a refused job is told
    assert "done" in result.text and os.access(work / "sub/mine", os.X_OK)
    assert (work / "sub/mine").stat().st_mtime < 10**9 + 10**8  # 2001: times in the tree can be set
