"""Which MCP servers to start: the `mcpServers` map of Claude Code's `.mcp.json`, and the approvals.

    load_config(cwd, config_dir, environ=os.environ) -> McpConfig
    McpConfig.servers(use_project) -> list[ServerConfig]   the merged table (project wins a name clash)
    Approvals(config_dir).answer(project) / .remember(project, approved)
    project_root(cwd) -> Path                              where `.mcp.json` is looked for
    default_config_dir(), default_log_dir() -> Path        ds4agent's config / server log directories

Two files, the same format (`{"mcpServers": {"name": {"command": ..., "args": [...], "env": {...}}}}`,
as Claude Code, Cursor and others write it; VS Code's `"servers"` key, with the same entries, is
read too when a file has no `"mcpServers"`): `mcp.json` in ds4agent's config directory (the user's
servers) and `.mcp.json` at the root of the working tree (the project's servers). A project file
starts programs that came with a checkout, so it is used only once the user approved that file for
that directory; the answer is remembered by the file's SHA-256, so an edited file is asked about
again. `${VAR}` and `${VAR:-default}` in command, args and env are expanded from the environment,
like Claude Code does. Only the stdio transport is supported: an entry of another type is reported
and skipped. A bad entry costs only itself: the other servers of the file are still used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ds4agent.fsutil import atomic_write
from ds4agent.tools.userdirs import default_config_dir

PROJECT_FILE = ".mcp.json"
USER_FILE = "mcp.json"
APPROVALS_FILE = "mcp-approvals.json"
# A configuration file is a few hundred bytes; anything this large is not one (and is not read).
MAX_CONFIG_BYTES = 1 << 20
# A server's name becomes the first half of its tools' names (`server__tool`), which the model
# writes in a DSML invoke: letters, digits, '-' and '_' only, and never the "__" separator itself.
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class McpConfigError(Exception):
    """A configuration value that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class ServerConfig:
    """One server to start: the program, its arguments and extra environment (already expanded)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    source: Literal["user", "project"] = "user"

    def command_line(self) -> str:
        """The program and its arguments as one readable line (for questions and listings)."""
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class ApprovableFile:
    """A project file that makes the agent run commands (`.mcp.json`, the hooks file), as read:
    where it is, the project root it belongs to, and its SHA-256, by which Approvals remembers
    the user's answer (an edited file is asked about again)."""

    path: Path
    root: Path
    sha256: str


@dataclass(frozen=True)
class ProjectFile(ApprovableFile):
    """The project's `.mcp.json` and its servers."""

    servers: tuple[ServerConfig, ...]


@dataclass(frozen=True)
class McpConfig:
    """Both files, read. `errors` are readable lines (a file that is not JSON, a bad entry)."""

    config_dir: Path
    user: tuple[ServerConfig, ...] = ()
    project: ProjectFile | None = None
    errors: tuple[str, ...] = ()
    user_path: Path | None = field(default=None, compare=False)
    log_dir: Path | None = None  # where the servers' stderr goes; None: default_log_dir()

    def servers(self, use_project: bool) -> list[ServerConfig]:
        """The servers to start, sorted by name (the order their tools are listed in the system
        prompt: stable from run to run, so the system-prompt cache keeps hitting)."""
        table = {s.name: s for s in self.user}
        if use_project and self.project is not None:
            table.update({s.name: s for s in self.project.servers})  # the project wins a clash
        return [table[name] for name in sorted(table)]


def default_log_dir() -> Path:
    """Where each server's stderr is kept (`NAME.log`, rewritten at every start)."""
    import platformdirs

    return Path(platformdirs.user_log_dir("ds4agent")) / "mcp"


def project_root(cwd: Path) -> Path:
    """The working tree's root: the nearest directory at or above cwd holding `.git` (a directory,
    or a file in a git worktree); cwd itself outside a repository."""
    cwd = Path(cwd).resolve()
    for directory in (cwd, *cwd.parents):
        if (directory / ".git").exists():
            return directory
    return cwd


def _expand(value: str, environ: Mapping[str, str], where: str) -> str:
    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise McpConfigError(f"{where}: the environment variable {name} is not set (and has no default)")

    return _VAR.sub(substitute, value)


def _server(name: str, entry: Any, source: Literal["user", "project"], environ: Mapping[str, str],
            where: str) -> ServerConfig:
    where = f"{where}: server {name!r}"
    if not SERVER_NAME.fullmatch(name) or "__" in name:
        raise McpConfigError(f"{where}: a server name is letters, digits, '-' and '_' (no '__'), "
                             "at most 64 characters")
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected an object with a command")
    kind = entry.get("type", "stdio")
    if kind != "stdio":
        raise McpConfigError(f"{where}: transport {kind!r} is not supported (only stdio)")
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip():
        raise McpConfigError(f"{where}: command must be a non-empty string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: args must be a list of strings")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise McpConfigError(f"{where}: env must map names to strings")
    return ServerConfig(
        name=name,
        command=_expand(command, environ, where),
        args=tuple(_expand(a, environ, where) for a in args),
        env=tuple((k, _expand(v, environ, where)) for k, v in env.items()),
        source=source,
    )


def _read(path: Path) -> bytes | None:
    """The file's bytes; None when it does not exist. Refuses a file too large to be a config."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as err:
        raise McpConfigError(f"{path}: {err.strerror or err}") from None
    if size > MAX_CONFIG_BYTES:
        raise McpConfigError(f"{path}: {size} bytes is too large for an MCP configuration (at most "
                             f"{MAX_CONFIG_BYTES})")
    try:
        return path.read_bytes()
    except OSError as err:
        raise McpConfigError(f"{path}: {err.strerror or err}") from None


def parse_servers(data: bytes, source: Literal["user", "project"], where: str,
                  environ: Mapping[str, str]) -> tuple[tuple[ServerConfig, ...], tuple[str, ...]]:
    """The servers of one file and the errors of the entries that were skipped."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return (), (f"{where}: not valid JSON: {err}",)
    # Claude Code's key, or VS Code's ("servers", same entries) when a file has only that one.
    key = "servers" if isinstance(doc, dict) and "mcpServers" not in doc and "servers" in doc else "mcpServers"
    servers = doc.get(key, {}) if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return (), (f"{where}: expected an object with an \"mcpServers\" (or VS Code's \"servers\") object",)
    found: list[ServerConfig] = []
    errors: list[str] = []
    for name, entry in servers.items():
        try:
            found.append(_server(name, entry, source, environ, where))
        except McpConfigError as err:
            errors.append(str(err))
    return tuple(found), tuple(errors)


def load_config(cwd: Path, config_dir: Path | None = None,
                environ: Mapping[str, str] | None = None) -> McpConfig:
    """Read the user's file and the project's. Never raises for a file's content: problems are
    listed in `errors` and the file (or the entry) is left out."""
    config_dir = Path(config_dir) if config_dir is not None else default_config_dir()
    env = os.environ if environ is None else environ
    errors: list[str] = []
    user_path = config_dir / USER_FILE
    found = _read_servers(user_path, "user", env, errors)
    user = found[1] if found is not None else ()
    root = project_root(cwd)
    path = root / PROJECT_FILE
    found = _read_servers(path, "project", env, errors)
    project = ProjectFile(path, root, hashlib.sha256(found[0]).hexdigest(), found[1]) if found is not None else None
    return McpConfig(config_dir, user, project, tuple(errors), user_path)


def _read_servers(path: Path, source: Literal["user", "project"], env: Mapping[str, str],
                  errors: list[str]) -> tuple[bytes, tuple[ServerConfig, ...]] | None:
    """A servers file's bytes and its valid servers, its problems added to `errors`; None when
    there is no such file or it cannot be read as one."""
    try:
        data = _read(path)
        if data is None:
            return None
        servers, bad = parse_servers(data, source, str(path), env)
    except McpConfigError as err:
        errors.append(str(err))
        return None
    errors += bad
    return data, servers


class Approvals:
    """The user's answers about project files: directory -> (file hash, approved or not).

    Kept in ds4agent's config directory, never in the project (a checkout must not approve itself).
    An answer counts only for the exact file it was given for: a changed file is asked about again.
    """

    def __init__(self, config_dir: Path, filename: str = APPROVALS_FILE) -> None:
        # filename: the hooks' approvals (agent/hooks.py) are kept the same way, in a file of their own
        self.path = Path(config_dir) / filename

    def _load(self) -> dict[str, Any]:
        data = _read(self.path)
        if data is None:
            return {}
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise McpConfigError(f"{self.path}: not valid JSON: {err}") from None
        projects = doc.get("projects") if isinstance(doc, dict) else None
        return projects if isinstance(projects, dict) else {}

    def answer(self, project: ApprovableFile) -> bool | None:
        """True approved, False refused for good, None never asked (or asked about another file)."""
        entry = self._load().get(str(project.root))
        if not isinstance(entry, dict) or entry.get("sha256") != project.sha256:
            return None
        approved = entry.get("approved")
        return approved if isinstance(approved, bool) else None

    def remember(self, project: ApprovableFile, approved: bool) -> None:
        try:
            projects = self._load()
        except McpConfigError:
            projects = {}  # an unreadable answers file is replaced rather than blocking every answer
        projects[str(project.root)] = {"sha256": project.sha256, "approved": approved}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": 1, "projects": projects}, indent=2, ensure_ascii=False) + "\n"
        atomic_write(self.path, text.encode("utf-8"))
