"""The flavours of ds4's DeepSeek V4 Flash weights on the Hugging Face Hub (as ds4's own
download_model.sh names them), with the sizes and the RAM advice a user needs to choose one.

Sizes are the approximate on-disk sizes for listings and warnings; a download is checked against
the exact size and SHA-256 the Hub reports, never against these.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PullError

HUB_REPO = "antirez/deepseek-v4-gguf"
HUB_REVISION = "main"
GB = 1000**3


@dataclass(frozen=True)
class Flavour:
    name: str
    filename: str
    approx_bytes: int
    ram_bytes: int | None  # the smallest machine ds4 recommends it for; None: not a model to run alone
    advice: str  # one line for the listing
    runnable: bool = True  # False: a part ds4agent downloads but does not run (mtp)


FLAVOURS: tuple[Flavour, ...] = (
    Flavour("q2-imatrix", "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf",
            81 * GB, 96 * GB, "recommended; for 96-128 GB machines"),
    Flavour("q4-imatrix",
            "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-imatrix.gguf",
            153 * GB, 256 * GB, "for machines with 256 GB or more"),
    Flavour("q2", "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2.gguf",
            81 * GB, 96 * GB, "older q2, without imatrix"),
    Flavour("q4", "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2.gguf",
            153 * GB, 256 * GB, "older q4, without imatrix"),
    Flavour("mtp", "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf", int(3.5 * GB), None,
            "speculative-decoding part; not used by ds4agent yet", runnable=False),
)

RECOMMENDED = FLAVOURS[0]


def flavour(name: str) -> Flavour:
    for f in FLAVOURS:
        if f.name == name:
            return f
    names = ", ".join(f.name for f in FLAVOURS)
    raise PullError(f"no model named {name!r}; the names are: {names} (`ds4agent pull` lists them)")


def by_filename(filename: str) -> Flavour | None:
    return next((f for f in FLAVOURS if f.filename == filename), None)


def human_bytes(n: int) -> str:
    """Decimal units, as the Hub and disk vendors state sizes ("81 GB")."""
    for unit, scale in (("TB", 1000**4), ("GB", GB), ("MB", 1000**2), ("kB", 1000)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{n} B"
