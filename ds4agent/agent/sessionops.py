"""Session commands on the worker: system-prompt cache, /save, /load, /new, /list, the save
question, and the crash journal (kvc-format.md §12, agent-reference.md §9).

The agent is the only room that knows both the engine and the store: it hands the engine's
exported state (a PayloadState-shaped object) to the store and back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ds4agent.agent import events as ev
from ds4agent.agent import subagent
from ds4agent.agent.events import format_age
from ds4agent.agent.history import last_turns, session_title
from ds4agent.agent.identity import SessionIdentity, meta_title, title_bytes, undo_log_for
from ds4agent.agent.journal import Journal
from ds4agent.agent.journal import default_dir as journal_default_dir
from ds4agent.agent.port import WorkerPort
from ds4agent.agent.prompt import build_system_text
from ds4agent.agent.settings import AgentSettings
from ds4agent.agent.skills import load_skills
from ds4agent.models.fingerprint import model_name, same_model
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import EOS, RECOGNISED_IDS, USER
from ds4agent.sessions import undo
from ds4agent.sessions.entries import FileStamp, LoadedSession, SavedSession, UnreadableSession
from ds4agent.sessions.errors import SessionChangedError
from ds4agent.sessions.index import IndexEntry, SessionIndex, remove_session_extras
from ds4agent.sessions.kvc import classify_name, read_envelope
from ds4agent.sessions.payload import PayloadShape, read_tokens
from ds4agent.sessions.store import SessionStore
from ds4agent.sessions.titles import display_text, normalise_title


class SessionOpError(Exception):
    """A session command failed; the message is the user-visible reason."""


def _shape(worker: WorkerPort) -> PayloadShape:
    """The engine's layout as the store's PayloadShape (the engine does not import sessions)."""
    s = worker.engine.payload_shape()
    return PayloadShape(n_layers=s.n_layers, head_dim=s.head_dim, indexer_dim=s.indexer_dim, vocab=s.vocab,
                        window=s.window, ratios=tuple(s.ratios))


def _model_id(worker: WorkerPort) -> int:
    # An engine without a model id (a test engine) is taken for the model of the files it reads.
    return int(getattr(worker.engine, "model_id", 0))


class _ModelFacts(TypedDict):
    """What a KVC file records of the model that wrote it and what a load compares with the running
    one (kvc-format.md §2, chain 8.3 steps 7-8): the store's arguments of that name, the same at
    every save and load."""

    shape: PayloadShape
    model_id: int
    quant_bits: int


def _model_facts(worker: WorkerPort) -> _ModelFacts:
    return {"shape": _shape(worker), "model_id": _model_id(worker), "quant_bits": worker.engine.quant_bits}


def _store(worker: WorkerPort) -> SessionStore:
    if worker.store is None:
        raise SessionOpError("no session directory")
    return worker.store


def display_title(title: str | bytes | None) -> str:
    """A title for display (non-UTF-8 bytes shown as U+FFFD, kvc-format.md §12.7)."""
    if title is None:
        return ""
    return display_text(title if isinstance(title, bytes) else str(title).encode("utf-8", "surrogateescape"))


# ====================================================================== system prefix


def render_system(worker: WorkerPort) -> list[int]:
    s = worker.settings
    # The skills' descriptions are part of the system text (and `skill` of the tools): read here,
    # at start and at /new, so the prefix and the tools block always agree.
    skills = load_skills(s.cwd, s.user_config_dir())
    system = build_system_text(s.cwd, s.system, skills.system_block(), edit_upto=s.edit_upto)
    for note in (*skills.notes, *system.notes):
        worker.io.emit(ev.Notice(note, "warning"))
    eff = s.effective_think_mode()
    worker.conv.system_rendered(system, skills, is_max=eff == "think-max")
    return template.render(template.system_prefix_pieces(
        worker.conv.system.builtin, extra_system_text=worker.conv.system.extra, tools=worker.tools,
        think_mode=eff, ctx=s.ctx), worker.tok)


def start_system_prefix(worker: WorkerPort) -> bool:
    """Make the live KV hold the system prefix: from `sysprompt-<hex>.kv` when its exact text
    matches (no prefill), else prefill and (re)write the cache. True on a cache hit."""
    ids = render_system(worker)
    worker.conv.system_kept(ids)
    worker.conv.transcript.reset(ids, len(ids))
    text = worker.tok.decode_bytes(ids)
    store = worker.store
    worker.trace.line(f"system prefix {len(ids)} tokens")
    worker.trace.tokens(0, ids, worker.tok.token_bytes, "sys")
    if store is not None and worker.settings.use_sysprompt_cache:
        try:
            payload = store.load_sysprompt(text, ctx=worker.settings.ctx, **_model_facts(worker))
            worker.session.import_state(payload)
            if tuple(worker.session.tokens) == tuple(ids):
                worker.trace.line("sysprompt cache hit")
                return True
        except Exception as err:  # any failure: rebuild (kvc-format.md §12.2)
            worker.trace.line(f"sysprompt cache miss: {err}")
        worker.io.emit(ev.Notice(ev.SYSPROMPT_UPDATING))
    worker.set_state(ev.State.PREFILL, detail="system prompt")
    worker.sync(interruptible=False)
    if store is not None and worker.settings.use_sysprompt_cache:
        try:
            store.save_sysprompt(text, worker.session.export_state(), **_model_facts(worker))
            worker.trace.line("sysprompt cache stored")
        except Exception as err:
            worker.io.emit(ev.Notice(f"failed to save system prompt KV: {err}", "warning"))
    return False


# ====================================================================== save


def save(worker: WorkerPort, title: str | None = None) -> ev.SessionSaved | None:
    """/save [TITLE] (kvc-format.md §12.4). Errors become Error("save failed: ...").

    A title (whitespace-normalised; blank means none) becomes the session's title: it is stored
    in the title trailer, so it is what /list, the picker and `kv ls` show from then on."""
    try:
        return _save(worker, title)
    except Exception as err:  # SessionOpError, KVCError, engine errors: readable messages
        worker.io.emit(ev.Error(f"save failed: {err}"))
    finally:
        worker.set_state(ev.State.IDLE)
    return None


def _retitle(worker: WorkerPort, title: str | None) -> tuple[bytes | None, str | None]:
    """The title this save writes and the file it replaces. A /save TITLE that changes the title
    changes the file name (the identity is SHA-1 of title and created_at), so the file saved under
    the old title is replaced the way a legacy source is. The worker keeps its title until the
    save succeeded."""
    identity = worker.conv.identity
    new = normalise_title(title_bytes(title)) if title is not None else b""
    if not new or new == identity.title:
        return identity.title, identity.legacy_path
    old_path = identity.legacy_path
    if old_path is None and identity.session_id:
        try:
            old_path = str(_store(worker).resolve(identity.session_id).path)
        except Exception:  # the old file is gone already: nothing to replace
            old_path = None
    return new, old_path


def _save(worker: WorkerPort, title: str | None = None) -> ev.SessionSaved:
    store = _store(worker)
    identity = worker.conv.identity
    if not identity.activity:
        raise SessionOpError("nothing to save")
    worker.set_state(ev.State.SAVING)
    # Step 2: the live KV must hold the whole transcript (this evaluates the trailing EOS).
    if not worker.sync(interruptible=False) or tuple(worker.session.tokens) != tuple(worker.conv.transcript.ids):
        raise SessionOpError("live KV state does not match session transcript")
    worker.set_state(ev.State.SAVING)
    new_title, replaces = _retitle(worker, title)
    text = worker.tok.decode_bytes(worker.conv.transcript.ids)
    payload = worker.session.export_state()

    title_now = new_title or session_title(text)

    def write(title: bytes, created_at: int | None, loaded_from: str | None,
              expect: FileStamp | None) -> SavedSession:
        return store.save_session(text, payload, title=title, created_at=created_at, loaded_from=loaded_from,
                                  expect=expect, **_model_facts(worker))

    try:
        saved = write(title_now, identity.created_at, replaces, identity.file_stamp)
    except SessionChangedError as err:
        # Another instance saved this session since we loaded it: its turns stay in its file, ours
        # go to a fork (a new identity), and nothing of either is lost.
        parent = identity.session_id
        saved = write(title_now + b" (fork)", _fork_created_at(identity), None, None)
        worker.conv.saved(saved, forked_from=parent)
        worker.io.emit(ev.Notice(f"{err}; this conversation was saved as a fork, {saved.id[:8]}, beside it",
                                 "warning"))
    else:
        worker.conv.saved(saved)
    subagent.save_records(worker, saved.id)
    _index_record(worker)
    journal_write(worker)
    event = ev.SessionSaved(saved.id, saved.id[:8], saved.n_tokens, str(saved.path),
                             display_title(identity.title))
    worker.io.emit(event)
    worker.io.emit(ev.Notice(saved.message))
    return event


def _fork_created_at(parent: SessionIdentity) -> int:
    """A fork's creation time. Its identity is SHA-1 over title and creation time (kvc-format.md
    §12.3): a later creation second than the parent's keeps the ids apart even when the title is
    the same."""
    created = int(time.time())
    if parent.created_at is not None and created <= int(parent.created_at):
        created = int(parent.created_at) + 1
    return created


def _index(worker: WorkerPort) -> SessionIndex:
    return SessionIndex(_store(worker).directory)


def _index_record(worker: WorkerPort) -> None:
    """Note the save in the session index (working directory for --continue, fork parent, code
    undo log). Best effort: the session file is what matters, and it is written."""
    identity = worker.conv.identity
    try:
        _index(worker).record(identity.session_id, cwd=worker.settings.cwd, forked_from=identity.forked_from,
                              undo=identity.undo.key if identity.undo is not None else "",
                              model=worker.settings.model_path, fingerprint=worker.settings.model_fingerprint)
    except OSError as err:
        worker.io.emit(ev.Notice(f"session index not updated: {err.strerror or err}", "warning"))


def fork(worker: WorkerPort, title: str | None) -> ev.SessionSaved | None:
    """/fork [TITLE]: save the conversation as a new session (own id and title; default: the
    current title + " (fork)"), leaving the original file untouched; later saves go to the fork."""
    if worker.store is None:
        worker.io.emit(ev.Error("fork failed: no session directory"))
        return None
    if not worker.conv.transcript.has_user_turn():
        worker.io.emit(ev.Error("fork failed: nothing to fork yet"))
        return None
    old = worker.conv.identity
    # Normalised as /save TITLE is: whitespace trimmed, each run of it one space.
    new_title = normalise_title(title_bytes(title)) if title else b""
    if not new_title:
        base = old.title
        if base is None:
            base = session_title(worker.tok.decode_bytes(worker.conv.transcript.ids))
        new_title = base + b" (fork)"
    created = _fork_created_at(old)
    undo = old.undo
    if undo is not None:
        try:
            undo = undo.fork()
        except OSError as err:  # the fork shares the original's log then
            worker.io.emit(ev.Notice(f"undo log not copied to the fork: {err.strerror or err}",
                                     "warning"))
    # No legacy path: the original must never be deleted as a "legacy source".
    worker.conv.become_fork(SessionIdentity(title=new_title, created_at=created, forked_from=old.session_id,
                                            dirty=old.dirty, activity=True, undo=undo,
                                            subagents=list(old.subagents)))
    saved = save(worker)
    if saved is not None:
        parent = old.session_id[:8] if old.session_id else "the unsaved conversation"
        worker.io.emit(ev.Notice(f"forked {saved.short_id} from {parent}"))
    return saved


# ====================================================================== leave (save question)


def confirm_leave(worker: WorkerPort) -> bool:
    """Before /new, /load, quit: with unsaved turns ask "Save current session?" (y / n / c).
    True when the caller may go on."""
    if not (worker.conv.identity.unsaved_work and worker.conv.transcript.has_user_turn()):
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


def _reset_identity(worker: WorkerPort) -> None:
    """Forget everything that belonged to the previous conversation (/new, /load, a failed
    resume): its identity, the pending job update, the lines the model had seen, and "allow for
    this session" answers (another session's work is asked about afresh)."""
    old = worker.conv.reset_new()
    if old.undo is not None and not old.session_id:
        # The undo log of a conversation that was never saved belong to nothing any more.
        undo.remove(old.undo.root, old.undo.key)
    worker.tool_ctx.reset_session()
    worker.policy.reset()


def new_session(worker: WorkerPort) -> None:
    """/new: back to the system prefix (re-rendered: AGENTS.md may have changed; its cache is
    used when the text is the same)."""
    _reset_identity(worker)
    ids = render_system(worker)
    if ids == worker.conv.system_ids and tuple(worker.session.tokens[: len(ids)]) == tuple(ids):
        worker.conv.transcript.reset(ids, len(ids))
        # The system prefix is the store's first snapshot (kept at start): restoring it costs no
        # prefill. Without it the engine could only rewind to a live snapshot handle, and after a
        # start from the system-prompt cache there is none: /new re-prefilled the whole prefix
        # (2,160 tokens: seconds on a GPU, an hour at the Flash shape on a CPU).
        if worker.snapshots is not None:
            worker.snapshots.restore(worker.session, ids)
        worker.sync(interruptible=False)  # rewinds to the prefix (snapshot) or re-prefills
    else:
        start_system_prefix(worker)
    worker.conv.system_kept(ids)
    worker.conv.use_think_mode(worker.settings.effective_think_mode())
    journal_write(worker)
    worker.io.emit(ev.SessionNew())
    worker.set_state(ev.State.IDLE)


# ====================================================================== load


@dataclass(frozen=True)
class LoadTarget:
    """A /load target, resolved once before the save question: the session file (a prefix is
    looked up in the directory once) and its session-index entry (read once; None when it has
    none)."""

    path: Path
    index: IndexEntry | None


def check_load_target(worker: WorkerPort, prefix: str) -> LoadTarget | None:
    """The session `prefix` names, when it can be loaded; None after the readable reason as an
    Error. Asked before the save question, so `/load zzz` never asks to save first and then fails."""
    try:
        store = _store(worker)
        by_path = os.sep in prefix or prefix.endswith(".kv")
        path = Path(prefix) if by_path else store.resolve(prefix).path
    except Exception as err:  # KVCStoreError, SessionOpError: readable
        worker.io.emit(ev.Error(f"load failed: {err}"))
        worker.set_state(ev.State.IDLE)
        return None
    sid = classify_name(path.name)[1] or path.stem
    try:
        entry = _index(worker).get(sid)
    except OSError:
        entry = None
    if not by_path and not _same_model_or_agreed(worker, sid, entry):
        return None
    return LoadTarget(path, entry)


def _same_model_or_agreed(worker: WorkerPort, sid: str, entry: IndexEntry | None) -> bool:
    """A session made with other weights of the same shape would load (the KVC shape check
    passes) and then be re-saved as if it belonged here: that is the user's decision."""
    here = worker.settings.model_fingerprint
    if entry is None or same_model(entry.fingerprint, here):
        return True
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id("model"), kind="continue",
        question=(f"Session {sid[:8]} was made with another model ({model_name(entry.fingerprint)}, "
                  f"{entry.model or 'path unknown'}); load it into this one ({model_name(here)})?"),
        options=(("y", "load anyway"), ("n", "don't load")),
    ))
    if key == "y":
        return True
    worker.io.emit(ev.Error(f"load cancelled: session {sid[:8]} belongs to another model"))
    worker.set_state(ev.State.IDLE)
    return False


def load(worker: WorkerPort, target: LoadTarget) -> None:
    try:
        _load(worker, target)
    except Exception as err:  # KVCError / EngineError: readable
        worker.io.emit(ev.Error(f"load failed: {err}"))
    worker.set_state(ev.State.IDLE)


def _load(worker: WorkerPort, target: LoadTarget) -> None:
    store = _store(worker)
    worker.set_state(ev.State.LOADING, detail="loading session")
    loaded = store.load_session(target.path, ctx=worker.settings.ctx,
                                max_text_bytes=worker.settings.ctx * worker.tok.max_token_bytes,
                                **_model_facts(worker))
    prefilled = 0
    rebuilt = True
    if loaded.payload is not None:
        worker.session.import_state(loaded.payload)  # validates; never half-applies
        ids = [int(t) for t in loaded.payload.tokens]
    else:
        # A stripped session: re-tokenised from its text (the trust marks are lost, prompt-and-dsml.md §2).
        ids = worker.tok.rebuild_from_text(loaded.text)
        if len(ids) >= worker.settings.ctx:
            raise SessionOpError(f"the stripped session ({len(ids)} tokens) does not fit the context")
        worker.io.emit(ev.Notice(f"stripped session: rebuilding {len(ids):,} tokens", "warning"))
    system_len = _system_len(ids)
    worker.conv.transcript.reset(ids, system_len)
    if loaded.payload is None:
        worker.set_state(ev.State.PREFILL, detail="rebuilding stripped session")
        # Interruptible (the prefill progress is shown): an interrupted rebuild still switches to
        # the session, its live KV at a prefix of the text, and the next turn prefills the rest;
        # nothing is lost and the user need not wait again from token 0.
        rebuilt = worker.sync(interruptible=True)
        prefilled = worker.conv.last_prefilled if rebuilt else 0
    _reset_identity(worker)
    worker.conv.adopt_loaded(_loaded_identity(worker, loaded, target.index))
    subagent.load_records(worker, loaded.id)
    if not rebuilt:
        worker.io.emit(ev.Notice(f"rebuild interrupted at {len(worker.session.tokens):,} of {len(ids):,} "
                                 "tokens; the rest is prefilled with the next message", "warning"))
    if ids[:system_len] != worker.conv.system_ids:
        worker.io.emit(ev.Notice("this session was saved with a different system prompt; it "
                                 "continues with its own", "info"))
    _announce_loaded(worker, ids, system_len, prefilled=prefilled)
    worker.io.emit(ev.Notice(f"switched to session {loaded.id[:8]} ({len(ids)} tokens)"))


def delete(worker: WorkerPort, prefix: str) -> None:
    """/del PREFIX: one saved session, after a y/n question. The live session is refused while it
    has unsaved turns (deleting its file would leave them nowhere); deleted with none, its next
    save writes the file again."""
    try:
        store = _store(worker)
        if not prefix:
            raise SessionOpError("usage: /del <id-prefix>")
        entry = store.find_session(prefix)
        identity = worker.conv.identity
        live = bool(identity.session_id) and entry.id == identity.session_id
        if live and identity.unsaved_work:
            raise SessionOpError(f"session {entry.short_id} is the live session and has unsaved turns "
                                 "(/save them, or /new first)")
        # An unreadable file has its reason as its title; a readable one its stored title.
        title = entry.display_title if isinstance(entry, UnreadableSession) else store.describe(entry).display_title
    except Exception as err:  # SessionOpError, KVCError: readable
        worker.io.emit(ev.Error(f"delete failed: {err}"))
        return
    key, _ = worker.io.ask(ev.Question(
        id=worker.io.new_id("delete"), kind="delete", question=f'Delete session {entry.short_id} "{title}"?',
        options=(("y", "delete"), ("n", "keep")),
    ))
    if key != "y":
        worker.io.emit(ev.Notice(f"session {entry.short_id} kept"))
        return
    try:
        path = store.delete(entry.id)
        forget_deleted(worker, path.stem)
    except Exception as err:
        worker.io.emit(ev.Error(f"delete failed: {err}"))
        return
    worker.io.emit(ev.Notice(f"deleted session {entry.short_id}"))


def strip(worker: WorkerPort, prefix: str) -> None:
    """/strip PREFIX: rewrite a saved session as a stripped file (kvc-format.md §12.6): its
    rendered text and title kept, payload_bytes 0, tokens = the count of the re-tokenised text
    (what a load will prefill), created_at kept (so the identity and the file name stay),
    last_used now. The live KV is not touched: stripping the live session's file only changes
    what a later load costs, and its next save writes the full state again."""
    try:
        store = _store(worker)
        if not prefix:
            raise SessionOpError("usage: /strip <id-prefix>")
        entry = store.resolve(prefix)
        header = entry.header
        if header.payload_bytes == 0:
            worker.io.emit(ev.Notice(f"session {entry.short_id} is already stripped"))
            return
        env = read_envelope(entry.path)
        title = env.title if env.title is not None else session_title(env.text)
        rebuilt = worker.tok.rebuild_from_text(env.text)
        _check_control_tokens_survive(entry.path, env.payload_offset, header.tokens, rebuilt)
        n_tokens = len(rebuilt)
        # A legacy file (no title trailer) gets its identity now; the old name goes (loaded_from).
        saved = store.save_session(env.text, None, shape=None, quant_bits=header.quant_bits, title=title,
                                   created_at=header.created_at or None, loaded_from=entry.path,
                                   model_id=header.model_id, n_tokens=n_tokens, ctx=header.ctx_size)
    except Exception as err:  # SessionOpError, KVCError: readable
        worker.io.emit(ev.Error(f"strip failed: {err}"))
        return
    if worker.conv.identity.session_id == entry.id:
        # Its own rewrite: the next /save of the live session must not take it for another
        # instance's save (and fork).
        worker.conv.file_rewritten(saved)
    freed = entry.file_size - saved.path.stat().st_size
    worker.io.emit(ev.Notice(f"stripped session {saved.id[:8]} ({n_tokens:,} tokens to rebuild on load, "
                             f"{max(0, freed):,} bytes freed)"))


def _check_control_tokens_survive(path: Path, payload_offset: int, n_tokens: int, rebuilt: list[int]) -> None:
    """A stripped session keeps only its text, and a load tokenises it again: every spelling of a
    control token (`<｜User｜>`, `<｜Assistant｜>`, ...) becomes that token, where the template put
    it or not. A file or a command's output the model read may hold such spellings as plain text;
    rebuilt, they would forge turns. So a session is stripped only when its text gives back
    exactly the control tokens it had, in order (the plain text between them may split into
    other tokens: the model's own output is not always in the tokenizer's split)."""
    with open(path, "rb") as f:
        tokens = read_tokens(f, payload_offset, n_tokens)
    had = [int(t) for t in tokens if int(t) in RECOGNISED_IDS]
    would = [t for t in rebuilt if t in RECOGNISED_IDS]
    if had != would:
        raise SessionOpError("its text spells control tokens as plain text (a file or an output the model "
                             "read, quoted in the conversation); rebuilt from the text they would become real "
                             "turns, so this session is kept with its state")


def forget_deleted(worker: WorkerPort, sid: str) -> None:
    """A session file was deleted (picker): its index entry and undo log go with it."""
    remove_session_extras(_store(worker).directory, sid, worker.settings.undo_dir)


def _loaded_identity(worker: WorkerPort, loaded: LoadedSession, entry: IndexEntry | None) -> SessionIdentity:
    """A loaded session's identity: from its file, and its fork parent and undo log from
    its session-index entry."""
    identity = SessionIdentity(title=title_bytes(loaded.title), created_at=loaded.created_at,
                               session_id=loaded.id, legacy_path=str(loaded.path) if loaded.legacy else None,
                               activity=True, file_stamp=loaded.stamp)
    if entry is not None:
        identity.forked_from = entry.forked_from
        identity.undo = undo_log_for(entry.undo, worker.settings.undo_dir)
    return identity


def _announce_loaded(worker: WorkerPort, ids: list[int], system_len: int, *, prefilled: int,
                     resumed: bool = False) -> None:
    """After /load or a resume: journal the restored transcript and show its last turns."""
    journal_write(worker)
    history = last_turns(worker.tok, ids, system_len, 3)
    sid = worker.conv.identity.session_id
    worker.io.emit(ev.SessionLoaded(sid, sid[:8], len(ids), display_title(worker.conv.identity.title), tuple(history),
                                    resumed=resumed, prefilled=prefilled))


def _system_len(ids: list[int]) -> int:
    """Length of the system prefix of a loaded transcript: everything before the first <｜User｜>."""
    try:
        return ids.index(USER)
    except ValueError:
        return len(ids)


# ====================================================================== --continue / --resume


def requested_session(store: SessionStore | None, settings: AgentSettings) -> str | None:
    """The session --continue / --resume PREFIX asks for (an id or prefix), None when neither
    was given (or --resume without a prefix: the front end's picker). SessionOpError when
    --continue finds no saved session of this directory."""
    if settings.continue_session:
        if store is None:
            raise SessionOpError("no session directory")
        sid = SessionIndex(store.directory).latest_for(settings.cwd)
        if sid is None:
            raise SessionOpError(f"no saved session of {settings.cwd} to continue")
        return sid
    return settings.resume or None


def open_requested(worker: WorkerPort) -> None:
    """At start, after the crash-journal offer: load the session --continue / --resume named."""
    s = worker.settings
    if not (s.continue_session or s.resume):
        return
    if worker.conv.identity.activity:  # the user resumed an unsaved crashed session instead
        worker.io.emit(ev.Notice("the resumed unsaved session was opened instead", "warning"))
        return
    try:
        target = requested_session(worker.store, s)
    except SessionOpError as err:
        worker.io.emit(ev.Error(f"cannot continue: {err}"))
        return
    resolved = check_load_target(worker, target) if target else None
    if resolved is not None:
        load(worker, resolved)


# ====================================================================== list


def list_event(worker: WorkerPort) -> ev.SessionList:
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
        # While the model loads there is no engine yet: every session is listed (the headers are
        # all a listing reads); once loaded, only this model's.
        model_id = _model_id(worker) if getattr(worker, "engine", None) is not None else None
        for info in sessions:
            e = info.entry
            if model_id is not None and e.header.model_id != model_id:
                continue  # another model's session (the directory is shared): `kv ls --all` lists it
            parent = index[e.id].forked_from if e.id in index else ""
            infos.append(ev.SessionInfo(
                id=e.id, short_id=e.short_id, title=display_title(info.title), tokens=e.header.tokens,
                size_bytes=e.file_size, last_used=e.header.last_used, created_at=e.header.created_at,
                path=str(e.path), forked_from=parent[:8], stripped=e.header.payload_bytes == 0,
            ))
        infos.sort(key=lambda i: (-i.recency, i.id))
        # Listed, not hidden: the user sees the file and why, and can delete it.
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


def _journal(worker: WorkerPort) -> Journal | None:
    if worker.journal is None and worker.settings.journal:
        try:
            worker.journal = Journal(worker.settings.journal_dir)
        except OSError as err:
            worker.settings.journal = False
            where = worker.settings.journal_dir or journal_default_dir()
            worker.io.emit(ev.Notice(f"crash journal disabled: cannot use {where}: {err.strerror or err}",
                                     "warning"))
    return worker.journal


def journal_meta(worker: WorkerPort) -> dict[str, object]:
    return {
        "cwd": str(worker.settings.cwd),
        "system_len": worker.conv.transcript.system_len,
        "ctx": worker.settings.ctx,
        "time": int(time.time()),
        **worker.conv.identity.to_meta(),
    }


def journal_write(worker: WorkerPort) -> None:
    j = _journal(worker)
    if j is None:
        return
    try:
        j.write(worker.conv.transcript.ids, journal_meta(worker))
    except OSError as err:
        worker.io.emit(ev.Notice(f"crash journal write failed: {err.strerror or err}", "warning"))


def close_journal(worker: WorkerPort, *, keep: bool = False) -> None:
    if worker.journal is not None:
        worker.journal.close(keep=keep)
        worker.journal = None


def offer_resume(worker: WorkerPort) -> None:
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
    title = display_title(meta_title(chosen.meta)) or _derive_title(worker, chosen.tokens)
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
        worker.conv.transcript.reset(worker.conv.system_ids, len(worker.conv.system_ids))
        _reset_identity(worker)
        worker.io.emit(ev.Error(f"resume failed: {err}"))
        return
    chosen.discard()


def _derive_title(worker: WorkerPort, tokens: list[int]) -> str:
    return session_title(worker.tok.decode_bytes(tokens)).decode("utf-8", "replace")[:70]


def resume(worker: WorkerPort, tokens: list[int], meta: dict[str, object]) -> None:
    """Restore a journalled transcript: load the nearest saved KV whose text is a prefix of it
    (no prefill for that part), then prefill only the rest."""
    tokens = list(tokens)
    recorded = meta.get("system_len", 0)
    system_len = (int(recorded) if isinstance(recorded, int | float | str) else 0) or _system_len(tokens)
    if len(tokens) > system_len and tokens[-1] != EOS:
        # The run died mid-round: close the assistant output as an interrupt would (prompt-and-dsml.md §7).
        tokens.append(EOS)
    if len(tokens) >= worker.settings.ctx:
        raise SessionOpError(f"the journalled session ({len(tokens)} tokens) does not fit the context")
    worker.set_state(ev.State.LOADING, detail="resuming session")
    base = _nearest_saved_prefix(worker, tokens)
    if base is not None:
        worker.session.import_state(base.payload)
    worker.conv.transcript.reset(tokens, system_len)
    worker.sync(interruptible=False)
    prefilled = worker.conv.last_prefilled
    worker.conv.adopt_loaded(SessionIdentity.from_meta(meta, worker.settings.undo_dir))
    _announce_loaded(worker, tokens, system_len, prefilled=prefilled, resumed=True)
    worker.io.emit(ev.Notice(f"resumed the unsaved session ({len(tokens)} tokens, {prefilled} prefilled)"))


def _nearest_saved_prefix(worker: WorkerPort, tokens: list[int]) -> LoadedSession | None:
    """The saved session with the longest text that is a byte prefix of the journal's text."""
    if worker.store is None:
        return None
    return worker.store.nearest_prefix(worker.tok.decode_bytes(tokens), max_tokens=len(tokens),
                                       ctx=worker.settings.ctx, **_model_facts(worker))
