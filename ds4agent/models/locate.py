"""Which model a command runs, and where pulled models live.

The lookup order (first that applies wins):
    --model PATH                   given on the command line (must exist)
    $DS4AGENT_MODEL                (must exist)
    ./ds4flash.gguf                ds4's own convention, in the current directory
    the newest model in the model directory (what `ds4agent pull` fetched last)
So after one `ds4agent pull`, plain `ds4agent` works from any directory.

The model directory: `--dir`, else $DS4AGENT_MODEL_DIR, else ~/.ds4/models (beside ds4's
~/.ds4/kvcache).
"""

from __future__ import annotations

import os
from pathlib import Path

from ds4agent.invocation import program

from .catalog import FLAVOURS, RECOMMENDED, human_bytes
from .errors import ModelNotFoundError

DEFAULT_MODEL_FILE = "ds4flash.gguf"
PART_SUFFIX = ".part"  # an unfinished download (pull.py); never a model to run


def model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("DS4AGENT_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".ds4" / "models"


def newest_pulled(directory: Path) -> Path | None:
    """The most recently pulled runnable model in `directory`: its finished .gguf files (a pull
    renames the verified file into place and touches one it finds already there, so the newest
    modification time is the last pull), leaving out parts that do not run alone (mtp)."""
    not_runnable = {f.filename for f in FLAVOURS if not f.runnable}
    try:
        entries = list(directory.iterdir())
    except OSError:  # no directory yet: nothing pulled
        return None
    found = []
    for p in entries:
        if p.suffix != ".gguf" or p.name in not_runnable or not p.is_file():
            continue
        try:
            found.append((p.stat().st_mtime, p.name, p))
        except OSError:
            continue
    return max(found)[2] if found else None


def resolve_model_path(explicit: str | os.PathLike[str] | None) -> Path:
    """The model to run, by the lookup order above. Raises ModelNotFoundError saying what to do."""
    if explicit:
        return _must_exist(Path(explicit).expanduser(), "--model")
    env = os.environ.get("DS4AGENT_MODEL")
    if env:
        return _must_exist(Path(env).expanduser(), "$DS4AGENT_MODEL")
    local = Path(DEFAULT_MODEL_FILE)
    if local.exists():
        return local
    directory = model_dir()
    pulled = newest_pulled(directory)
    if pulled is not None:
        return pulled
    raise ModelNotFoundError(
        f"no model found: no --model, no $DS4AGENT_MODEL, no ./{DEFAULT_MODEL_FILE}, and nothing "
        f"pulled into {directory}.\n" + _how_to_get_one()
    )


def _must_exist(path: Path, where: str) -> Path:
    if path.exists():
        return path
    raise ModelNotFoundError(f"no model found at {path} ({where}).\n" + _how_to_get_one())


def _how_to_get_one() -> str:
    r = RECOMMENDED
    run = program()
    return (
        f"  Download the recommended weights ({r.name}, about {human_bytes(r.approx_bytes)}; needs a "
        f"machine with {human_bytes(r.ram_bytes or 0)} of RAM or more):\n"
        f"    {run} pull {r.name}\n"
        "  To try the app without real weights, make a tiny random model:\n"
        f"    {run} make-test-model tiny.gguf && {run} --model tiny.gguf\n"
        f"  or take the tour of the tools, which needs no model: {run} --demo"
    )
