"""The user's sandbox settings: which Unix sockets outside the tree a job may connect to, and the
job environment that goes with them.

    load_allowed_sockets(config_dir=None) -> tuple[str, ...]   from CONFIG_DIR/sandbox.json
    job_environment(environ, allowed) -> dict                   the environment a job starts with

sandbox.json: {"allow_unix_sockets": ["/run/user/1000/docker.sock", "~/.ssh/agent.sock"]}. It lies in
the user's configuration directory, which no job can write. A bad file is an error naming it (a
silently ignored allow-list would leave the user wondering why docker fails).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ds4agent.tools.userdirs import SettingsFileError, read_settings

SETTINGS_FILE = "sandbox.json"

# Variables that point a program at a server outside the boundary (a terminal multiplexer runs
# `tmux new-window CMD` outside it; an agent or bus socket holds keys and session services). They
# are dropped from a job's environment unless the socket they name is allowed.
SOCKET_VARIABLES = ("TMUX", "TMUX_PANE", "STY", "WINDOW", "SSH_AUTH_SOCK", "SSH_AGENT_PID",
                    "DBUS_SESSION_BUS_ADDRESS", "DOCKER_HOST", "GPG_AGENT_INFO", "KITTY_LISTEN_ON",
                    "WEZTERM_UNIX_SOCKET", "NVIM", "NVIM_LISTEN_ADDRESS", "ZELLIJ", "ZELLIJ_SESSION_NAME",
                    "XDG_SESSION_ID", "SWAYSOCK", "I3SOCK", "HYPRLAND_INSTANCE_SIGNATURE")


class SandboxSettingsError(Exception):
    """The settings file cannot be used; the message names it and says why."""


def load_allowed_sockets(config_dir: Path | None = None) -> tuple[str, ...]:
    try:
        path, data = read_settings(SETTINGS_FILE, config_dir)
    except SettingsFileError as err:
        raise SandboxSettingsError(str(err)) from None
    if data is None:
        return ()
    sockets = data.get("allow_unix_sockets", []) if isinstance(data, dict) else None
    if not isinstance(sockets, list) or not all(isinstance(s, str) and s for s in sockets):
        raise SandboxSettingsError(f"{path}: \"allow_unix_sockets\" must be a list of socket paths")
    return tuple(os.path.realpath(os.path.expanduser(s)) for s in sockets)


def job_environment(environ: Mapping[str, str], allowed: tuple[str, ...]) -> dict[str, str]:
    """`environ` less the variables that lead to a socket outside the boundary (kept when the
    socket they name is on the allow-list)."""
    out = dict(environ)
    for name in SOCKET_VARIABLES:
        value = out.get(name)
        if value is None:
            continue
        target = value.split(",", 1)[0].removeprefix("unix://").removeprefix("unix:path=")
        if not (target.startswith("/") and os.path.realpath(target) in allowed):
            del out[name]
    return out
