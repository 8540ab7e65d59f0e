"""Session commands on the worker: system-prompt cache, /save, /load, /new, /list, the save
question, and the crash journal (kvc-format.md §12, agent-reference.md §9).

The agent is the only room that knows both the engine and the store: it hands the engine's
exported state (a PayloadState-shaped object) to the store and back.
"""

from __future__ import annotations

import time
from typing import Any

from ds4agent.agent import events as ev


class SessionOpError(Exception):
    """A session command failed; the message is the user-visible reason."""


def _shape(worker: Any) -> Any:
    return worker.engine.payload_shape()


def _kv_args(worker: Any) -> dict:
    eng = worker.engine
    return {"model_id": int(getattr(eng, "model_id", 0)), "quant_bits": int(eng.quant_bits)}


def display_title(title: Any) -> str:
    """A title for display (non-UTF-8 bytes shown as U+FFFD, kvc-format.md §12.7)."""
    if title is None:
        return ""
    if isinstance(title, bytes):
        from ds4agent.sessions.store import display_text

        return display_text(title)
    return str(title)


def title_bytes(title: Any) -> bytes | None:
    """The title exactly as stored in the trailer. The session identity is SHA-1 over these bytes
    (kvc-format.md §12.3), so a title is never round-tripped through str: a non-UTF-8 title from a
    ds4 file would come back with U+FFFD and re-save under a different name."""
    if title is None or isinstance(title, bytes):
        return title
    return str(title).encode("utf-8", "surrogateescape")


# ====================================================================== system prefix


def render_system(worker: Any) -> list[int]:
    from ds4agent.agent.prompt import build_system_text
    from ds4agent.protocol import template

    s = worker.settings
    worker.system = build_system_text(s.cwd, s.system)
    for note in worker.system.notes:
        worker.io.emit(ev.Notice(note, "warning"))
    eff = s.effective_think_mode()
    worker._system_is_max = eff == "think-max"
    return template.render_system_prefix(
        worker.system.builtin, extra_system_text=worker.system.extra, tools=worker.tools,
        think_mode=eff, ctx=s.ctx, tokenizer=worker.tok,
    )


def start_system_prefix(worker: Any) -> bool:
    """Make the live KV hold the system prefix: from `sysprompt-<hex>.kv` when its exact text
    matches (no prefill), else prefill and (re)write the cache. True on a cache hit."""
    ids = render_system(worker)
    worker.system_ids = ids
    worker.transcript.reset(ids, len(ids))
    text = worker.tok.decode_bytes(ids)
    store = worker.store
    if worker.trace is not None:
        worker.trace.line(f"system prefix {len(ids)} tokens")
        worker.trace.tokens(0, ids, worker.tok.token_bytes, "sys")
    if store is not None and worker.settings.use_sysprompt_cache:
        try:
            payload = store.load_sysprompt(text, shape=_shape(worker), ctx=worker.settings.ctx,
                                           **_kv_args(worker))
            worker.session.import_state(payload)
            if tuple(worker.session.tokens) == tuple(ids):
                if worker.trace is not None:
                    worker.trace.line("sysprompt cache hit")
                return True
        except Exception as err:  # any failure: rebuild (kvc-format.md §12.2)
            if worker.trace is not None:
                worker.trace.line(f"sysprompt cache miss: {err}")
        worker.io.emit(ev.Notice("Updating system prompt cache..."))
    worker._set_state(ev.State.PREFILL, detail="system prompt")
    worker._sync(interruptible=False)
    if store is not None and worker.settings.use_sysprompt_cache:
        try:
            store.save_sysprompt(text, worker.session.export_state(), shape=_shape(worker),
                                 **_kv_args(worker))
            if worker.trace is not None:
                worker.trace.line("sysprompt cache stored")
        except Exception as err:
            worker.io.emit(ev.Notice(f"failed to save system prompt KV: {err}", "warning"))
    return False


# ====================================================================== save


def save(worker: Any, title: str | None = None) -> ev.SessionSaved | None:
    """/save [TITLE] (kvc-format.md §12.4). Errors become Error("save failed: ...").

    A title (whitespace-normalised; blank means none) becomes the session's title: it is stored
    in the title trailer, so it is what /list, the picker and `kv ls` show from then on."""
    try:
        return _save(worker, title)
    except Exception as err:  # SessionOpError, KVCError, engine errors: readable messages
        worker.io.emit(ev.Error(f"save failed: {err}"))
    finally:
        worker._set_state(ev.State.IDLE)
    return None


def _retitle(worker: Any, title: str | None) -> tuple[bytes | None, str | None]:
    """The title this save writes and the file it replaces. A /save TITLE that changes the title
    changes the file name (the identity is SHA-1 of title and created_at), so the file saved under
    the old title is replaced the way a legacy source is. The worker keeps its title until the
    save succeeded."""
    from ds4agent.sessions.store import normalise_title

    new = normalise_title(title_bytes(title)) if title is not None else b""
    if not new or new == worker.title:
        return worker.title, worker.legacy_path
    old_path = worker.legacy_path
    if old_path is None and worker.session_id:
        try:
            old_path = str(worker.store.resolve(worker.session_id).path)
        except Exception:  # the old file is gone already: nothing to replace
            old_path = None
    return new, old_path


def _save(worker: Any, title: str | None = None) -> ev.SessionSaved:
    if worker.store is None:
        raise SessionOpError("no session directory")
    if not worker.activity:
        raise SessionOpError("nothing to save")
    worker._set_state(ev.State.SAVING)
    # Step 2: the live KV must hold the whole transcript (this evaluates the trailing EOS).
    if not worker._sync(interruptible=False) or tuple(worker.session.tokens) != tuple(worker.transcript.ids):
        raise SessionOpError("live KV state does not match session transcript")
    worker._set_state(ev.State.SAVING)
    new_title, replaces = _retitle(worker, title)
    text = worker.tok.decode_bytes(worker.transcript.ids)
    payload = worker.session.export_state()
    saved = worker.store.save_session(
        text, payload, shape=_shape(worker), title=new_title, created_at=worker.created_at,
        loaded_from=replaces, protect=(worker.forked_from,) if worker.forked_from else (),
        **_kv_args(worker),
    )
    worker.title = title_bytes(saved.title)
    worker.created_at = saved.created_at
    worker.session_id = saved.id
    worker.legacy_path = None
    worker.dirty = False
    _index_record(worker)
    journal_write(worker)
    event = ev.SessionSaved(saved.id, saved.id[:8], saved.n_tokens, str(saved.path),
                             display_title(worker.title))
    worker.io.emit(event)
    worker.io.emit(ev.Notice(saved.message))
    return event


def _index(worker: Any) -> Any:
    from ds4agent.sessions.index import SessionIndex

    return SessionIndex(worker.store.directory)


def _index_record(worker: Any) -> None:
    """Note the save in the session index (working directory for --continue, fork parent, code
    checkpoints). Best effort: the session file is what matters, and it is written."""
    try:
        _index(worker).record(worker.session_id, cwd=worker.settings.cwd, forked_from=worker.forked_from,
                              checkpoints=worker.checkpoints.key if worker.checkpoints is not None else "")
    except OSError as err:
        worker.io.emit(ev.Notice(f"session index not updated: {err.strerror or err}", "warning"))


def fork(worker: Any, title: str | None) -> ev.SessionSaved | None:
    """/fork [TITLE]: save the conversation as a new session (own id and title; default: the
    current title + " (fork)"), leaving the original file untouched; later saves go to the fork."""
    if worker.store is None:
        worker.io.emit(ev.Error("fork failed: no session directory"))
        return None
    if not worker.transcript.has_user_turn():
        worker.io.emit(ev.Error("fork failed: nothing to fork yet"))
        return None
    from ds4agent.sessions.store import normalise_title

    parent = worker.session_id
    # Normalised as /save TITLE is: whitespace trimmed, each run of it one space.
    new_title = normalise_title(title_bytes(title)) if title else b""
    if not new_title:
        base = worker.title
        if base is None:
            from ds4agent.sessions.store import derive_title

            base = derive_title(worker.tok.decode_bytes(worker.transcript.ids))
        new_title = base + b" (fork)"
    # A new identity: SHA-1 over title and creation time (kvc-format.md §12.3). A later creation
    # second than the parent's keeps the ids apart even when the title is the same.
    created = int(time.time())
    if worker.created_at is not None and created <= int(worker.created_at):
        created = int(worker.created_at) + 1
    worker.title, worker.created_at, worker.session_id = new_title, created, ""
    worker.legacy_path = None  # never delete the original as a "legacy source"
    worker.forked_from = parent
    worker.activity = True
    if worker.checkpoints is not None:
        try:
            worker.checkpoints = worker.checkpoints.fork()
        except OSError as err:
            worker.io.emit(ev.Notice(f"code checkpoints not copied to the fork: {err.strerror or err}",
                                     "warning"))
    return save(worker)


# ====================================================================== leave (save question)


def confirm_leave(worker: Any) -> bool:
    """Before /new, /load, quit: with unsaved turns ask "Save current session?" (y / n / c).
    True when the caller may go on."""
    if not (worker.dirty and worker.activity and worker.transcript.has_user_turn()):
        return True
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id("save"), kind="save", question="Save current session?",
        options=(("y", "save"), ("n", "don't save"), ("c", "cancel")),
    ))
    if key == "c":
        return False
    if key != "y":
        return True
    if save(worker) is not None:
        return True
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id("save"), kind="continue", question="Continue anyway?",
        options=(("y", "continue without saving"), ("n", "stay")),
    ))
    return key == "y"


# ====================================================================== new


def _reset_identity(worker: Any) -> None:
    """Forget everything that belonged to the previous conversation (/new, /load, a failed
    resume): its identity, the pending job update, the lines the model had seen, and "allow for
    this session" answers (another session's work is asked about afresh)."""
    saved_id = worker.session_id
    worker.forget_pending_results()
    worker.title = None
    worker.created_at = None
    worker.session_id = ""
    worker.legacy_path = None
    worker.dirty = False
    worker.activity = False
    worker.turn_times = {}
    worker.forked_from = ""
    if worker.checkpoints is not None and not saved_id:
        # Checkpoints of a conversation that was never saved belong to nothing any more.
        from ds4agent.sessions import checkpoints

        checkpoints.remove(worker.checkpoints.root, worker.checkpoints.key)
    worker.checkpoints = None
    if worker.tool_ctx is not None:
        worker.tool_ctx.reset_session()
    if worker.policy is not None and hasattr(worker.policy, "reset"):
        worker.policy.reset()


def new_session(worker: Any) -> None:
    """/new: back to the system prefix (re-rendered: AGENTS.md may have changed; its cache is
    used when the text is the same)."""
    _reset_identity(worker)
    ids = render_system(worker)
    if ids == worker.system_ids and tuple(worker.session.tokens[: len(ids)]) == tuple(ids):
        worker.transcript.reset(ids, len(ids))
        # The system prefix is the store's first snapshot (kept at start): restoring it costs no
        # prefill. Without it the engine could only rewind to a live snapshot handle, and after a
        # start from the system-prompt cache there is none: /new re-prefilled the whole prefix
        # (2,160 tokens: seconds on a GPU, an hour at the Flash shape on a CPU).
        if worker.snapshots is not None:
            worker.snapshots.restore(worker.session, ids)
        worker._sync(interruptible=False)  # rewinds to the prefix (snapshot) or re-prefills
    else:
        start_system_prefix(worker)
    worker.system_ids = list(ids)
    worker.think_mode = worker.settings.effective_think_mode()
    journal_write(worker)
    worker.io.emit(ev.SessionNew())
    worker._set_state(ev.State.IDLE)


# ====================================================================== load


def load(worker: Any, prefix: str) -> None:
    try:
        _load(worker, prefix)
    except Exception as err:  # KVCError / EngineError: readable
        worker.io.emit(ev.Error(f"load failed: {err}"))
    worker._set_state(ev.State.IDLE)


def _load(worker: Any, prefix: str) -> None:
    if worker.store is None:
        raise SessionOpError("no session directory")
    worker._set_state(ev.State.LOADING, detail="loading session")
    loaded = worker.store.load_session(prefix, shape=_shape(worker), ctx=worker.settings.ctx,
                                       **_kv_args(worker))
    prefilled = 0
    if loaded.payload is not None:
        worker.session.import_state(loaded.payload)  # validates; never half-applies
        ids = [int(t) for t in loaded.payload.tokens]
    else:
        # A stripped session: re-tokenised from its text (the trust marks are lost, §2).
        ids = worker.tok.rebuild_from_text(loaded.text)
        worker.io.emit(ev.Notice("this session was saved without its KV state; its text was "
                                 "re-tokenised and is prefilled now", "warning"))
    system_len = _system_len(worker, ids)
    worker.transcript.reset(ids, system_len)
    if loaded.payload is None:
        worker._sync(interruptible=False)
        prefilled = worker.last_prefilled
    _reset_identity(worker)
    worker.title = title_bytes(loaded.title)
    worker.created_at = loaded.created_at
    worker.session_id = loaded.id
    worker.legacy_path = str(loaded.path) if loaded.legacy else None
    worker.activity = True
    _attach_index_entry(worker)
    if ids[:system_len] != worker.system_ids:
        worker.io.emit(ev.Notice("this session was saved with a different system prompt; it "
                                 "continues with its own", "info"))
    _announce_loaded(worker, ids, system_len, prefilled=prefilled)
    worker.io.emit(ev.Notice(f"switched to session {loaded.id[:8]} ({len(ids)} tokens)"))


def forget_deleted(worker: Any, sid: str) -> None:
    """A session file was deleted (picker): its index entry and code checkpoints go with it."""
    from ds4agent.sessions.index import remove_session_extras

    remove_session_extras(worker.store.directory, sid, worker.settings.checkpoint_dir)


def _attach_index_entry(worker: Any) -> None:
    """A loaded session's fork parent and code checkpoints, from the session index."""
    try:
        entry = _index(worker).get(worker.session_id)
    except OSError:
        entry = None
    if entry is None:
        return
    worker.forked_from = entry.forked_from
    _use_checkpoints(worker, entry.checkpoints)


def _use_checkpoints(worker: Any, key: str) -> None:
    from ds4agent.sessions.checkpoints import CodeCheckpoints

    if key and all(c in "0123456789abcdef" for c in key):
        worker.checkpoints = CodeCheckpoints(worker.settings.checkpoint_dir, key)


def _announce_loaded(worker: Any, ids: list[int], system_len: int, *, prefilled: int,
                     resumed: bool = False) -> None:
    """After /load or a resume: journal the restored transcript and show its last turns."""
    from ds4agent.agent.history import last_turns

    journal_write(worker)
    history = last_turns(worker.tok, ids, system_len, 3)
    worker.io.emit(ev.SessionLoaded(worker.session_id, worker.session_id[:8], len(ids),
                                    display_title(worker.title), tuple(history), resumed=resumed,
                                    prefilled=prefilled))


def _system_len(worker: Any, ids: list[int]) -> int:
    """Length of the system prefix of a loaded transcript: everything before the first <｜User｜>."""
    from ds4agent.protocol.tokenizer import USER

    try:
        return ids.index(USER)
    except ValueError:
        return len(ids)


# ====================================================================== --continue / --resume


def requested_session(store: Any, settings: Any) -> str | None:
    """The session --continue / --resume PREFIX asks for (an id or prefix), None when neither
    was given (or --resume without a prefix: the front end's picker). SessionOpError when
    --continue finds no saved session of this directory."""
    if settings.continue_session:
        if store is None:
            raise SessionOpError("no session directory")
        from ds4agent.sessions.index import SessionIndex

        sid = SessionIndex(store.directory).latest_for(settings.cwd)
        if sid is None:
            raise SessionOpError(f"no saved session of {settings.cwd} to continue")
        return sid
    return settings.resume or None


def open_requested(worker: Any) -> None:
    """At start, after the crash-journal offer: load the session --continue / --resume named."""
    s = worker.settings
    if not (s.continue_session or s.resume):
        return
    if worker.activity:  # the user resumed an unsaved crashed session instead
        worker.io.emit(ev.Notice("the resumed unsaved session was opened instead", "warning"))
        return
    try:
        target = requested_session(worker.store, s)
    except SessionOpError as err:
        worker.io.emit(ev.Error(f"cannot continue: {err}"))
        return
    if target:
        load(worker, target)


# ====================================================================== list


def list_event(worker: Any) -> ev.SessionList:
    store = worker.store
    if store is None:
        return ev.SessionList("", ())
    infos = []
    try:
        index = _index(worker).read()
    except OSError:
        index = {}
    try:
        sessions, unreadable = store.scan_sessions()
        for info in sessions:
            e = info.entry
            parent = index[e.id].forked_from if e.id in index else ""
            infos.append(ev.SessionInfo(
                id=e.id, short_id=e.short_id, title=display_title(info.title), tokens=e.header.tokens,
                size_bytes=e.file_size, last_used=e.header.last_used, created_at=e.header.created_at,
                path=str(e.path), forked_from=parent[:8],
            ))
        # Listed, not hidden (issue 10.11): the user sees the file and why, and can delete it.
        for broken in unreadable:
            infos.append(ev.SessionInfo(
                id=broken.id, short_id=broken.short_id, title=broken.display_title, tokens=0,
                size_bytes=broken.file_size, last_used=broken.last_used, created_at=0,
                path=str(broken.path), unreadable=broken.reason,
            ))
    except Exception as err:
        worker.io.emit(ev.Error(f"no sessions: {err}"))
    return ev.SessionList(str(getattr(store, "directory", "")), tuple(infos))


# ====================================================================== crash journal


def _journal(worker: Any) -> Any:
    if worker.journal is None and worker.settings.journal:
        from ds4agent.agent.journal import Journal

        try:
            worker.journal = Journal(worker.settings.journal_dir)
        except OSError as err:
            worker.settings.journal = False
            worker.io.emit(ev.Notice(f"crash journal disabled: {err.strerror or err}", "warning"))
    return worker.journal


def journal_meta(worker: Any) -> dict:
    return {
        "cwd": str(worker.settings.cwd),
        "system_len": worker.transcript.system_len,
        # JSON holds text only: the title's exact bytes travel as hex.
        "title_hex": worker.title.hex() if worker.title is not None else None,
        "created_at": worker.created_at,
        "session_id": worker.session_id,
        "legacy_path": worker.legacy_path,
        "dirty": bool(worker.dirty),
        "ctx": worker.settings.ctx,
        "time": int(time.time()),
        "forked_from": worker.forked_from,
        "checkpoints": worker.checkpoints.key if worker.checkpoints is not None else "",
    }


def journal_write(worker: Any) -> None:
    j = _journal(worker)
    if j is None:
        return
    try:
        j.write(worker.transcript.ids, journal_meta(worker))
    except OSError as err:
        worker.io.emit(ev.Notice(f"crash journal write failed: {err.strerror or err}", "warning"))


def close_journal(worker: Any, *, keep: bool = False) -> None:
    if worker.journal is not None:
        worker.journal.close(keep=keep)
        worker.journal = None


def offer_resume(worker: Any) -> None:
    """At start: a journal of a crashed run in this directory with unsaved turns -> ask to resume."""
    if not worker.settings.journal:
        return
    j = _journal(worker)
    if j is None:
        return
    orphans = j.orphans(str(worker.settings.cwd))
    chosen = None
    for o in orphans:
        if chosen is None and o.meta.get("dirty") and len(o.tokens) > int(o.meta.get("system_len", 0)):
            chosen = o
        else:
            o.discard()  # older orphans, and ones whose session had been saved
    if chosen is None:
        return
    age = max(0, int(time.time() - chosen.mtime))
    from ds4agent.sessions.store import format_age

    title = display_title(_meta_title(chosen.meta)) or _derive_title(worker, chosen.tokens)
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id("resume"), kind="resume",
        question=f"Resume the unsaved session from {format_age(age)} ({len(chosen.tokens)} tokens, "
                 f"\"{title}\")?",
        options=(("y", "resume"), ("n", "discard")),
    ))
    if key != "y":
        chosen.discard()
        return
    try:
        resume(worker, chosen.tokens, chosen.meta)
    except Exception as err:
        # Back to a clean new session (the live KV re-syncs to it at the next turn), and the
        # journal stays where it is: the next start offers it again, nothing is lost.
        worker.transcript.reset(worker.system_ids, len(worker.system_ids))
        _reset_identity(worker)
        worker.io.emit(ev.Error(f"resume failed: {err}"))
        return
    chosen.discard()


def _meta_title(meta: dict) -> bytes | None:
    hexed = meta.get("title_hex")
    if isinstance(hexed, str):
        try:
            return bytes.fromhex(hexed)
        except ValueError:
            return None
    return title_bytes(meta.get("title") or None)


def _derive_title(worker: Any, tokens: list[int]) -> str:
    from ds4agent.sessions.store import derive_title

    return derive_title(worker.tok.decode_bytes(tokens)).decode("utf-8", "replace")[:70]


def resume(worker: Any, tokens: list[int], meta: dict) -> None:
    """Restore a journalled transcript: load the nearest saved KV whose text is a prefix of it
    (no prefill for that part), then prefill only the rest."""
    from ds4agent.protocol.tokenizer import EOS

    tokens = list(tokens)
    system_len = int(meta.get("system_len", 0)) or _system_len(worker, tokens)
    if len(tokens) > system_len and tokens[-1] != EOS:
        # The run died mid-round: close the assistant output as an interrupt would (§7).
        tokens.append(EOS)
    if len(tokens) >= worker.settings.ctx:
        raise SessionOpError(f"the journalled session ({len(tokens)} tokens) does not fit the context")
    worker._set_state(ev.State.LOADING, detail="resuming session")
    base = _nearest_saved_prefix(worker, tokens)
    if base is not None:
        worker.session.import_state(base.payload)
    worker.transcript.reset(tokens, system_len)
    worker._sync(interruptible=False)
    prefilled = worker.last_prefilled
    worker.title = _meta_title(meta)
    worker.created_at = meta.get("created_at") or None
    worker.session_id = meta.get("session_id") or ""
    worker.legacy_path = meta.get("legacy_path") or None
    worker.forked_from = str(meta.get("forked_from") or "")
    _use_checkpoints(worker, str(meta.get("checkpoints") or ""))
    worker.dirty = True
    worker.activity = True
    _announce_loaded(worker, tokens, system_len, prefilled=prefilled, resumed=True)
    worker.io.emit(ev.Notice(f"resumed the unsaved session ({len(tokens)} tokens, {prefilled} prefilled)"))


def _nearest_saved_prefix(worker: Any, tokens: list[int]) -> Any:
    """The saved session with the longest text that is a byte prefix of the journal's text."""
    store = worker.store
    if store is None:
        return None
    from ds4agent.sessions.kvc import read_envelope

    text = worker.tok.decode_bytes(tokens)
    best = None
    try:
        infos = store.list_sessions()
    except Exception:
        return None
    for info in sorted(infos, key=lambda i: -i.entry.text_bytes):
        e = info.entry
        if e.text_bytes > len(text) or e.header.tokens > len(tokens):
            continue
        try:
            env = read_envelope(e.path)
        except Exception:
            continue
        if text.startswith(env.text):
            try:
                best = store.load_session(e.path, shape=_shape(worker), ctx=worker.settings.ctx,
                                          **_kv_args(worker))
            except Exception:
                continue
            if best.payload is not None:
                return best
    return None

