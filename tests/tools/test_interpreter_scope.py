"""A session answer is never offered for a program that runs whatever code it is given (python3,
node, sh, ...): "allow `python3 …` commands for this session" would allow everything."""

import pytest

from ds4agent.tools import sandbox
from ds4agent.tools.context import ToolContext
from ds4agent.tools.permissions import PermissionPolicy, is_interpreter

pytestmark = pytest.mark.skipif(not sandbox.availability().available, reason="no OS sandbox on this machine")


@pytest.fixture
def ctx(tmp_path):
    return ToolContext(cwd=tmp_path)


@pytest.mark.parametrize("command", ["python3 greet.py", "python3.11 -c 'print(1)'", "/usr/bin/python x.py",
                                     "node app.js", "sh -c 'ls'", "bash script.sh", "perl -e 1", "env X=1 make",
                                     "ls | xargs rm", "npx something", "uv run tool"])
def test_interpreters_ask_once_with_no_session_choice(ctx, command):
    q = PermissionPolicy().check("bash", {"command": command}, ctx).question
    assert q is not None and q.session_label is None and q.scope == ()


@pytest.mark.parametrize("command", ["pytest -q", "make test", "ls -la", "git status"])
def test_other_programs_keep_their_session_choice(ctx, command):
    q = PermissionPolicy().check("bash", {"command": command}, ctx).question
    assert q is not None and q.session_label is not None and q.scope[0] == "bash"


def test_is_interpreter_names():
    assert all(is_interpreter(p) for p in ("python", "python3", "python3.12", "/usr/bin/python3", "node", "sh"))
    assert not any(is_interpreter(p) for p in ("pytest", "make", "shellcheck", "shasum", "envsubst", "pythonic"))
