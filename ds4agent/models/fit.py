"""Will the model fit this machine? The one place that compares memory needed with memory present.

`pull` warns with it (RAM below a flavour's advice, before downloading). Startup's refusal is the
engine's (`engine.memory.check_fits`, run by load_engine before any weight is read): it knows what
the engine will hold of each tensor, which a file size does not (a Flash-shape test file shares
its expert bytes; Q8_0 grows in memory). Both read the machine's RAM from `machine_ram` here.
"""

from __future__ import annotations

import os

from .catalog import human_bytes

# The context a run gets unless told (ds4-agent's default, agent-reference.md §2): the command
# line, the agent's settings and the engine's memory estimate all start from it.
DEFAULT_CTX = 100_000


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
