"""`ds4agent mcp list`: every configured server, whether it starts, and its tools under the names the
model sees. The project file's servers are not started until the file is approved."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from ds4agent.commands.mcp import list_servers
from ds4agent.tools.mcp import Approvals, load_config

FIXTURE = str(Path(__file__).resolve().parent.parent / "tools" / "mcp_fixture_server.py")


def test_mcp_list_shows_servers_their_state_and_tools(tmp_path):
    work, config_dir = tmp_path / "work", tmp_path / "config"
    (work / ".git").mkdir(parents=True)
    config_dir.mkdir()
    (config_dir / "mcp.json").write_text(json.dumps({"mcpServers": {
        "fixture": {"command": sys.executable, "args": [FIXTURE]},
        "gone": {"command": str(tmp_path / "no-such-program")},
        "web": {"type": "http", "url": "http://localhost:1/mcp"},
    }}), encoding="utf-8")
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"proj": {"command": "proj-server"}}}),
                                    encoding="utf-8")
    out = io.StringIO()
    status = list_servers(work, config_dir, 30.0, out, log_dir=tmp_path / "logs")
    text = out.getvalue()
    assert status == 1  # an invalid entry and a server that fails
    assert f"user:    {config_dir / 'mcp.json'}\n" in text
    assert (f"project: {work.resolve() / '.mcp.json'} (not approved yet: ds4agent asks when it starts in this "
            "directory)\n") in text  # one level of brackets
    assert "error:   " in text and "transport 'http' is not supported" in text
    assert "\nproj (project): not started: the project file is not approved\n  command: proj-server\n" in text
    assert (f"\nfixture (user): started, 2 tools\n  command: {sys.executable} {FIXTURE}\n"
            "  fixture__lookup [read-only]: Look up a colour's hex value.\n"
            "  fixture__write_note [destructive]: Write a note to a file.\n") in text
    assert "\ngone (user): failed to start: No such file or directory" in text


def test_mcp_list_with_an_approved_project_file_starts_its_servers(tmp_path):
    work, config_dir = tmp_path / "work", tmp_path / "config"
    work.mkdir()
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"proj": {"command": str(tmp_path / "missing")}}}),
                                    encoding="utf-8")
    project = load_config(work, config_dir).project
    assert project is not None
    Approvals(config_dir).remember(project, True)
    out = io.StringIO()
    assert list_servers(work, config_dir, 5.0, out, log_dir=tmp_path / "logs") == 1
    assert "(approved)" in out.getvalue()
    assert "\nproj (project): failed to start: No such file or directory" in out.getvalue()
