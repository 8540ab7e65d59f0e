"""The session directory (~/.ds4/kvcache): naming, listing, prefix resolution, titles, caches.

Shared with ds4 (ds4-server checkpoints, ds4-agent sessions): everything here follows
kvc-format.md §4, §8 and §12, so either program reads the other's files and neither deletes what
it does not own.

Public API (what the agent uses):

    default_kv_dir(explicit: str | PathLike | None = None) -> Path
        --kv-dir > $DS4AGENT_KV_DIR > $HOME/.ds4/kvcache (./.ds4/kvcache when HOME is unset/empty).

    store = SessionStore(directory)          # mkdir -p with mode 0700; removes stale temp files;
                                             # raises KVCIOError when the directory is unusable
    store.save_session(text, payload, *, shape, quant_bits, title=None, created_at=None,
                       loaded_from=None, model_id=0, n_tokens=None, now=None) -> SavedSession
        reason 6, ext 0x08 (title trailer), name = SHA1(title || u64le(created_at)).kv, atomic.
        title None -> derived from `text` (§12.7); created_at None -> now. Keep the returned
        .title/.created_at for re-saves (the name stays stable). After the rename it deletes
        `loaded_from` (this session's own legacy source file, or its file under an old title) and
        nothing else: another session is never deleted by a save, even when its text is a prefix
        of `text` (a /fork kept as a bookmark). payload None writes a stripped session (n_tokens,
        ctx required). SavedSession.message == "saved session <8 hex> (<N> tokens)".
    store.load_session(target, *, shape, ctx, model_id, quant_bits) -> LoadedSession
        target: a 1-40 hex id prefix or a path to a .kv file. Runs chain 8.3 (session kind).
        LoadedSession: text, payload (None for a stripped session: re-tokenise `text` and prefill),
        title, created_at, legacy (True: pass .path as loaded_from at the next save), id, path.
    store.list_sessions() -> list[StoredSession]      reason-6 files, newest first (last_used, then id)
    store.scan_sessions() -> (sessions, unreadable) the same plus UnreadableSession (id, reason) for
        each session file that cannot be read: shown, not hidden, and deletable
    store.resolve(prefix, *, sessions_only=True) -> StoreEntry     §12.5 errors as KVCStoreError; a
        prefix of an unreadable file says why it cannot be loaded
    store.find_session(prefix) -> StoreEntry | UnreadableSession   readable or not (for deletion)
    store.delete(prefix) -> Path                   deletes one session (readable or not) by id prefix
    store.save_sysprompt(text, payload, *, shape, quant_bits, model_id=0, now=None) -> Path
        sysprompt-<16 hex of SHA1(text)>.kv, reason 5; keeps the 8 most recently used caches.
    store.load_sysprompt(text, *, shape, ctx, model_id, quant_bits) -> PayloadState
        chain 8.3 as a system-prompt cache with the freshly rendered text; touches the file
        (hits/last_used) so recently used caches survive pruning. Any failure -> KVCError: the
        caller prefills the system prefix and calls save_sysprompt.

Helpers: derive_title(text) -> bytes, clip_title(title, n=70) -> bytes, display_text(b) -> str,
touch(path, now).

ds4-server's cache policy (its prefix lookup, §8.2, and its eviction, §10) is not here: the agent
never runs it, and a session is found by its id, or by its text (nearest_prefix, a crash resume).

All errors are KVCError subclasses (sessions/errors.py); str(err) is the spec's message.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ds4agent.fsutil import fsync_dir

from . import errors as E
from .entries import (
    FileStamp,
    LoadedSession,
    SavedSession,
    StoredSession,
    StoreEntry,
    UnreadableSession,
    file_stamp,
    touch,
)
from .errors import (
    KVCError,
    KVCIOError,
    KVCStoreError,
    KVCTextError,
    KVCWriteError,
    SessionChangedError,
)
from .kvc import (
    EXT_TITLE,
    KIND_SESSION,
    KIND_SYSPROMPT,
    PAYLOAD_ABI_S,
    PREFIX_BYTES,
    REASON_SESSION,
    REASON_SYSTEM,
    TEXT_SCAN_BYTES,
    KVCHeader,
    classify_name,
    load_kvc,
    read_envelope,
    read_header,
    read_prefix,
    session_identity,
    sysprompt_name,
    write_kvc,
)
from .payload import PayloadShape, PayloadState
from .titles import derive_title

SYSPROMPT_KEEP = 8  # §12.2: keep the 8 most recently used system-prompt caches
STALE_TEMP_SECONDS = 24 * 3600  # §6.2: another process may be mid-write on a younger temp file
_STALE_TEMP = re.compile(r"(?:[0-9a-fA-F]{40}|sysprompt|sysprompt-[0-9a-fA-F]{16})\.kv\.tmp\..*")
_HEX_PREFIX = re.compile(r"[0-9a-fA-F]{1,40}")


# ------------------------------------------------------------------------------------------------
# the store


def _file_in_the_way(directory: Path) -> Path | None:
    """The path itself or the nearest existing ancestor when that is not a directory (a file
    where the KV directory should be: said as such, not as the OS's bare "Not a directory")."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe if probe.exists() and not probe.is_dir() else None


def _mkdir_0700(directory: Path) -> None:
    """`mkdir -p` where every directory created gets mode 0700 (§4). Path.mkdir(parents=True)
    would give the parents the default mode, leaving e.g. ~/.ds4 world-readable."""
    missing = []
    probe = directory
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # created concurrently (another ds4 process): fine if it is a directory
    if not directory.is_dir():
        raise NotADirectoryError(20, "Not a directory")


class SessionStore:
    """One KV directory. Cheap to construct; every method re-reads the directory (other processes,
    e.g. ds4-server, write into it concurrently)."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self._clock = clock
        # Problems found while opening that do not stop the store from working (the agent shows
        # them as warnings at startup).
        self.notices: list[str] = []
        if create:
            blocker = _file_in_the_way(self.directory)
            if blocker is not None:
                what = "is a file" if blocker == self.directory else f"cannot be created: {blocker} is a file"
                raise KVCIOError(f"KV directory {self.directory} {what}, not a directory", path=self.directory)
            try:
                _mkdir_0700(self.directory)
            except OSError as err:
                # The directory is named in the message itself: callers (the agent's startup line,
                # the UI's fatal event) show str(err), and "Read-only file system" alone does not
                # say which of --kv-dir / $DS4AGENT_KV_DIR / ~/.ds4/kvcache was used.
                raise KVCIOError(f"cannot create KV directory {self.directory}: {err.strerror or err}",
                                 path=self.directory) from None
            if not self.directory.is_dir():
                raise KVCIOError(f"KV directory {self.directory} is not a directory", path=self.directory)
            self._restrict_mode()
            self.clean_stale_temps()

    def _restrict_mode(self) -> None:
        """An existing directory open to other users (mode 0755 from an older tool, a manual
        mkdir) is tightened to 0700 like a new one (§4): session files hold whole conversations,
        and a writable directory lets another user plant names. Reported when chmod is refused
        (someone else's directory)."""
        try:
            mode = stat.S_IMODE(os.stat(self.directory).st_mode)
        except OSError:
            return  # is_dir() just succeeded: a vanished directory shows up at the first use
        if not mode & 0o077:
            return
        try:
            os.chmod(self.directory, 0o700)
        except OSError as err:
            self.notices.append(f"KV directory {self.directory} is open to other users (mode {mode:04o}) "
                                f"and could not be restricted to 0700: {err.strerror or err}")

    def _now(self) -> int:
        return int(self._clock())

    # --- scanning -------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.directory))
        except OSError as err:
            raise KVCIOError(f"cannot read KV directory {self.directory}: {err.strerror or err}",
                             path=self.directory) from None

    def _probe(self, name: str) -> StoreEntry | UnreadableSession | None:
        """A scan-valid entry (§8.1), an unreadable session, or None (not a 40-hex name, or a
        damaged file whose valid header says it is not a session, e.g. a server checkpoint)."""
        form, hexid = classify_name(name)
        if form != "hex40":
            return None
        path = self.directory / name

        def unreadable(reason: str, st: os.stat_result) -> UnreadableSession:
            return UnreadableSession(path, hexid, reason, st.st_size, int(st.st_mtime))

        try:
            st = os.stat(path)
        except OSError as err:  # a dangling link, a file that cannot be looked at
            try:
                return unreadable(err.strerror or str(err), os.lstat(path))
            except OSError:
                return None  # gone meanwhile
        if not stat.S_ISREG(st.st_mode):  # never open a FIFO: it would block
            return unreadable("not a regular file", st)
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                header, text_bytes = read_prefix(f, st.st_size)
        except OSError as err:
            return unreadable(err.strerror or str(err), st)
        except KVCError as err:
            return unreadable(str(err), st)
        if st.st_size < PREFIX_BYTES + text_bytes + header.payload_bytes:
            if header.reason != REASON_SESSION:
                return None
            cut_text = text_bytes > st.st_size - PREFIX_BYTES  # chain 8.3 step 4, else step 5
            return unreadable(E.TRUNCATED_TEXT if cut_text else E.SHORTER_THAN_HEADER, st)
        return StoreEntry(path, hexid, header, st.st_size, text_bytes)

    def _probes(self) -> list[StoreEntry | UnreadableSession]:
        return [p for p in (self._probe(n) for n in self._names()) if p is not None]

    def entries(self) -> list[StoreEntry]:
        """Every scan-valid 40-hex file of any reason, newest first (last_used, then id)."""
        found = [e for e in self._probes() if isinstance(e, StoreEntry)]
        found.sort(key=lambda e: (-e.header.last_used, e.id))
        return found

    def describe(self, entry: StoreEntry) -> StoredSession | UnreadableSession:
        """A reason-6 entry's title (trailer, else derived from the text), or why it cannot be read."""
        try:
            env = read_envelope(entry.path, KIND_SESSION, text_limit=TEXT_SCAN_BYTES)  # a title, not 4 GiB
        except KVCError as err:
            return UnreadableSession(entry.path, entry.id, str(err), entry.file_size, entry.header.last_used)
        if env.title is not None:
            return StoredSession(entry, env.title, False)
        return StoredSession(entry, derive_title(env.text), True)

    def scan_sessions(self) -> tuple[list[StoredSession], list[UnreadableSession]]:
        """(sessions, unreadable sessions), each newest first. A session file that cannot be read
        is not left out silently (§8.1 would skip it): the user sees it, and why, and can delete
        it. Unreadable directory -> KVCIOError."""
        sessions: list[StoredSession] = []
        broken: list[UnreadableSession] = []
        for probe in self._probes():
            if isinstance(probe, StoreEntry):
                if probe.header.reason != REASON_SESSION:
                    continue
                probe = self.describe(probe)
            (broken if isinstance(probe, UnreadableSession) else sessions).append(probe)
        sessions.sort(key=lambda i: (-i.last_used, i.id))
        broken.sort(key=lambda u: (-u.last_used, u.id))
        return sessions, broken

    def list_sessions(self) -> list[StoredSession]:
        """Readable reason-6 sessions, newest first (scan_sessions for the unreadable ones too)."""
        return self.scan_sessions()[0]

    @staticmethod
    def _check_prefix(prefix: str) -> str:
        if not prefix:
            raise KVCStoreError("give a session id prefix")
        if not _HEX_PREFIX.fullmatch(prefix):
            # Not "invalid SHA prefix": ids are what /list shows, and `/load zzz` simply matches
            # none of them.
            raise KVCStoreError(f"no saved session matches {prefix}")
        return prefix.lower()

    @staticmethod
    def _unique(matches: list, prefix: str):
        if not matches:
            raise KVCStoreError(f"no saved session matches {prefix}")
        if len(matches) > 1:
            raise KVCStoreError(f"session prefix {prefix} is ambiguous")
        return matches[0]

    def resolve(self, prefix: str, *, sessions_only: bool = True) -> StoreEntry:
        """A unique scan-valid entry whose id starts with `prefix` (1-40 hex, any case), §12.5.

        A prefix that matches only an unreadable session file says why it cannot be loaded."""
        p = self._check_prefix(prefix)
        probes = self._probes()
        matches = [e for e in probes if isinstance(e, StoreEntry) and e.id.startswith(p)
                   and (not sessions_only or e.header.reason == REASON_SESSION)]
        if not matches and sessions_only:
            broken = [u for u in probes if isinstance(u, UnreadableSession) and u.id.startswith(p)]
            if len(broken) == 1:
                raise KVCStoreError(f"session {broken[0].short_id} cannot be loaded: {broken[0].reason}",
                                    path=broken[0].path)
        return self._unique(matches, prefix)

    def find_session(self, prefix: str) -> StoreEntry | UnreadableSession:
        """The one session file, readable or not, whose id starts with `prefix` (for deletion)."""
        p = self._check_prefix(prefix)
        return self._unique([e for e in self._probes() if e.id.startswith(p) and (
            isinstance(e, UnreadableSession) or e.header.reason == REASON_SESSION)], prefix)

    def _target_path(self, target: str | os.PathLike[str]) -> Path:
        """A path when `target` names an existing file (or looks like one), else a prefix."""
        text = os.fspath(target)
        if isinstance(target, os.PathLike) or os.sep in text or text.endswith(".kv"):
            path = Path(text)
            return path if path.is_absolute() or path.exists() else self.directory / path
        return self.resolve(text).path

    # --- sessions -------------------------------------------------------------------------------

    def load_session(self, target: str | os.PathLike[str], *, shape: PayloadShape, ctx: int,
                     model_id: int, quant_bits: int, max_text_bytes: int | None = None) -> LoadedSession:
        """Resolve and load a session through chain 8.3; nothing is deleted or modified.

        max_text_bytes: the most text a session that fits the context can hold (its tokens times
        the longest token's bytes): a longer text is refused from its header, before a byte of it is
        read (a stripped 512 MiB text would otherwise be read and tokenised, gigabytes and minutes,
        only to be refused)."""
        path = self._target_path(target)
        if max_text_bytes is not None:
            self._check_text_size(path, max_text_bytes, ctx)
        stamp = file_stamp(path)  # before reading: a save landing meanwhile then counts as a change
        loaded = load_kvc(path, KIND_SESSION, shape=shape, ctx=ctx, model_id=model_id, quant_bits=quant_bits)
        env = loaded.envelope
        legacy = env.title is None
        title = derive_title(env.text) if legacy else env.title
        created_at = env.header.created_at or self._now()
        form, hexid = classify_name(path.name)
        return LoadedSession(hexid or path.stem, path, env.text, loaded.payload, title, created_at,
                             env.header, legacy, stamp)

    def nearest_prefix(self, text: bytes, *, max_tokens: int, shape: PayloadShape, ctx: int, model_id: int,
                       quant_bits: int) -> LoadedSession | None:
        """The saved session (with its KV state) whose text is the longest byte prefix of `text` and
        holds at most `max_tokens` tokens, loaded; None when there is none. A crash resume starts
        from it and prefills only the rest. Files that fail to load are passed over."""
        text = bytes(text)
        try:
            infos = self.list_sessions()
        except KVCError:
            return None
        for info in sorted(infos, key=lambda i: -i.entry.text_bytes):
            e = info.entry
            if e.text_bytes > len(text) or e.header.tokens > max_tokens:
                continue
            try:
                if not text.startswith(read_envelope(e.path).text):
                    continue
                found = self.load_session(e.path, shape=shape, ctx=ctx, model_id=model_id,
                                          quant_bits=quant_bits)
            except (KVCError, OSError):
                continue
            if found.payload is not None:
                return found
        return None

    @staticmethod
    def _check_text_size(path: Path, max_text_bytes: int, ctx: int) -> None:
        try:
            with open(path, "rb") as f:
                _, text_bytes = read_prefix(f, os.fstat(f.fileno()).st_size)
        except OSError:
            return  # load_kvc reports what is wrong with the file, in its words
        if text_bytes > max_text_bytes:
            raise KVCTextError(f"the session's text ({text_bytes:,} bytes) is longer than a context of "
                               f"{ctx:,} tokens can hold", path=path)

    def save_session(self, text: bytes, payload: PayloadState | None, *, shape: PayloadShape | None,
                     quant_bits: int, title: bytes | str | None = None, created_at: int | None = None,
                     loaded_from: str | os.PathLike[str] | None = None, model_id: int = 0,
                     n_tokens: int | None = None, ctx: int | None = None,
                     now: int | None = None, expect: FileStamp | None = None) -> SavedSession:
        """Write `dir/<identity>.kv` (§12.4 steps 3-5); see the module docstring.

        expect: the stamp of that file as this process last loaded or wrote it. When the file
        exists with another stamp, someone else saved this session since: SessionChangedError,
        nothing written (the caller saves a fork instead of replacing their turns). None: no
        check (a new session, or one whose file this process never read)."""
        now = self._now() if now is None else int(now)
        text = bytes(text)
        if isinstance(title, str):
            title = title.encode()
        title = title or derive_title(text)
        created_at = now if not created_at else int(created_at)
        ident = session_identity(title, created_at)
        path = self.directory / f"{ident}.kv"
        if payload is None:
            if not n_tokens:
                raise KVCWriteError("a stripped session needs its token count", path=path)
            tokens, ctx = int(n_tokens), int(ctx or 0)
        else:
            tokens, ctx = len(payload.tokens), int(payload.ctx)
        header = KVCHeader(quant_bits=quant_bits, reason=REASON_SESSION, ext_flags=EXT_TITLE, model_id=model_id,
                           tokens=tokens, hits=0, ctx_size=ctx, created_at=created_at, last_used=now,
                           payload_bytes=0)
        if expect is not None:
            found = file_stamp(path)
            if found is not None and found != expect:
                raise SessionChangedError(f"session {ident[:8]} was saved by another ds4agent since it was "
                                          "loaded here", path=path)
        write_kvc(path, header, text, payload, shape, title)
        deleted = self._delete_ancestors(path, loaded_from)
        return SavedSession(ident, path, title, created_at, tokens, tuple(deleted), file_stamp(path))

    def _delete_ancestors(self, written: Path, loaded_from) -> list[Path]:
        """§12.4 step 5, narrowed: only the legacy file this very session was loaded from (it was
        just re-saved under its new identity), never the file just written (samefile:
        case-insensitive filesystems see `ABC…kv` and `abc…kv` as one file).

        ds4 [S] also deleted every other reason-6 file whose text is a strict prefix of the
        new text, as "earlier checkpoints of the same conversation". In ds4agent a conversation
        keeps one identity across saves, so such a file is always another session: a /fork kept as
        a bookmark, a session loaded and continued elsewhere. Deleting it would lose a session the
        user never deleted, so prefix files are left alone; the user deletes sessions."""
        deleted: list[Path] = []
        if loaded_from is not None and self._is_own_session_file(Path(loaded_from)):
            src = Path(loaded_from)
            try:
                same = os.path.samefile(src, written)
            except OSError:
                same = False
            if not same and self._unlink(src):
                deleted.append(src)
                fsync_dir(self.directory)
        return deleted

    def _is_own_session_file(self, path: Path) -> bool:
        """Only a reason-6 [L] file inside this directory is deleted as the legacy source: a session
        loaded by path from elsewhere (a backup, a copy) is never removed by a later save, nor an
        [S] file, which an earlier ds4 build sharing the directory may still use (§13)."""
        try:
            if not os.path.samefile(path.parent, self.directory):
                return False
            header = read_header(path)
            return header.reason == REASON_SESSION and header.payload_abi != PAYLOAD_ABI_S
        except (OSError, KVCError):
            return False

    @staticmethod
    def _unlink(path: Path) -> bool:
        try:
            path.unlink()
            return True
        except OSError:
            return False  # deletion is housekeeping: the save itself succeeded

    def delete(self, prefix: str) -> Path:
        """Delete the session (readable or not) whose id starts with `prefix`; returns its path."""
        entry = self.find_session(prefix)
        try:
            entry.path.unlink()
        except OSError as err:
            raise KVCIOError(err.strerror or str(err), path=entry.path) from None
        return entry.path

    # --- system-prompt caches (§12.2) -----------------------------------------------------------

    def sysprompt_path(self, text: bytes) -> Path:
        return self.directory / sysprompt_name(bytes(text))

    def save_sysprompt(self, text: bytes, payload: PayloadState, *, shape: PayloadShape, quant_bits: int,
                       model_id: int = 0, now: int | None = None) -> Path:
        now = self._now() if now is None else int(now)
        path = self.sysprompt_path(text)
        header = KVCHeader(quant_bits=quant_bits, reason=REASON_SYSTEM, ext_flags=0, model_id=model_id,
                           tokens=len(payload.tokens), hits=0, ctx_size=int(payload.ctx), created_at=now,
                           last_used=now, payload_bytes=0)
        write_kvc(path, header, text, payload, shape)
        self._prune_sysprompts(keep=path)
        return path

    def load_sysprompt(self, text: bytes, *, shape: PayloadShape, ctx: int, model_id: int,
                       quant_bits: int) -> PayloadState:
        path = self.sysprompt_path(text)
        loaded = load_kvc(path, KIND_SYSPROMPT, shape=shape, ctx=ctx, model_id=model_id,
                          quant_bits=quant_bits, expected_text=bytes(text))
        try:
            touch(path, self._now())
        except KVCError:
            pass  # a cache that cannot be touched still loaded fine
        assert loaded.payload is not None
        return loaded.payload

    def _prune_sysprompts(self, keep: Path) -> list[Path]:
        """Keep the SYSPROMPT_KEEP most recently used `sysprompt-<hex>.kv` (never ds4-agent's
        `sysprompt.kv`). Recency = header last_used (touched on every load), mtime if unreadable."""
        ranked = []
        for name in self._names():
            if classify_name(name)[0] != "sysprompt-hex":
                continue
            path = self.directory / name
            if not path.is_file():
                continue
            try:
                used = read_header(path).last_used
            except (OSError, KVCError):
                try:
                    used = int(path.stat().st_mtime)
                except OSError:
                    continue
            ranked.append((path.name == keep.name, used, name, path))
        ranked.sort(reverse=True)
        removed = [p for *_, p in ranked[SYSPROMPT_KEEP:] if self._unlink(p)]
        return removed

    # --- housekeeping -------------------------------------------------------------------------

    def clean_stale_temps(self, max_age: float = STALE_TEMP_SECONDS) -> list[Path]:
        """Delete our temp-file pattern older than max_age (§6.2). Younger ones may belong to a
        save in progress in another process, so they are left alone."""
        removed = []
        now = self._clock()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return removed
        for name in names:
            if not _STALE_TEMP.fullmatch(name):
                continue
            path = self.directory / name
            try:
                if now - path.stat().st_mtime > max_age and path.is_file():
                    path.unlink()
                    removed.append(path)
            except OSError:
                continue
        return removed
