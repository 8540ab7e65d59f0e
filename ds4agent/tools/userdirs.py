"""Where the user's own ds4agent configuration lives (MCP servers, their approvals, sandbox
settings): a directory no job can write, since it lies outside every working tree's boundary."""

from __future__ import annotations

import json
from pathlib import Path


def default_config_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("ds4agent"))


class SettingsFileError(ValueError):
    """A settings file in the user's config directory that cannot be read or is not JSON."""


# A settings file is a few lines; a larger one is not read whole (a mistake, or a hostile file).
SETTINGS_MAX_BYTES = 1 << 20


def read_settings(name: str, config_dir: Path | None = None) -> tuple[Path, object]:
    """(path, its parsed JSON) of the settings file `name` in the user's config directory, or
    (path, None) when there is none. SettingsFileError names the file and what is wrong."""
    path = (config_dir or default_config_dir()) / name
    try:
        with open(path, "rb") as f:
            raw = f.read(SETTINGS_MAX_BYTES)
    except FileNotFoundError:
        return path, None
    except OSError as err:
        raise SettingsFileError(f"{path}: cannot read it: {err.strerror or err}") from None
    try:
        return path, json.loads(raw)
    except ValueError as err:
        raise SettingsFileError(f"{path}: not valid JSON: {err}") from None
