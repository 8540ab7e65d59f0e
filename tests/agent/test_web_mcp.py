"""README's web example (docs/examples/mcp-web.json: a page-fetch and a web-search MCP server) run
through the agent against a local stand-in of both servers (tests/tools/mcp_web_standin.py): the
config's names, the tools the model sees and calls, and their results. No network."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ds4agent.agent import events as ev
from ds4agent.tools.mcp import load_config
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "mcp-web.json"
STANDIN = str(ROOT / "tests" / "tools" / "mcp_web_standin.py")


def test_the_readme_shows_the_example_config_verbatim():
    # Inside a list item: every line indented by two spaces.
    text = EXAMPLE.read_text(encoding="utf-8")
    shown = "".join("  " + line if line.strip() else line for line in text.splitlines(True))
    assert "  ```json\n" + shown + "  ```\n" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_example_config_gives_the_model_web_search_and_fetch(tmp_path):
    example = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    servers = example["mcpServers"]
    assert sorted(servers) == ["fetch", "search"]
    # The same entries with the program swapped for the stand-in (env and ${VAR} expansion kept).
    local = {name: {**entry, "command": sys.executable, "args": [STANDIN, name]} for name, entry in servers.items()}
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "mcp.json").write_text(json.dumps({"mcpServers": local}), encoding="utf-8")
    (tmp_path / "work").mkdir()
    config = load_config(tmp_path / "work", config_dir, environ={"BRAVE_API_KEY": "test-key"})
    assert config.errors == ()
    assert dict(next(s for s in config.user if s.name == "search").env) == {"BRAVE_API_KEY": "test-key"}
    config = dataclasses.replace(config, log_dir=tmp_path / "logs")
    calls = [("search__brave_web_search", {"query": "Python 3.13 release date"}),
             ("fetch__fetch", {"url": "https://example.com/"})]
    # Plan mode: both declare themselves read-only, so even a planning model may look things up.
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=calls), reply("7 October 2024.", think="")],
                           mcp=config, permission="plan", answer=lambda e: "n")  # n: keep planning
    try:
        assert "MCP servers: fetch (1 tool), search (1 tool)" in [n.text for n in of(h.events, ev.Notice)]
        system = h.text(0).decode("utf-8")
        assert '"name": "search__brave_web_search"' in system and '"name": "fetch__fetch"' in system
        evs = h.turn("When was Python 3.13 released? Check python.org.")
        assert [(r.name, r.ok, r.text) for r in of(evs, ev.ToolResult)] == [
            ("search__brave_web_search", True,
             "Python 3.13.0 was released on 7 October 2024 - https://www.python.org/\n"),
            ("fetch__fetch", True,
             "Example Domain\n\nThis domain is for use in illustrative examples in documents.\n")]
        assert [e.tool for e in of(evs, ev.PermissionRequest)] == ["plan"]  # the web tools never asked
    finally:
        h.stop()
