"""A `.mcp.json` written in VS Code's format (`"servers"`, not `"mcpServers"`) is read, not
silently ignored; a file with neither key says what it expected."""

from __future__ import annotations

import json

from ds4agent.tools.mcp import load_config


def test_vscode_servers_key_is_read(tmp_path):
    work = tmp_path / "repo"
    (work / ".git").mkdir(parents=True)
    doc = {"servers": {"files": {"type": "stdio", "command": "npx", "args": ["-y", "server-files"]}},
           "inputs": []}
    (work / ".mcp.json").write_text(json.dumps(doc), encoding="utf-8")
    config = load_config(work, tmp_path / "config", environ={})
    assert config.errors == ()
    assert config.project is not None
    assert [(s.name, s.command, s.args) for s in config.project.servers] == [("files", "npx", ("-y", "server-files"))]


def test_mcpservers_wins_when_both_keys_are_there(tmp_path):
    work = tmp_path / "repo"
    (work / ".git").mkdir(parents=True)
    doc = {"mcpServers": {"a": {"command": "a"}}, "servers": {"b": {"command": "b"}}}
    (work / ".mcp.json").write_text(json.dumps(doc), encoding="utf-8")
    config = load_config(work, tmp_path / "config", environ={})
    assert [s.name for s in config.project.servers] == ["a"]


def test_a_file_with_neither_key_says_what_it_expected(tmp_path):
    work = tmp_path / "repo"
    (work / ".git").mkdir(parents=True)
    (work / ".mcp.json").write_text(json.dumps({"servers": ["not", "an", "object"]}), encoding="utf-8")
    config = load_config(work, tmp_path / "config", environ={})
    assert len(config.errors) == 1 and 'VS Code\'s "servers"' in config.errors[0]
