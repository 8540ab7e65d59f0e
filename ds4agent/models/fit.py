"""Will the model fit this machine? The one place that compares memory needed with memory present.

`pull` warns with it (RAM below a flavour's advice) and startup refuses with it (weights larger
than RAM), before any byte of an 80 GB file is mapped. The need is a plain number of bytes so a
finer estimate (weights as the engine holds them plus the session state for --ctx, as
`ds4agent info` computes) can be fed in later without changing any caller's shape.
"""

from __future__ import annotations

import os
from pathlib import Path

from .catalog import human_bytes
from .errors import ModelTooLargeError


def machine_ram() -> int | None:
    """Physical memory in bytes, or None where the system does not say (then nothing is refused)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return int(pages) * int(page_size)


def fit_problem(need_bytes: int, ram_bytes: int | None, *, what: str) -> str | None:
    """A sentence saying why `need_bytes` does not fit `ram_bytes`, or None when it fits (or the
    RAM is unknown: refusing a model because we could not measure would be worse)."""
    if ram_bytes is None or need_bytes <= ram_bytes:
        return None
    return (f"{what} needs about {human_bytes(need_bytes)} of memory and this machine has "
            f"{human_bytes(ram_bytes)} of RAM")


def check_fits(model_bytes: int, ram_bytes: int | None, *, what: str = "the model") -> None:
    """Refuse (ModelTooLargeError, with the numbers) a model whose memory need exceeds the RAM."""
    problem = fit_problem(model_bytes, ram_bytes, what=what)
    if problem:
        raise ModelTooLargeError(
            f"{problem}; it cannot run here. Choose a smaller model (`ds4agent pull` lists them "
            "with the RAM each needs)."
        )


def model_bytes(path: Path) -> int:
    """What the weights at `path` need in memory, counted as their size on disk (a GGUF file, or
    every file of a directory written by `ds4agent convert`): the engine maps the routed experts
    as stored and holds the rest at about their file size."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def check_model_fits(path: Path) -> None:
    """The startup check: the weights at `path` against this machine's RAM."""
    check_fits(model_bytes(path), machine_ram(), what=f"{path.name}")
