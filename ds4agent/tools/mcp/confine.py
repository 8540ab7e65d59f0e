"""Which MCP servers run inside the OS sandbox, and the command line that puts them there.

    confined_command(config, cwd) -> (command, args, temp dir or None)

A server from the project's `.mcp.json`, or one whose program or arguments name a file inside the
working tree, runs inside the same boundary as a bash job: its code lies where a job can rewrite
it, and approval covers the JSON only (hashing every file a server loads is not possible: a
script imports others, `npx` fetches packages). Confined, a rewritten server can do no more than a
job could. Such a server may write beneath the tree and in its own temporary directory; the network
stays open (it is a file boundary). A server of the user's own configuration that names nothing
in the tree runs as the user configured it: it often needs its caches (~/.npm, ~/.cache) and no
job can change it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ds4agent.tools.mcp.config import ServerConfig, project_root
from ds4agent.tools.sandbox import Boundary, availability, wrap


def names_the_tree(config: ServerConfig, root: Path) -> bool:
    """Whether the program or an argument is a path inside the tree (relative paths from root)."""
    real = os.path.realpath(root)
    for word in (config.command, *config.args):
        if not word or word.startswith("-") and "=" not in word:
            continue
        candidate = word.split("=", 1)[1] if word.startswith("-") else word
        path = os.path.realpath(os.path.join(real, os.path.expanduser(candidate)))
        if os.path.exists(path) and os.path.commonpath([path, real]) == real:
            return True
    return False


def confined_command(config: ServerConfig, cwd: Path) -> tuple[str, list[str], str | None]:
    """(command, args, temp) to start the server with: wrapped in the sandbox where it must be
    (the caller removes `temp` when the server ends), else the configured command unchanged."""
    root = project_root(cwd)
    if not availability().available or (config.source != "project" and not names_the_tree(config, root)):
        return config.command, list(config.args), None
    path = dict(config.env).get("PATH", os.environ.get("PATH", os.defpath))
    program = shutil.which(config.command, path=path) or os.path.join(str(cwd), config.command)
    if not os.path.isfile(program):
        # Nothing to run: started as configured, so the user reads the usual "No such file".
        return config.command, list(config.args), None
    temp = tempfile.mkdtemp(prefix="ds4agent-mcp-")
    argv = wrap([program, *config.args], Boundary(str(root), temp))
    return argv[0], argv[1:], temp
