"""`ds4agent` with no subcommand: the agent itself. Which model (the flag, the environment, the
model a resumed session was saved with, the usual lookup), then which front end: headless for
`-p`, the plain line mode for `--plain` or a stdout that is not a terminal, else the Textual app.
Each front end is imported only when it runs, so the headless path never loads Textual."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from ds4agent.agent.settings import AgentRun
from ds4agent.engine.hostmem import share_one_arena
from ds4agent.models.locate import resolve_model_path


def main(run: AgentRun) -> int:
    # Before the front end starts any thread: the worker that loads and prefills then allocates
    # from the heap whose freed blocks the engine keeps for reuse (engine/hostmem.py).
    share_one_arena()
    if run.demo:
        # The tour runs in a scratch project of its own, with the scripted engine: no model.
        from ds4agent.agent import demo

        place = demo.default_place()
        demo.prepare(place)
        os.chdir(place.project)
        return _front_end(replace(run, model_path=None))
    model = run.model
    if model is None and not os.environ.get("DS4AGENT_MODEL"):
        model = recorded_model(run)
    return _front_end(replace(run, model=model, model_path=resolve_model_path(model)))


def _front_end(run: AgentRun) -> int:
    if run.prompt is not None:
        from ds4agent.ui import headless

        return headless.main(run)
    if run.plain or not sys.stdout.isatty():
        from ds4agent.ui import plain

        return plain.main(run)
    from ds4agent.ui import app

    return app.main(run)


def recorded_model(run: AgentRun) -> str | None:
    """For --resume PREFIX / --continue without a model: the model the session was saved with
    (the session index records it), so the exit line's "ds4agent --resume ID" works as printed.
    Said on stderr; None when there is no such record or the file is gone (the usual lookup)."""
    settings = run.settings
    if not (settings.resume or settings.continue_session):
        return None
    from ds4agent.sessions.entries import default_kv_dir
    from ds4agent.sessions.index import SessionIndex, find_entry

    kv_dir = default_kv_dir(settings.kv_dir)
    if settings.continue_session:
        sid = SessionIndex(kv_dir).latest_for(os.getcwd())
        found = (sid, SessionIndex(kv_dir).get(sid)) if sid else None
    else:
        found = find_entry(kv_dir, settings.resume)
    if found is None or found[1] is None or not found[1].model or not os.path.exists(found[1].model):
        return None
    sid, entry = found
    print(f"ds4agent: session {sid[:8]} was saved with {entry.model}; using that model", file=sys.stderr)
    return entry.model
