"""MCP configuration: Claude Code's `.mcp.json` format from the project and the user's config
directory, the project winning a name clash, bad entries skipped with a readable error, and the
project-file approvals remembered by the file's hash. No server is started here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4agent.tools.mcp import Approvals, ServerConfig, load_config
from ds4agent.tools.mcp.config import MAX_CONFIG_BYTES, project_root


def _write(path: Path, servers: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


@pytest.fixture
def dirs(tmp_path):
    work = tmp_path / "repo"
    (work / ".git").mkdir(parents=True)
    return work, tmp_path / "config"


def test_project_wins_a_name_clash_and_servers_are_sorted_by_name(dirs):
    work, config_dir = dirs
    _write(config_dir / "mcp.json", {"zeta": {"command": "z"}, "shared": {"command": "user-version"}})
    _write(work / ".mcp.json", {"shared": {"command": "project-version", "args": ["-x"]},
                                "alpha": {"command": "a", "env": {"K": "v"}}})
    config = load_config(work, config_dir, environ={})
    assert config.errors == ()
    assert [(s.name, s.command, s.source) for s in config.servers(use_project=True)] == [
        ("alpha", "a", "project"), ("shared", "project-version", "project"), ("zeta", "z", "user")]
    # Without the approval the project's servers are not used at all (the user's copy stays).
    assert [(s.name, s.command) for s in config.servers(use_project=False)] == [
        ("shared", "user-version"), ("zeta", "z")]
    alpha = config.servers(True)[0]
    assert alpha == ServerConfig("alpha", "a", (), (("K", "v"),), "project")
    assert config.project is not None and config.project.root == work.resolve()


def test_the_project_file_is_found_at_the_working_tree_root_from_a_subdirectory(dirs):
    work, config_dir = dirs
    _write(work / ".mcp.json", {"s": {"command": "c"}})
    sub = work / "src" / "pkg"
    sub.mkdir(parents=True)
    assert project_root(sub) == work.resolve()
    config = load_config(sub, config_dir, environ={})
    assert config.project is not None and config.project.path == work.resolve() / ".mcp.json"


def test_environment_variables_expand_with_defaults_and_a_missing_one_skips_only_its_server(dirs):
    work, config_dir = dirs
    _write(work / ".mcp.json", {
        "ok": {"command": "${TOOL_HOME}/bin/srv", "args": ["--token=${TOKEN:-none}"], "env": {"A": "${TOKEN:-d}"}},
        "broken": {"command": "${NOT_SET}/srv"},
    })
    config = load_config(work, config_dir, environ={"TOOL_HOME": "/opt/t"})
    ok = config.servers(True)
    assert [(s.name, s.command, s.args, s.env) for s in ok] == [
        ("ok", "/opt/t/bin/srv", ("--token=none",), (("A", "d"),))]
    assert len(config.errors) == 1
    assert "server 'broken'" in config.errors[0] and "NOT_SET is not set" in config.errors[0]


@pytest.mark.parametrize("entry, message", [
    ({"type": "http", "url": "https://example.invalid/mcp"}, "transport 'http' is not supported"),
    ({"command": ""}, "command must be a non-empty string"),
    ({"command": "c", "args": "--flag"}, "args must be a list of strings"),
    ({"command": "c", "env": {"A": 1}}, "env must map names to strings"),
    ("c", "expected an object with a command"),
])
def test_a_bad_entry_is_reported_and_the_others_are_kept(dirs, entry, message):
    work, config_dir = dirs
    _write(config_dir / "mcp.json", {"bad": entry, "good": {"command": "g"}})
    config = load_config(work, config_dir, environ={})
    assert [s.name for s in config.servers(False)] == ["good"]
    assert len(config.errors) == 1 and message in config.errors[0], config.errors


def test_server_names_that_cannot_prefix_a_tool_name_are_refused(dirs):
    work, config_dir = dirs
    _write(config_dir / "mcp.json", {"a__b": {"command": "c"}, "sp ace": {"command": "c"}, "ok-1": {"command": "c"}})
    config = load_config(work, config_dir, environ={})
    assert [s.name for s in config.servers(False)] == ["ok-1"]
    assert len(config.errors) == 2


def test_a_file_that_is_not_json_or_too_large_is_an_error_not_a_crash(dirs):
    work, config_dir = dirs
    config_dir.mkdir()
    (config_dir / "mcp.json").write_text("{not json", encoding="utf-8")
    (work / ".mcp.json").write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    config = load_config(work, config_dir, environ={})
    assert config.user == () and config.project is None
    assert any("not valid JSON" in e for e in config.errors)
    assert any("too large" in e for e in config.errors)


def test_no_files_means_no_servers(dirs):
    work, config_dir = dirs
    config = load_config(work, config_dir, environ={})
    assert config.servers(True) == [] and config.errors == () and config.project is None


def test_an_approval_counts_for_the_exact_file_it_was_given_for(dirs):
    work, config_dir = dirs
    path = _write(work / ".mcp.json", {"s": {"command": "c"}})
    first = load_config(work, config_dir, environ={}).project
    assert first is not None
    approvals = Approvals(config_dir)
    assert approvals.answer(first) is None
    approvals.remember(first, True)
    assert Approvals(config_dir).answer(first) is True
    # The answers live in the config directory, never in the project.
    assert (config_dir / "mcp-approvals.json").is_file() and not (work / "mcp-approvals.json").exists()
    _write(path, {"s": {"command": "something-else"}})
    changed = load_config(work, config_dir, environ={}).project
    assert changed is not None and changed.sha256 != first.sha256
    assert approvals.answer(changed) is None
    approvals.remember(changed, False)
    assert approvals.answer(changed) is False
    assert approvals.answer(first) is None  # one answer per directory: the latest file's


def test_the_sdk_is_imported_only_when_servers_are_made():
    # `import mcp` costs a second or more: an agent without MCP servers must never pay for it.
    import subprocess
    import sys

    code = ("import sys, ds4agent.agent.worker, ds4agent.agent.facade, ds4agent.tools.mcp\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types', 'pydantic')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_server_cannot_fill_the_prompt_with_its_tool_listing():
    from ds4agent.tools.mcp.model import (
        MAX_DESCRIPTION_CHARS,
        MAX_SERVER_PROMPT_BYTES,
        RemoteTool,
        bound_tools,
    )

    def tool(name, description="d", schema=None):
        return RemoteTool("srv", name, description, schema or {"type": "object"}, False, False)

    huge = tool("huge", "x" * (2 << 20))
    fat_schema = tool("fat", schema={"type": "object", "description": "y" * 20_000})
    kept, notices = bound_tools("srv", [huge, fat_schema, tool("small")])
    assert [t.name for t in kept] == ["huge", "small"]
    assert len(kept[0].description) < MAX_DESCRIPTION_CHARS + 40 and kept[0].description.endswith("[description cut]")
    assert any("`huge` (2,097,152 characters) was cut" in n for n in notices)
    assert any("tool `fat` left out" in n for n in notices)
    many = [tool(f"t{i}", "z" * 3000) for i in range(40)]
    kept, notices = bound_tools("srv", many)
    assert sum(len(t.description) for t in kept) <= MAX_SERVER_PROMPT_BYTES and 0 < len(kept) < 40
    assert notices == [f"MCP server `srv`: {40 - len(kept)} of its 40 tools left out: they would add more than 64 KiB "
                       "to the prompt"]
