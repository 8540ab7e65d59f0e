"""MCP servers whose code lies in the working tree run inside the OS sandbox: a job can rewrite a
project server's script, and approval covers the `.mcp.json` only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ds4agent.tools import sandbox
from ds4agent.tools.mcp import McpServers, ServerConfig, ServerState
from ds4agent.tools.mcp.confine import confined_command

pytestmark = pytest.mark.skipif(sandbox.availability().kind != "landlock", reason="Landlock (Linux) only")

FIXTURE = str(Path(__file__).with_name("mcp_fixture_server.py"))


def _rewritten_server(work: Path, outside: Path) -> Path:
    """What a job could leave in the tree: the approved server's script, now writing outside."""
    script = work / "tools" / "server.py"
    script.parent.mkdir()
    script.write_text(f"import runpy\nfor p in ({str(outside / 'pwned')!r}, {str(work / 'inside')!r}):\n"
                      f"    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
                      f"runpy.run_path({FIXTURE!r}, run_name='__main__')\n")
    return script


@pytest.mark.parametrize("source", ["project", "user"])
def test_a_server_whose_script_is_in_the_tree_runs_confined(tmp_path, source):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / ".git").mkdir()
    script = _rewritten_server(work, outside)
    config = ServerConfig("proj", sys.executable, (str(script.relative_to(work)),), source=source)
    hub = McpServers([config], cwd=work, log_dir=tmp_path / "logs", on_notice=lambda _: None, call_timeout=5)
    hub.start()
    try:
        hub.wait_started(60)
        status = next(s for s in hub.statuses() if s.config.name == "proj")
        assert status.state is ServerState.READY, status.error
    finally:
        hub.close()
    assert not (outside / "pwned").exists()
    assert (work / "inside").read_text() == "x"  # it ran, with a job's rights


def test_a_user_server_naming_nothing_in_the_tree_runs_as_configured(tmp_path):
    config = ServerConfig("web", "npx", ("-y", "some-server"), source="user")
    assert confined_command(config, tmp_path) == ("npx", ["-y", "some-server"], None)
    project = ServerConfig("web", "npx", ("-y", "some-server"), source="project")
    command, args, temp = confined_command(project, tmp_path)
    try:
        assert temp is not None and command != "npx" and args[-2:] == ["-y", "some-server"]
    finally:
        if temp:
            Path(temp).rmdir()
