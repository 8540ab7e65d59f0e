"""Where the user's own ds4agent configuration lives (MCP servers, their approvals, sandbox
settings): a directory no job can write, since it lies outside every working tree's boundary."""

from __future__ import annotations

from pathlib import Path


def default_config_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("ds4agent"))
