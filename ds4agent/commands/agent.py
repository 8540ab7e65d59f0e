"""`ds4agent` with no subcommand: the agent itself. Which model (the flag, the environment, the
model a resumed session was saved with, the usual lookup), then which front end: headless for
`-p`, the plain line mode for `--plain` or a stdout that is not a terminal, else the Textual app.
Each front end is imported only when it runs, so the headless path never loads Textual."""

from __future__ import annotations

import argparse
import os
import sys

from ds4agent.models.locate import resolve_model_path


def main(args: argparse.Namespace) -> int:
    if getattr(args, "demo", False):
        # The tour runs in a scratch project of its own, with the scripted engine: no model.
        from ds4agent.agent import demo

        place = demo.default_place()
        demo.prepare(place)
        os.chdir(place.project)
        args.model_path = None
        return _front_end(args)
    if args.model is None and not os.environ.get("DS4AGENT_MODEL"):
        args.model = recorded_model(args)
    args.model_path = resolve_model_path(args.model)
    return _front_end(args)


def _front_end(args: argparse.Namespace) -> int:
    if args.prompt is not None:
        from ds4agent.ui import headless

        return headless.main(args)
    if args.plain or not sys.stdout.isatty():
        from ds4agent.ui import plain

        return plain.main(args)
    from ds4agent.ui import app

    return app.main(args)


def recorded_model(args: argparse.Namespace) -> str | None:
    """For --resume PREFIX / --continue without a model: the model the session was saved with
    (the session index records it), so the exit line's "ds4agent --resume ID" works as printed.
    Said on stderr; None when there is no such record or the file is gone (the usual lookup)."""
    if not (args.resume or args.continue_session):
        return None
    from ds4agent.sessions.entries import default_kv_dir
    from ds4agent.sessions.index import SessionIndex, find_entry

    kv_dir = default_kv_dir(args.kv_dir)
    if args.continue_session:
        sid = SessionIndex(kv_dir).latest_for(os.getcwd())
        found = (sid, SessionIndex(kv_dir).get(sid)) if sid else None
    else:
        found = find_entry(kv_dir, args.resume)
    if found is None or found[1] is None or not found[1].model or not os.path.exists(found[1].model):
        return None
    sid, entry = found
    print(f"ds4agent: session {sid[:8]} was saved with {entry.model}; using that model", file=sys.stderr)
    return entry.model
