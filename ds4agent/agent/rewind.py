"""Going back to an earlier user turn: conversation (from a KV snapshot), code, or both.

The worker keeps the engine state just before every user turn (`keep_boundary`, called as a turn
starts) in the engine's SnapshotStore, so going back costs no prefill unless the budget dropped
that snapshot: then `Session.sync` re-prefills from the nearest earlier one, with the usual
progress events, and the Rewound event says how many tokens that took.

The turns offered are read back from the transcript (`split_turns`): human turns only (a results
turn is the tool loop's, not something the user typed), numbered from 1. A conversation rewind
cuts the transcript just before the chosen turn; the state there is the very state the session
had (the snapshot is exact), so with greedy sampling the same prompt gives the same answer.
"""

from __future__ import annotations

import time

from ds4agent.agent import events as ev
from ds4agent.agent import sessionops
from ds4agent.agent.port import WorkerPort
from ds4agent.protocol.template import parse_user_part, split_turns
from ds4agent.tools import attach

MODES = ("both", "chat", "code", "fork")
BASH_NOTE = "changes made through bash are not tracked and are not undone"


class RewindError(Exception):
    """A rewind request that cannot run; the message is one readable line."""


def keep_boundary(worker: WorkerPort) -> None:
    """At the start of a user turn (transcript at a boundary): record when it was sent, and keep
    the engine state that holds exactly the transcript so far (the EOS that closed the previous
    round is evaluated here, one token, instead of as part of the turn's prefill)."""
    worker.conv.turn_started(time.time())  # the undo log records file writes under this turn
    store = worker.snapshots
    if store is None:
        return
    ids = tuple(worker.conv.transcript.ids)
    if tuple(worker.session.tokens) != ids and not worker.sync():
        return  # interrupted: the turn's own sync reports it
    if tuple(worker.session.tokens) == ids:
        # Snapshots off this conversation's line (before a /new, /load or compaction, or an
        # abandoned branch) are of no use any more.
        store.retain_prefixes_of(worker.conv.transcript.ids)
        store.keep(worker.session)


def transcript_compacted(worker: WorkerPort) -> None:
    """After a compaction the turns sit at new transcript positions: forget the send times, and
    seal the undo log so far (a rewind to a turn after the compaction must not undo a
    write from before it, which an old position could otherwise be taken for)."""
    worker.conv.forget_turn_times()
    if worker.conv.identity.undo is not None:
        try:
            worker.conv.identity.undo.seal()
        except OSError as err:
            worker.io.emit(ev.Notice(f"undo log not sealed: {err.strerror or err}", "warning"))


def points(worker: WorkerPort) -> list[ev.RewindPoint]:
    tok = worker.tok
    out: list[ev.RewindPoint] = []
    for turn in split_turns(worker.conv.transcript.ids, worker.conv.transcript.system_len):
        results, text = parse_user_part(tok.decode_bytes(turn.user))
        if results:
            continue
        first = text.strip().splitlines()[0] if text.strip() else ""
        out.append(ev.RewindPoint(len(out) + 1, worker.conv.turn_times.get(turn.start, 0.0), first,
                                  turn.start))
    return out


def prompt_of(worker: WorkerPort, start: int) -> str:
    for turn in split_turns(worker.conv.transcript.ids, start):
        return attach.strip(parse_user_part(worker.tok.decode_bytes(turn.user))[1])
    return ""


def list_event(worker: WorkerPort) -> ev.RewindList:
    return ev.RewindList(tuple(points(worker)), BASH_NOTE)


def rewind(worker: WorkerPort, number: int, mode: str) -> ev.Rewound:
    """Go back to just before user turn `number` (1-based). Raises RewindError."""
    if mode not in MODES:
        raise RewindError(f"unknown rewind mode: {mode} ({', '.join(MODES)})")
    pts = points(worker)
    if not pts:
        raise RewindError("nothing to rewind: the session has no user turn yet")
    if not 1 <= number <= len(pts):
        raise RewindError(f"no user turn {number} (1..{len(pts)})")
    point = pts[number - 1]
    prompt = prompt_of(worker, point.tokens)
    restored: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    if mode in ("both", "code"):
        restored, refused = restore_code(worker, point.tokens)
    if mode == "fork" and worker.conv.identity.unsaved_work and worker.store is not None:
        # The original goes on existing as it is now: save its unsaved turns before cutting them.
        if sessionops.save(worker) is None:
            raise RewindError("fork failed: the current conversation could not be saved first")
    prefilled = 0
    if mode != "code":
        prefilled = rewind_chat(worker, point.tokens)
    if mode == "fork":
        sessionops.fork(worker, None)
    event = ev.Rewound(number, mode, prompt, len(worker.conv.transcript), prefilled, restored, refused)
    worker.io.emit(event)
    worker.io.emit(ev.Notice(summary(event)))
    return event


def take_back(worker: WorkerPort, keep: int, prompt: str) -> None:
    """Take the last user message back out of the conversation (it was interrupted before any
    answer): the transcript is cut to its first `keep` tokens, the live KV catches up at the next
    sync (a snapshot at the turn boundary serves it), and the text goes back to the input box."""
    number = len(points(worker))
    target = worker.conv.cut(keep)
    if worker.snapshots is not None:
        worker.snapshots.retain_prefixes_of(target)
    worker.conv.changed()
    sessionops.journal_write(worker)
    worker.io.emit(ev.Rewound(number, "chat", prompt, len(worker.conv.transcript), 0))


def summary(event: ev.Rewound) -> str:
    what = {"both": "code and conversation", "chat": "conversation", "code": "code",
            "fork": "conversation, forked"}[event.mode]
    line = f"rewound to turn {event.number} ({what})"
    if event.mode != "code":
        line += f": {event.tokens} tokens, {event.prefilled} prefilled"
    if event.mode in ("both", "code"):
        line += f"; {len(event.restored)} file(s) restored"
        if event.refused:
            line += f", {len(event.refused)} left alone"
    return line


def rewind_chat(worker: WorkerPort, keep: int) -> int:
    """Cut the transcript to its first `keep` tokens and make the live state hold them; returns
    how many tokens were prefilled (0 when a snapshot served)."""
    target = worker.conv.cut(keep)
    store = worker.snapshots
    if store is not None:
        store.restore(worker.session, target)
        store.retain_prefixes_of(target)
    prefilled = worker.conv.last_prefilled if worker.sync() else 0
    worker.conv.forget_pending_results()
    # The model no longer has the reads of the dropped turns in its context: the edit guard must
    # not trust them (it asks for a fresh read instead).
    worker.tool_ctx.reset_session()
    worker.conv.changed()
    sessionops.journal_write(worker)
    return prefilled


def restore_code(worker: WorkerPort, keep: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Put back the files the tools changed in the turns from transcript index `keep` on. Files
    changed since the agent last wrote them are left alone unless the user confirms."""
    ckpt = worker.conv.identity.undo
    if ckpt is None:
        return (), ()
    plan = ckpt.plan(keep)
    if plan.conflicts:
        names = "\n".join(f"  {c.path}: {c.reason}" for c in plan.conflicts)
        key, _ = worker.io.ask(ev.Question(
            id=worker.io.new_id("rewind"), kind="rewind",
            question=f"{len(plan.conflicts)} file(s) changed since the agent last wrote them:\n{names}\n"
                     "Overwrite them with the undo log's copies too?",
            options=(("y", "overwrite them too"), ("n", "leave them alone")),
        ))
        force = key == "y"
    else:
        force = False
    return ckpt.apply(plan, force=force)
