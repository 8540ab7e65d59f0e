"""Building a real agent from the command line: engine loader, session store, tools, settings.

Kept apart from the facade so tests (and the UI's snapshot tests) can build an Agent from
explicit parts without touching the real model or the user's directories.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ds4agent.agent.settings import AgentRun, AgentSettings

if TYPE_CHECKING:
    from ds4agent.engine import Engine
    from ds4agent.sessions.store import SessionStore
    from ds4agent.tools import Tool
    from ds4agent.tools.mcp import McpConfig


def engine_loader(model_path: Path, ctx: int, device: str | None = None, *, ranks: int | None = None,
                  hosts: str | None = None,
                  split: list[int] | None = None) -> Callable[[Callable[[float], None]], Engine]:
    """A loader the worker thread runs: the model with progress (0..1), in this process on `device`
    (None: the GPU when there is one) or, with `ranks` / `hosts`, split over a pipeline whose rank 0
    is this process (ds4agent.engine.load_engine)."""

    def load(progress: Callable[[float], None]) -> Engine:
        from ds4agent.engine import load_engine

        return load_engine(model_path, ctx=ctx, progress=progress, ranks=ranks, hosts=hosts, split=split,
                           device=device)

    return load


def open_store(kv_dir: Path | None) -> SessionStore:
    from ds4agent.sessions.entries import default_kv_dir
    from ds4agent.sessions.store import SessionStore

    return SessionStore(default_kv_dir(kv_dir))


def build_from_run(
    run: AgentRun,
) -> tuple[Callable[[Callable[[float], None]], Engine], SessionStore, list[Tool], AgentSettings, McpConfig | None]:
    if run.demo:
        return build_demo(run)
    settings = run.fresh_settings()
    # Resolved once, by commands/agent.py (models.locate.resolve_model_path: the flag, the
    # environment, the model directory, ./ds4flash.gguf); no second fallback here.
    if run.model_path is None:
        raise ValueError("no model: the command line resolves one before the agent is built")
    model_path = Path(run.model_path)
    from ds4agent.models.fingerprint import fingerprint

    settings.model_path = str(model_path.expanduser().resolve())
    settings.model_fingerprint = fingerprint(model_path)
    store = open_store(settings.kv_dir)
    from ds4agent.tools import default_tools
    from ds4agent.tools.mcp import load_config

    # --no-mcp: none of the configured MCP servers (a diagnostic switch, like --no-sysprompt-cache).
    mcp = load_config(settings.cwd) if run.mcp else None
    where = run.placement
    split = list(where.split) if where.split is not None else None
    return (engine_loader(model_path, settings.ctx, where.device, ranks=where.ranks, hosts=where.hosts, split=split),
            store, default_tools(settings.edit_upto), settings, mcp)


def build_demo(
    run: AgentRun,
) -> tuple[Callable[[Callable[[float], None]], Engine], SessionStore, list[Tool], AgentSettings, McpConfig | None]:
    """`--demo`: the scripted tour engine (demo.py) in the demo's own directory; the other flags
    (permission mode, think mode, plain, -p) apply as usual. The caller has made the demo project
    the working directory (demo.prepare)."""
    import dataclasses

    from ds4agent.agent import demo
    from ds4agent.tools import default_tools
    from ds4agent.tools.mcp import load_config

    place = demo.default_place()
    settings = run.fresh_settings()
    settings.cwd = place.project
    settings.kv_dir = place.kv_dir
    settings.journal_dir = place.state_dir / "journal"
    settings.undo_dir = place.state_dir / "checkpoints"
    settings.model_path = "demo"
    mcp = load_config(place.project, config_dir=place.config_dir)
    mcp = dataclasses.replace(mcp, user=(), log_dir=place.log_dir)  # only the demo's own server

    def load(progress: Callable[[float], None]) -> Engine:
        progress(1.0)
        return demo.DemoEngine(place, ctx=settings.ctx)  # type: ignore[return-value]

    return load, open_store(place.kv_dir), default_tools(settings.edit_upto), settings, mcp
