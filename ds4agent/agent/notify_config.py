"""When and how the front ends ring the terminal (ui/notify.py does the ringing).

    NotifyConfig(mode, after)     mode: auto | bell | osc | off; after: seconds a turn must run
    load(config_dir=None)         CONFIG_DIR/notify.json, or the defaults when there is none
    resolve(mode, after, config_dir=None)   the command line's --notify / --notify-after over the file

notify.json: {"mode": "auto", "after_seconds": 30}. A bad file is an error naming it (a silently
ignored setting would leave the user wondering why nothing rings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ds4agent.tools.userdirs import SettingsFileError, read_settings

SETTINGS_FILE = "notify.json"
MODES = ("auto", "bell", "osc", "off")
DEFAULT_AFTER = 30.0


class NotifyConfigError(Exception):
    """The notification settings cannot be used; the message names the file or flag and why."""


@dataclass(frozen=True)
class NotifyConfig:
    # auto: BEL, plus a desktop notification (OSC 9 / OSC 777) where the terminal is known to show
    # one; bell: BEL only; osc: OSC 9 whatever the terminal; off: nothing.
    mode: str = "auto"
    after: float = DEFAULT_AFTER  # a turn that ran at least this long rings when it ends


def _check(mode: object, after: object, where: str) -> NotifyConfig:
    if mode not in MODES:
        raise NotifyConfigError(f"{where}: notification mode must be one of {', '.join(MODES)} (got {mode!r})")
    if isinstance(after, bool) or not isinstance(after, int | float) or not math.isfinite(after) or after < 0:
        raise NotifyConfigError(f"{where}: after_seconds must be a number of seconds >= 0 (got {after!r})")
    return NotifyConfig(str(mode), float(after))


def load(config_dir: Path | None = None) -> NotifyConfig:
    try:
        path, data = read_settings(SETTINGS_FILE, config_dir)
    except SettingsFileError as err:
        raise NotifyConfigError(str(err)) from None
    if data is None:
        return NotifyConfig()
    if not isinstance(data, dict):
        raise NotifyConfigError(f"{path}: expected an object like {{\"mode\": \"auto\", \"after_seconds\": 30}}")
    unknown = sorted(set(data) - {"mode", "after_seconds"})
    if unknown:
        raise NotifyConfigError(f"{path}: unknown setting {unknown[0]!r} (mode, after_seconds)")
    return _check(data.get("mode", "auto"), data.get("after_seconds", DEFAULT_AFTER), str(path))


def resolve(mode: str | None, after: float | None, config_dir: Path | None = None) -> NotifyConfig:
    """The flags (None: not given) over the file over the defaults."""
    base = load(config_dir)
    return _check(base.mode if mode is None else mode, base.after if after is None else after,
                  "--notify" if mode is not None else "--notify-after")
