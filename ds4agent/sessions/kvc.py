"""The KVC file envelope: 48-byte header, rendered text, payload region, trailers (kvc-format.md).

Layout (all little-endian):
    0      48-byte header (KVCHeader)
    48     u32 text_bytes
    52     rendered text (bytes, never decoded)
    52+t   DSV4 payload, exactly header.payload_bytes bytes (payload.py)
    ...    trailers in ascending ext-bit order: KTM tool map (bit0, server only), title (bit3)

Public API:
    KVCHeader                       pack()/unpack(); reason_code/reason_name/key_kind
    Envelope                        what steps 1-6 of chain 8.3 learnt about a file (text, title, ...)
    read_header(path)               the 48-byte header alone (ranking/filtering by header fields)
    read_envelope(path, kind)       chain 8.3 steps 1-6 (open, header, kind, text, size, trailers)
    load_kvc(path, kind, ...)       the whole chain 8.3 (steps 1-12) -> LoadedKVC
    verify_kvc(path, quant_bits)    stand-alone validation (kv verify / kv show) -> VerifyResult
    write_kvc(path, header, text, state, shape, title)   atomic write (§6.1, via ds4agent.fsutil)
    classify_name / is_scan_name / session_identity / text_sha1 / expected_identity

Every failure is a KVCError subclass whose message is the spec's text; a refused file is never
modified or deleted here.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from ds4agent.fsutil import atomic_entry

from . import errors as E
from .errors import (
    KVCError,
    KVCHeaderError,
    KVCIdentityError,
    KVCIntegrityError,
    KVCIOError,
    KVCKindError,
    KVCMismatchError,
    KVCPayloadError,
    KVCSizeError,
    KVCTextError,
    KVCTrailerError,
    KVCWriteError,
)
from .payload import (
    FLASH_SHAPE,
    PAYLOAD_HEADER_BYTES,
    PAYLOAD_VERSION,
    PAYLOAD_VERSION_S,
    PayloadHeader,
    PayloadInfo,
    PayloadShape,
    PayloadState,
    as_shape,
    payload_size,
    read_payload,
    validate_state,
    write_payload,
)

MAGIC = b"KVC"
FILE_VERSION = 1
PAYLOAD_ABI = 2  # header byte 20 of the current ("[L]") layout: the only one ds4agent writes
PAYLOAD_ABI_S = 0  # byte 20 of files from earlier ds4 builds ("[S]", §13): read, never written
HEADER_BYTES = 48
PREFIX_BYTES = 52  # header + u32 text_bytes: the text starts here
_HEADER = struct.Struct("<3sBBBBBIIIB3sQQQ")  # 3+1+1+1+1+1+4+4+4+1+3+8+8+8 = 48
_U32 = struct.Struct("<I")
U32_MAX = 0xFFFFFFFF

REASON_NAMES = ("unknown", "cold", "continued", "evict", "shutdown", "agent-system", "agent-session")
REASON_UNKNOWN, REASON_COLD, REASON_CONTINUED, REASON_EVICT, REASON_SHUTDOWN = 0, 1, 2, 3, 4
REASON_SYSTEM, REASON_SESSION = 5, 6

EXT_KTM = 0x01  # KTM tool-id map trailer (server only)
EXT_RESPONSES_VISIBLE = 0x02  # marker: text is the client-visible transcript
EXT_THINKING_VISIBLE = 0x04  # marker
EXT_TITLE = 0x08  # session-title trailer
EXT_RESERVED = 0xF0  # unknown sections follow the known ones; end-of-file not checked
# ds4agent's own section, under the first reserved bit: a CRC-32 of every byte before it (header,
# text, payload, title). ds4 checks none of this: a bit flipped on disk in a payload loads as a
# silently different KV state. ds4's readers stop after the payload and the sections they know
# (ds4 8d57664: ds4_kvstore.c reads header, text and payload by their sizes; ds4_agent.c's
# session load reads payload_bytes; neither checks the end of the file), so the files stay
# theirs to load. Layout: the file's last 12 bytes, b"DS4C", u32 version, u32 CRC-32 (zlib's),
# under the last reserved bit: any section a later ds4 adds under a lower bit comes before it.
# Version 2 sums the header with its hit accounting (hits and last_used) read as zeros: those
# fields are rewritten in place on every use (entries.touch, §7), so a CRC over them is broken by
# the first cache hit (version 1 did that: a touched version-1 file reads as damaged).
EXT_CHECKSUM = 0x80
_CHECKSUM = struct.Struct("<4sII")
_CHECKSUM_MAGIC = b"DS4C"
_CHECKSUM_VERSION = 2
_CHECKSUM_VERSIONS = (1, 2)
HITS_SPAN = (12, 16)  # the header's hit count, rewritten in place on each use
LAST_USED_SPAN = (32, 40)  # the header's last-use time, likewise


def summed_header(raw: bytes, version: int = _CHECKSUM_VERSION) -> bytes:
    """The header bytes as the checksum of `version` sums them (version 2: hit accounting zeroed)."""
    if version < 2:
        return bytes(raw)
    out = bytearray(raw)
    for lo, hi in (HITS_SPAN, LAST_USED_SPAN):
        out[lo:hi] = bytes(hi - lo)
    return bytes(out)

# How much rendered text a listing reads (kv ls/show/verify, /list, the picker): enough for any
# real first user message (the title) and the preview. A header may claim up to 4 GiB of text
# (a sparse file costs nothing on disk), so the rest is skipped or hashed in chunks, never held.
TEXT_SCAN_BYTES = 64 * 1024
_TEXT_CHUNK = 1 << 20

# The kinds chain 8.3 distinguishes.
KIND_SESSION = "session"
KIND_SYSPROMPT = "sysprompt"
KIND_CHECKPOINT = "checkpoint"  # stand-alone validation of server files: no reason check

_HEX40_NAME = re.compile(r"[0-9a-fA-F]{40}\.kv")
_SYSPROMPT_HEX_NAME = re.compile(r"sysprompt-([0-9a-fA-F]{16})\.kv")


def reason_name(code: int) -> str:
    """Name of a reason byte (§11); any byte > 6 reads as `unknown`."""
    return REASON_NAMES[code] if 0 <= code < len(REASON_NAMES) else REASON_NAMES[0]


@dataclass(frozen=True)
class KVCHeader:
    """The 48-byte fixed header (§2). `reason` and `reserved` keep the raw bytes as read, so a
    rewriter writes back what it did not understand (§7); reason_code maps bytes > 6 to 0."""

    quant_bits: int
    reason: int
    ext_flags: int
    model_id: int
    tokens: int
    hits: int
    ctx_size: int
    created_at: int
    last_used: int
    payload_bytes: int
    reserved: bytes = b"\0\0\0"
    payload_abi: int = PAYLOAD_ABI  # byte 20: 2, or 0 for an [S] file (§13)

    def pack(self) -> bytes:
        return _HEADER.pack(MAGIC, FILE_VERSION, self.quant_bits, self.reason, self.ext_flags, self.model_id,
                            self.tokens, self.hits, self.ctx_size, self.payload_abi, self.reserved,
                            self.created_at, self.last_used, self.payload_bytes)

    @classmethod
    def unpack(cls, data: bytes) -> KVCHeader:
        """Parse 48 bytes, applying the acceptance predicate (§2 items 2-3)."""
        if len(data) < HEADER_BYTES:
            raise KVCHeaderError(E.INVALID_HEADER)
        (magic, version, quant, reason, ext, model, tokens, hits, ctx, abi, reserved,
         created, last_used, payload) = _HEADER.unpack(data[:HEADER_BYTES])
        if (magic != MAGIC or version != FILE_VERSION or abi not in (PAYLOAD_ABI, PAYLOAD_ABI_S)
                or tokens == 0 or quant not in (2, 4)):
            raise KVCHeaderError(E.INVALID_HEADER)
        return cls(quant, reason, ext, model, tokens, hits, ctx, created, last_used, payload, reserved, abi)

    @property
    def layout(self) -> str:
        """`[L]` (current ds4 layout) or `[S]` (earlier ds4 builds: byte 20 = 0, §13)."""
        return "[S]" if self.payload_abi == PAYLOAD_ABI_S else "[L]"

    @property
    def payload_version(self) -> int:
        """The DSV4 payload version this layout carries: 1 in an [S] file, 2 in an [L] file (§13)."""
        return PAYLOAD_VERSION_S if self.payload_abi == PAYLOAD_ABI_S else PAYLOAD_VERSION

    @property
    def reason_code(self) -> int:
        return self.reason if self.reason <= REASON_SESSION else REASON_UNKNOWN

    @property
    def reason_name(self) -> str:
        return reason_name(self.reason)

    @property
    def key_kind(self) -> str:
        if self.ext_flags & EXT_RESPONSES_VISIBLE:
            return "responses-visible"
        if self.ext_flags & EXT_THINKING_VISIBLE:
            return "thinking-visible"
        return "token-text"


# ------------------------------------------------------------------------------------------------
# names and identities (§4, §12.3)


def is_scan_name(name: str) -> bool:
    """The directory-scan name rule: exactly 40 hex digits (either case) + `.kv`."""
    return _HEX40_NAME.fullmatch(name) is not None


def classify_name(name: str) -> tuple[str, str | None]:
    """('hex40', lowercase hex) | ('sysprompt-hex', lowercase 16 hex) | ('sysprompt', None) |
    ('other', None)."""
    if is_scan_name(name):
        return "hex40", name[:40].lower()
    m = _SYSPROMPT_HEX_NAME.fullmatch(name)
    if m:
        return "sysprompt-hex", m.group(1).lower()
    if name == "sysprompt.kv":
        return "sysprompt", None
    return "other", None


def text_sha1(text: bytes) -> str:
    return hashlib.sha1(text).hexdigest()


def session_identity(title: bytes, created_at: int) -> str:
    """SHA-1 over the stored title bytes followed by u64le(created_at), lowercase hex (§12.3)."""
    return hashlib.sha1(bytes(title) + struct.pack("<Q", created_at)).hexdigest()


def sysprompt_name(text: bytes) -> str:
    """ds4agent's system-prompt cache name: sysprompt-<first 16 hex of SHA1(text)>.kv (§12.2)."""
    return f"sysprompt-{text_sha1(text)[:16]}.kv"


# ------------------------------------------------------------------------------------------------
# reading: chain 8.3 steps 1-6


@dataclass(frozen=True)
class Envelope:
    """Everything outside the payload, as validated by chain 8.3 steps 1-6.

    `text` is the whole rendered text, or only its first bytes when the envelope was read with a
    text limit (listings): `text_bytes` is always the full length, `text_complete` says which."""

    path: Path
    file_size: int
    header: KVCHeader
    text: bytes
    title: bytes | None  # bit3 trailer, as stored (maybe not UTF-8)
    ktm_entries: int | None  # entry count of a skipped KTM trailer (bit0), else None
    text_bytes: int
    text_digest: str | None = None  # SHA-1 of the whole text, hashed while reading a capped text
    checksum: int | None = None  # the CRC-32 the checksum trailer holds (EXT_CHECKSUM), else None
    checksum_offset: int = 0  # where that trailer starts: the CRC covers every byte before it
    checksum_version: int = 0  # how the CRC sums the header (summed_header)

    @property
    def payload_offset(self) -> int:
        return PREFIX_BYTES + self.text_bytes

    @property
    def text_complete(self) -> bool:
        return len(self.text) == self.text_bytes

    def text_sha1(self) -> str:
        """SHA-1 of the whole stored text (what a legacy or server file's name must carry)."""
        if self.text_digest is not None:
            return self.text_digest
        if not self.text_complete:
            raise ValueError("the text was read capped and not hashed")
        return text_sha1(self.text)


def _strerror(err: OSError, path: Path | str) -> KVCIOError:
    return KVCIOError(err.strerror or str(err), path=path)


def _read_exact(f: BinaryIO, nbytes: int) -> bytes | None:
    """Exactly nbytes, or None at end of file (files are opened unbuffered, where one read may
    legally return less than asked)."""
    data = f.read(nbytes)
    if len(data) == nbytes:
        return data
    parts = [data]
    got = len(data)
    while got < nbytes:
        more = f.read(nbytes - got)
        if not more:
            return None
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_header(path: str | Path) -> KVCHeader:
    """Just the 48-byte header of the file at `path` (the §2 predicate applied); raises OSError or
    KVCHeaderError. For callers that rank or filter files by header fields alone."""
    with open(path, "rb") as f:
        return KVCHeader.unpack(f.read(HEADER_BYTES))


def read_prefix(f: BinaryIO, file_size: int) -> tuple[KVCHeader, int]:
    """Header + text_bytes (the §2 predicate, item 1 included)."""
    if file_size < PREFIX_BYTES:
        raise KVCHeaderError(E.INVALID_HEADER)
    data = _read_exact(f, PREFIX_BYTES)
    if data is None:
        raise KVCHeaderError(E.INVALID_HEADER)
    return KVCHeader.unpack(data), _U32.unpack_from(data, HEADER_BYTES)[0]


# The most KTM entries a skip walks: ds4-server itself rejects a map of more than 4 x max_ids
# (max_ids 100000) entries, so no map it uses is longer. Bounding by the bytes left alone is not
# enough: a sparse file can claim 2^32 entries within its size, one 8-byte read each.
KTM_MAX_ENTRIES = 4 * 100_000


def _skip_ktm(f: BinaryIO, pos: int, file_size: int) -> tuple[int, int]:
    """Skip a KTM section at `pos` by its self-described length (§5.1 "Skipping").

    Returns (end offset, entry count). Every length is checked against the bytes left before
    it is used; of the server's value limits only the entry count's applies here (see above).
    """
    left = file_size - pos
    head = _read_exact(f, 8) if left >= 8 else None
    if head is None or head[:3] != b"KTM" or head[3] != 1:
        raise KVCTrailerError(E.INVALID_KTM)
    count = _U32.unpack_from(head, 4)[0]
    left -= 8
    if 8 * count > left or count > KTM_MAX_ENTRIES:
        raise KVCTrailerError(E.INVALID_KTM)
    for _ in range(count):
        lens = _read_exact(f, 8) if left >= 8 else None
        if lens is None:
            raise KVCTrailerError(E.INVALID_KTM)
        id_len, dsml_len = struct.unpack("<II", lens)
        left -= 8
        if id_len + dsml_len > left:
            raise KVCTrailerError(E.INVALID_KTM)
        f.seek(id_len + dsml_len, 1)
        left -= id_len + dsml_len
    return file_size - left, count


def _read_text(f: BinaryIO, text_bytes: int, limit: int | None, digest: bool) -> tuple[bytes, str | None]:
    """Step 4's read: the whole text, or (limit given) its first `limit` bytes, the rest hashed in
    bounded chunks when `digest` else skipped. The length was checked against the file before."""
    if limit is None or text_bytes <= limit:
        text = _read_exact(f, text_bytes)
        if text is None:
            raise KVCTextError(E.TRUNCATED_TEXT)
        return text, None
    head = _read_exact(f, limit)
    if head is None:
        raise KVCTextError(E.TRUNCATED_TEXT)
    if not digest:
        f.seek(text_bytes - limit, 1)
        return head, None
    h = hashlib.sha1(head)
    left = text_bytes - limit
    while left:
        chunk = _read_exact(f, min(left, _TEXT_CHUNK))
        if chunk is None:
            raise KVCTextError(E.TRUNCATED_TEXT)
        h.update(chunk)
        left -= len(chunk)
    return head, h.hexdigest()


def _read_envelope(f: BinaryIO, path: Path, file_size: int, kind: str, *,
                   text_limit: int | None = None, hash_text: bool = False) -> Envelope:
    header, text_bytes = read_prefix(f, file_size)  # step 2
    if kind == KIND_SESSION and header.reason != REASON_SESSION:  # step 3
        raise KVCKindError(E.NOT_A_SESSION)
    if kind == KIND_SYSPROMPT and header.reason != REASON_SYSTEM:
        raise KVCKindError(E.NOT_A_SYSPROMPT)
    if text_bytes > file_size - PREFIX_BYTES:  # step 4: checked before allocating the text
        raise KVCTextError(E.TRUNCATED_TEXT)
    text, digest = _read_text(f, text_bytes, text_limit, hash_text)
    payload_end = PREFIX_BYTES + text_bytes + header.payload_bytes
    if header.payload_bytes > file_size - PREFIX_BYTES - text_bytes:  # step 5, before any trailer
        raise KVCSizeError(E.SHORTER_THAN_HEADER)
    pos, title, ktm_entries = payload_end, None, None  # step 6: trailers in bit order
    if header.ext_flags & (EXT_KTM | EXT_TITLE):
        f.seek(payload_end)
    if header.ext_flags & EXT_KTM:
        pos, ktm_entries = _skip_ktm(f, pos, file_size)
    if header.ext_flags & EXT_TITLE:
        raw_len = _read_exact(f, 4) if file_size - pos >= 4 else None
        if raw_len is None:
            raise KVCTrailerError(E.MISSING_TITLE)
        title_len = _U32.unpack(raw_len)[0]
        if title_len > file_size - pos - 4:  # before allocating the title
            raise KVCTrailerError(E.TRUNCATED_TITLE)
        if title_len == 0:
            raise KVCTrailerError(E.EMPTY_TITLE)
        title = _read_exact(f, title_len)
        if title is None:
            raise KVCTrailerError(E.TRUNCATED_TITLE)
        pos += 4 + title_len
    checksum, checksum_offset, checksum_version = None, 0, 0
    if header.ext_flags & EXT_CHECKSUM:
        end = file_size - _CHECKSUM.size
        raw = None
        if end >= pos:
            f.seek(end)
            raw = _read_exact(f, _CHECKSUM.size)
        magic, version, crc = _CHECKSUM.unpack(raw) if raw is not None else (b"", 0, 0)
        if magic != _CHECKSUM_MAGIC or version not in _CHECKSUM_VERSIONS:
            raise KVCTrailerError(E.MISSING_CHECKSUM)
        checksum, checksum_offset, checksum_version = crc, end, version
        if not header.ext_flags & EXT_RESERVED & ~EXT_CHECKSUM:
            pos += _CHECKSUM.size  # no other section: the checksum ends the file
    # A reserved ext bit announces an unknown section after the known ones: do not check the end.
    if not header.ext_flags & EXT_RESERVED & ~EXT_CHECKSUM and pos != file_size:
        raise KVCTrailerError(E.TRAILING_BYTES)
    f.seek(PREFIX_BYTES + text_bytes)  # back to the payload start
    return Envelope(path, file_size, header, text, title, ktm_entries, text_bytes, digest, checksum, checksum_offset,
                    checksum_version)


def _check_checksum(f: BinaryIO, env: Envelope) -> None:
    """The file's bytes before the checksum trailer against the CRC it holds (a pass over the
    file: its pages are usually still cached from the read just made)."""
    if env.checksum is None:
        return
    back = f.tell()
    f.seek(0)
    head = _read_exact(f, HEADER_BYTES)
    if head is None or env.checksum_offset < HEADER_BYTES:
        raise KVCTrailerError(E.MISSING_CHECKSUM)
    crc, left = zlib.crc32(summed_header(head, env.checksum_version)), env.checksum_offset - HEADER_BYTES
    while left:
        chunk = _read_exact(f, min(left, _TEXT_CHUNK * 8))
        if chunk is None:
            raise KVCTrailerError(E.MISSING_CHECKSUM)
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    f.seek(back)
    if crc != env.checksum:
        raise KVCIntegrityError(E.CHECKSUM_MISMATCH)


def _open(path: Path) -> tuple[BinaryIO, int]:
    try:
        # stat first: opening a FIFO (or a device) named *.kv for reading would block forever
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise KVCIOError("not a regular file", path=path)
        f = open(path, "rb", buffering=0)  # closed by the caller
    except OSError as err:
        raise _strerror(err, path) from None
    try:
        size = os.fstat(f.fileno()).st_size
    except OSError as err:
        f.close()
        raise _strerror(err, path) from None
    return f, size


def read_envelope(path: str | Path, kind: str = KIND_CHECKPOINT, *, text_limit: int | None = None) -> Envelope:
    """Chain 8.3 steps 1-6 on `path` for the given kind (payload not read). With text_limit only
    the text's first bytes are read (listings: a header may claim a 4 GiB text)."""
    path = Path(path)
    f, size = _open(path)
    with f:
        try:
            return _read_envelope(f, path, size, kind, text_limit=text_limit)
        except KVCError as err:
            err.path = path
            raise
        except OSError as err:
            raise _strerror(err, path) from None


def _identity_hashes_text(name: str, header: KVCHeader) -> bool:
    """Whether the identity a name carries (§12.3) is a hash of the text (legacy sessions, server
    checkpoints, sysprompt caches) rather than of the title trailer; expected_identity's cases."""
    form, _ = classify_name(name)
    return form == "sysprompt-hex" or (form == "hex40" and not header.ext_flags & EXT_TITLE)


def expected_identity(name: str, env: Envelope) -> str | None:
    """The hex the file name must carry (§12.3), or None when the name carries none."""
    form, _ = classify_name(name)
    if form == "hex40":
        if env.header.ext_flags & EXT_TITLE and env.title is not None:
            return session_identity(env.title, env.header.created_at)
        return env.text_sha1()
    if form == "sysprompt-hex":
        return env.text_sha1()[:16]
    return None


def check_identity(path: Path, env: Envelope) -> None:
    """Chain 8.3 step 10: identity == name (hex compared case-insensitively)."""
    want = expected_identity(path.name, env)
    _, have = classify_name(path.name)
    if want is not None and want != have:
        raise KVCIdentityError(E.IDENTITY_MISMATCH, path=path)


# ------------------------------------------------------------------------------------------------
# the whole agent chain (8.3)


@dataclass(frozen=True)
class LoadedKVC:
    envelope: Envelope
    payload: PayloadState | None  # None for a stripped session (payload_bytes == 0, §12.6)


def load_kvc(
    path: str | Path,
    kind: str,
    *,
    shape: PayloadShape,
    ctx: int,
    model_id: int,
    quant_bits: int,
    expected_text: bytes | None = None,
) -> LoadedKVC:
    """Run chain 8.3 for `kind` (KIND_SESSION or KIND_SYSPROMPT) against the running model.

    expected_text: the freshly rendered system text (step 9, system-prompt caches only).
    Steps 11-12 only produce a PayloadState; committing it to a live session is the caller's job,
    so any failure here leaves live state untouched by construction.
    """
    path = Path(path)
    shape = as_shape(shape)
    f, size = _open(path)  # step 1
    with f:
        try:
            env = _read_envelope(f, path, size, kind)  # steps 2-6
            hdr = env.header
            if hdr.payload_bytes and hdr.model_id != model_id:  # step 7
                raise KVCMismatchError(E.DIFFERENT_MODEL)
            if hdr.payload_bytes and hdr.quant_bits != quant_bits:  # step 8
                raise KVCMismatchError(E.DIFFERENT_QUANT)
            if kind == KIND_SYSPROMPT and expected_text is not None and env.text != expected_text:  # step 9
                raise KVCTextError(E.SYSPROMPT_MISMATCH)
            check_identity(path, env)  # step 10
            _check_checksum(f, env)  # ds4agent's integrity check, before the payload is parsed
            if hdr.payload_bytes == 0 and kind == KIND_SESSION:  # stripped: the caller rebuilds (§12.6)
                return LoadedKVC(env, None)
            state = read_payload(f, hdr.payload_bytes, shape, ctx, version=hdr.payload_version)  # step 11
            assert isinstance(state, PayloadState)
            if len(state.tokens) != hdr.tokens:  # step 12
                raise KVCPayloadError(E.TOKEN_COUNT_MISMATCH)
            return LoadedKVC(env, state)
        except KVCError as err:
            err.path = path
            raise
        except MemoryError:
            raise KVCPayloadError(E.LOAD_FAILED, path=path) from None
        except OSError as err:
            raise _strerror(err, path) from None


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a stand-alone validation: envelope (if steps 1-6 passed), payload info, error."""

    path: Path
    kind: str
    envelope: Envelope | None
    payload: PayloadInfo | None
    error: KVCError | None

    @property
    def ok(self) -> bool:
        return self.error is None


def standalone_kind(name: str, reason: int | None) -> str:
    """§8.3 stand-alone rule: sysprompt names -> cache; hex40 with reason 6 -> session; else checkpoint."""
    form, _ = classify_name(name)
    if form in ("sysprompt-hex", "sysprompt"):
        return KIND_SYSPROMPT
    if form == "hex40" and reason == REASON_SESSION:
        return KIND_SESSION
    return KIND_CHECKPOINT


def verify_kvc(path: str | Path, *, quant_bits: int | None = None, shape: PayloadShape | None = None) -> VerifyResult:
    """Stand-alone validation (kv verify / kv show): chain 8.3 without a live session.

    Skips step 9 (no current system text), step 8 unless quant_bits is given, step 10 for names
    without a hash. Step 7 compares with model_id 0. Step 11 runs §9.5 with ctx := header
    ctx_size, reading tokens/logits/counts and size-checking (not reading) the array data.

    Layout choice when no model is loaded (`shape` None): a file records (layers, D, Di, V) but
    not the per-layer ratios, so the Flash ratios are used when the file's layout is Flash's;
    for any other layout (tiny test models) the ratio-free checks run and the result says
    `layers_checked=False`, rather than calling a valid test-model file invalid or guessing
    ratios from counts (a layer with 0 rows could be dense or have a ratio larger than T).
    """
    path = Path(path)
    kind = KIND_CHECKPOINT
    env = info = None
    try:
        f, size = _open(path)
        with f:
            try:
                hdr, _ = read_prefix(f, size)
                kind = standalone_kind(path.name, hdr.reason)
                f.seek(0)
            except KVCError:
                kind = standalone_kind(path.name, None)
                raise
            # The text is read capped, and hashed in chunks only when the name must carry its
            # SHA-1 (step 10): the output needs a preview, and a header may claim 4 GiB.
            env = _read_envelope(f, path, size, kind, text_limit=TEXT_SCAN_BYTES,
                                 hash_text=_identity_hashes_text(path.name, hdr))
            hdr = env.header
            if hdr.payload_bytes and hdr.model_id != 0:
                raise KVCMismatchError(E.DIFFERENT_MODEL)
            if hdr.payload_bytes and quant_bits is not None and hdr.quant_bits != quant_bits:
                raise KVCMismatchError(E.DIFFERENT_QUANT)
            check_identity(path, env)
            _check_checksum(f, env)
            if hdr.payload_bytes == 0 and kind == KIND_SESSION:
                return VerifyResult(path, kind, env, None, None)  # stripped session: not rebuilt
            use_shape = as_shape(shape) if shape is not None else None
            if use_shape is None:
                head = _read_exact(f, PAYLOAD_HEADER_BYTES)
                f.seek(env.payload_offset)
                key = PayloadHeader.unpack(head).layout_key if head is not None else None
                use_shape = FLASH_SHAPE if key == FLASH_SHAPE.layout_key else None
            info = read_payload(f, hdr.payload_bytes, use_shape, hdr.ctx_size, keep_arrays=False,
                                version=hdr.payload_version)
            assert isinstance(info, PayloadInfo)
            if info.header.n_tokens != hdr.tokens:
                raise KVCPayloadError(E.TOKEN_COUNT_MISMATCH)
            return VerifyResult(path, kind, env, info, None)
    except KVCError as err:
        err.path = path
        return VerifyResult(path, kind, env, info, err)
    except OSError as err:
        return VerifyResult(path, kind, env, info, _strerror(err, path))


# ------------------------------------------------------------------------------------------------
# writing (§6.1)


class _Summing:
    """A file being written, with the CRC-32 of everything written through it so far."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.crc = 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.f.write(data)

    def __getattr__(self, name: str):
        return getattr(self.f, name)  # flush, fileno, ...: the file's own


def write_kvc(
    path: str | Path,
    header: KVCHeader,
    text: bytes,
    state: PayloadState | None,
    shape: PayloadShape | None,
    title: bytes | None = None,
) -> KVCHeader:
    """Write a complete KVC file atomically; returns the header actually written.

    header.payload_bytes and the EXT_TITLE bit are filled in here from `state` and `title`.
    state None writes a stripped session (payload_bytes 0, §12.6). Every input is checked before
    the temp file exists; the temp file lives in the target directory (so rename is atomic), is
    fsynced before the rename, and is unlinked on any failure (the old file stays untouched).
    """
    path = Path(path)
    text = bytes(text)
    if len(text) > U32_MAX:
        raise KVCTextError(E.TEXT_TOO_LARGE, path=path)
    if title is not None:
        title = bytes(title)
        if len(title) > U32_MAX:
            raise KVCTrailerError(E.TITLE_TOO_LARGE, path=path)
        if not title:
            raise KVCTrailerError(E.EMPTY_TITLE, path=path)
    if header.quant_bits not in (2, 4):
        raise KVCWriteError(f"quantization bits must be 2 or 4, not {header.quant_bits}", path=path)
    if state is not None:
        assert shape is not None, "a payload needs its shape"
        shape = as_shape(shape)
        n_tokens = int(len(state.tokens))
        ctx = int(state.ctx)
        validate_state(state, shape)
        header = replace(header, tokens=n_tokens, ctx_size=ctx, payload_bytes=payload_size(shape, n_tokens, ctx))
    else:
        header = replace(header, payload_bytes=0)
    if header.tokens == 0 or header.tokens > U32_MAX:
        raise KVCWriteError("cannot save an empty KV state (0 tokens)", path=path)
    ext = header.ext_flags & ~EXT_TITLE | (EXT_TITLE if title is not None else 0) | EXT_CHECKSUM
    # ds4agent never writes a KTM map, nor an [S] file (§13): a header read from one is re-saved
    # in the current layout.
    header = replace(header, ext_flags=ext & ~EXT_KTM, payload_abi=PAYLOAD_ABI)

    try:
        # fsutil's atomic replace of the directory entry (§6.1): temp beside the target, fsync,
        # rename, directory fsync; the temp is removed on any failure. A symlink at `path` is
        # replaced, never written through. The temp name `<final>.tmp.<random>.tmp`
        # keeps the `.kv.tmp.` shape that the scan rule ignores and clean_stale_temps recognises.
        with atomic_entry(path, mode=0o600, prefix=path.name + ".tmp.") as out:
            f = _Summing(out)
            packed = header.pack()
            out.write(packed)
            f.crc = zlib.crc32(summed_header(packed))
            f.write(_U32.pack(len(text)))
            f.write(text)
            if state is not None:
                written = write_payload(f, state, shape)
                if written != header.payload_bytes:  # the size formula and the writer must agree
                    raise KVCWriteError(f"payload size {written} differs from the expected "
                                        f"{header.payload_bytes}", path=path)
            if title is not None:
                f.write(_U32.pack(len(title)))
                f.write(title)
            out.write(_CHECKSUM.pack(_CHECKSUM_MAGIC, _CHECKSUM_VERSION, f.crc))
    except KVCError as err:
        err.path = path
        raise
    except OSError as err:
        msg = err.strerror or str(err)
        if err.errno == errno.ENOSPC:
            msg = "No space left on device"
        raise KVCWriteError(msg, path=path) from None
    return header
