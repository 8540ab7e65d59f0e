"""Typed errors of the KVC session files.

Every failure that crosses the sessions boundary is a `KVCError` subclass. `str(err)` is exactly
the readable text the spec quotes (kvc-format.md §5, §8.3, §9.5, §12.4-12.5), so messages match
ds4's wording and tests can assert them; the optional `path` says which file was involved (the UI
decides whether to show it). The subclasses group the errors by the chain stage that raised them,
which is what callers branch on (e.g. the agent invalidates its live KV only after a payload error).
"""

from __future__ import annotations

from pathlib import Path


class KVCError(Exception):
    """Base class: a KVC file could not be read, validated, written or found."""

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = Path(path) if path is not None else None

    def __str__(self) -> str:
        return self.message

    def with_path(self) -> str:
        """`<path>: <message>` when the file is known (for CLI lines and logs); the message alone
        when it already names the path (directory errors do, for callers that show str(err))."""
        if self.path is None or str(self.path) in self.message:
            return self.message
        return f"{self.path}: {self.message}"


class KVCIOError(KVCError):
    """The operating system refused an open/read/write (message = strerror text, chain 8.3 step 1)."""


class KVCHeaderError(KVCError):
    """The 48-byte header (plus text length) fails the acceptance predicate (§2)."""


class KVCKindError(KVCError):
    """The reason byte says the file is not the kind the caller asked for (chain 8.3 step 3)."""


class KVCTextError(KVCError):
    """Rendered-text problems: truncated, too large, or not the current system prompt."""


class KVCSizeError(KVCError):
    """The file is shorter than its header's text + payload lengths (chain 8.3 step 5)."""


class KVCTrailerError(KVCError):
    """KTM / session-title trailer problems, or bytes after the last section (§5)."""


class KVCIntegrityError(KVCError):
    """The file's bytes do not match the checksum it was written with (damaged on disk)."""


class KVCMismatchError(KVCError):
    """The file was written by a different model or quantisation (chain 8.3 steps 7-8)."""


class KVCIdentityError(KVCError):
    """The file name does not match the identity computed from its contents (§12.3)."""


class KVCPayloadError(KVCError):
    """The DSV4 payload is invalid or does not fit the running model/context (§9.5, step 12)."""


class SessionChangedError(KVCError):
    """The session's file was rewritten since this process loaded or saved it (another instance
    saved the same session): saving over it would lose that instance's turns."""


class KVCWriteError(KVCError):
    """A save failed; the previous file (if any) is untouched and no temp file is left."""


class KVCStoreError(KVCError):
    """Store-level refusals: bad/unknown/ambiguous id prefix, nothing to save."""


# Exact texts from the spec, in one place so writers and tests agree.
INVALID_HEADER = "invalid KV header"
NOT_A_SESSION = "KV file is not an agent session"
NOT_A_SYSPROMPT = "KV file is not a system prompt cache"
TRUNCATED_TEXT = "truncated cached text"
TEXT_TOO_LARGE = "cached text is too large"
SYSPROMPT_MISMATCH = "cached text does not match current system prompt"
SHORTER_THAN_HEADER = "KV file is shorter than its header says"
INVALID_KTM = "invalid KTM trailer"
MISSING_TITLE = "missing agent session title trailer"
TRUNCATED_TITLE = "truncated agent session title trailer"
EMPTY_TITLE = "empty agent session title"
TITLE_TOO_LARGE = "agent session title is too large"
TRAILING_BYTES = "unexpected trailing bytes"
MISSING_CHECKSUM = "missing or invalid checksum trailer"
CHECKSUM_MISMATCH = "the file's checksum does not match its contents: it was damaged after it was written"
DIFFERENT_MODEL = "KV checkpoint was written for a different model"
DIFFERENT_QUANT = "KV checkpoint was written for a different quantization"
IDENTITY_MISMATCH = "cached session identity does not match file name"
TOKEN_COUNT_MISMATCH = "KV payload token count mismatch"
LOAD_FAILED = "failed to load KV payload"

# §9.5 payload errors
P_TRUNCATED = "truncated session payload"
P_READ_FAILED = "failed to read session payload"
P_VERSION = "unsupported session payload version"
P_CONTEXT = "KV checkpoint does not fit current context"
P_LAYOUT = "KV checkpoint was written for a different DS4 layout"
P_CHUNK = "KV checkpoint graph chunk layout does not match current runtime"
P_RAW_RING = "KV checkpoint raw ring layout does not match current context"
P_COMP_CAPACITY = "KV checkpoint compressed cache is larger than current context"
P_TOKEN_ID = "KV checkpoint has invalid token id"
P_LOGITS = "KV checkpoint has non-finite logits"
P_COMP_ROWS = "KV checkpoint has invalid compressed row count"
P_INDEX_ROWS = "KV checkpoint has invalid indexer row count"
P_TRAILING = "KV checkpoint has trailing payload bytes"
# ds4agent's own: a stand-alone check (no model to compare with) met a layout beyond any model's
P_IMPLAUSIBLE = "KV checkpoint claims a layout no DS4 model has"

# §12.4 / §12.5 store errors
NOTHING_TO_SAVE = "nothing to save"
