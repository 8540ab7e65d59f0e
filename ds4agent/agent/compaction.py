"""Context compaction (agent-reference.md §8): a durable summary replaces the old conversation.

Triggers:
* soft: before a user turn and before each later round (i.e. before a results turn is appended),
  when the projected transcript reaches 85% of ctx or leaves at most min(8192, ctx/4) free;
* hard: a results turn would not fit (projected + 1024 >= ctx): compact, then retry (worker.py);
* mid-response: one answer (a long round) runs into the end of the context: the round stops
  MIDTURN_RESERVE tokens early, ends with its EOS (a turn boundary), the conversation is compacted,
  and the model continues after CONTINUE_NOTE (worker.py), instead of the turn stopping;
* manual: /compact.

Procedure: a private user message (never kept) asks, with thinking off, for a task-state summary;
it is sampled greedily, streamed as CompactionDelta, and stops at EOS, `</think>`, a DSML marker
or a stop token. The new transcript is

    system prefix + [compaction wrapper + summary (+ the user's goal, verbatim)] + verbatim tail

rendered by the one renderer (template.compacted_prefix_pieces): the wrapper lines are trusted,
the summary is untrusted, and the tail is copied as token ids (never re-tokenised). The tail is
min(ctx/10, 50000) tokens, moved forward to the first `<｜User｜>` inside it. The system prefix
(built-in text, AGENTS.md, tools) is rendered afresh, so the project instructions survive as is.
The new transcript is prefilled from the longest common prefix (the system prefix's KV is kept).
Bash jobs still running are re-announced in the next User turn (Worker.pending_results).

On failure (interrupt, empty summary, no room) the old transcript is kept unchanged and the live
KV is simply re-synced to it by the next round (`Session.sync` rewinds as needed). So it is when
compaction would not make the context smaller (the whole conversation is within the verbatim
tail, or summary + tail are not shorter than what they replace): a notice says why.
"""

from __future__ import annotations

import time

from ds4agent import utf8
from ds4agent.agent import events as ev
from ds4agent.agent import rewind, sessionops
from ds4agent.agent.decode import TokenStream
from ds4agent.agent.history import session_title
from ds4agent.agent.port import WorkerPort
from ds4agent.protocol import template
from ds4agent.protocol.template import parse_user_part, split_turns
from ds4agent.protocol.tokenizer import DSML, END_THINK, EOS, USER
from ds4agent.tools import running_jobs_update

# Hard compaction reserve (agent-reference.md §8): a results turn must leave this much room.
RESULT_RESERVE = 1024
# If even the shortened results do not fit with this reserve, the turn aborts.
MIN_RESERVE = 16
# Mid-response: a round stops this many tokens before the end of the context, so that the
# compaction's request and a summary still fit after it (the summary needs SUMMARY_MIN_ROOM).
MIDTURN_RESERVE = 1024
# What the model reads after a compaction that cut its answer short (as a tool message, like the
# bash job update: the agent speaking, not the user).
CONTINUE_NOTE = ("Context compacted while you were answering: your answer above stopped at the "
                 "compaction. Continue the task from where it stopped; do not repeat finished work.")
SUMMARY_MAX_TOKENS = 4096
SUMMARY_MIN_ROOM = 256
TAIL_MAX_TOKENS = 50_000
GOAL_MAX_BYTES = 4000
# The DSML marker spelled in ordinary byte tokens (not the special token) also ends a summary.
_DSML_BYTES = "｜DSML｜".encode()  # U+FF5C, as the model writes it

SUMMARY_REQUEST = """Context compaction: the conversation above is about to be replaced by a summary, so write a durable task-state summary that lets the work continue without it. Plain text only: no tool calls, no reasoning tags, no raw file dumps. Include, as applicable:
- the user's goals and explicit requirements, quoted when short;
- constraints, preferences and project conventions learned so far;
- files read or changed, with exact paths and line ranges worth reloading;
- commands run and their results (what passed, what failed and why);
- decisions taken and approaches rejected, with the reason;
- known bugs, open questions and the next concrete steps.
Do not invent anything that did not happen. Be concise but complete."""


def compact_threshold(ctx: int) -> int:
    """Soft compaction triggers at 85% of ctx or when at most min(8192, ctx/4) tokens are free."""
    return min(int(ctx * 0.85), ctx - min(8192, ctx // 4))


def maybe_compact(worker: WorkerPort, projected: int, kind: str, *, force: bool = False) -> bool:
    """Compact when `projected` (the transcript after the next append) crosses the soft threshold,
    or always when force. Returns True when the transcript was compacted."""
    if not force and projected < compact_threshold(worker.settings.ctx):
        return False
    if len(worker.conv.transcript) <= worker.conv.transcript.system_len:
        return False
    return compact(worker, kind, projected=projected)


def mid_response(worker: WorkerPort) -> bool:
    """An answer filled the context: compact at this safe point (the round just ended with its
    EOS). True when the model may go on (after CONTINUE_NOTE); False when the compaction failed
    or the user interrupted (the turn ends)."""
    return not worker.io.should_stop() and compact(worker, "mid-response")


def _tail_keep(ctx: int) -> int:
    return min(ctx // 10, TAIL_MAX_TOKENS)


def _tail(worker: WorkerPort) -> list[int]:
    ids = worker.conv.transcript.ids
    keep = _tail_keep(worker.settings.ctx)
    start = max(worker.conv.transcript.system_len, len(ids) - keep)
    while start < len(ids) and ids[start] != USER:
        start += 1
    return ids[start:]


def _clip(text: str) -> str:
    data = text.encode("utf-8")
    if len(data) <= GOAL_MAX_BYTES:
        return text
    return utf8.cut(data, GOAL_MAX_BYTES).decode("utf-8") + " [...]"


def _goal_note(worker: WorkerPort, tail: list[int]) -> str:
    """The user's messages that started and steer the task, verbatim, unless the tail keeps them."""
    tok = worker.tok
    tail_bytes = tok.decode_bytes(tail)
    texts: list[str] = []
    for t in split_turns(worker.conv.transcript.ids, worker.conv.transcript.system_len):
        _, text = parse_user_part(tok.decode_bytes(t.user))
        if text:
            texts.append(text)
    picks: list[str] = []
    if texts:
        picks.append(texts[0])
        if texts[-1] != texts[0]:
            picks.append(texts[-1])
    lines = []
    for label, text in zip(("The user's first request", "The user's latest request"), picks, strict=False):
        if text.encode("utf-8") in tail_bytes:
            continue
        lines.append(f"{label} (verbatim):\n{_clip(text)}")
    return "\n\n".join(lines)


def jobs_update(worker: WorkerPort) -> str:
    """`Bash job update after context compaction. ...` + one observation per running job, or ""."""
    try:
        # A tool observation: its lines keep their `\n` (agent-reference.md §5).
        return running_jobs_update(worker.tool_ctx) or ""
    except Exception:  # a job table problem must not fail the turn
        return ""


def _write_summary(worker: WorkerPort, limit: int) -> bytes | None:
    """Sample the summary greedily after the private request (already in the live KV), streaming
    it as CompactionDelta. It ends at EOS, `</think>`, a DSML marker or a stop token. Returns the
    trimmed text, or None when the user interrupted."""
    tok = worker.tok
    io = worker.io
    count = 0
    t0 = time.monotonic()
    decoder_bytes = bytearray()
    tokens = TokenStream(worker.session, worker.sampler, limit=limit, greedy=lambda: True,
                         should_stop=io.should_stop, duty=worker.duty)
    for token in tokens:
        if token in (EOS, END_THINK, DSML) or tok.is_stop(token):
            break
        count += 1
        data = tok.token_bytes(token)
        decoder_bytes += data
        # The byte-spelled DSML marker also ends the summary (reference).
        if _DSML_BYTES in decoder_bytes[-32:]:
            decoder_bytes = decoder_bytes[:decoder_bytes.rfind(_DSML_BYTES)]
            break
        io.emit(ev.CompactionDelta(data.decode("utf-8", "replace")))
        if count % 32 == 0:
            worker.conv.decoding(count, count / max(time.monotonic() - t0, 1e-9))
            worker.emit_status()
    if tokens.interrupted:
        return None
    return template.trim(bytes(decoder_bytes))


def compact(worker: WorkerPort, kind: str, *, projected: int | None = None) -> bool:
    """Replace the conversation by summary + tail (see the module docstring); True when it did.
    `projected` is the size that triggered it (kept for the trace)."""
    tok = worker.tok
    io = worker.io
    ctx = worker.settings.ctx
    old_ids = list(worker.conv.transcript.ids)
    old_system_len = worker.conv.transcript.system_len
    before = len(old_ids)
    io.emit(ev.CompactionStarted(kind, before))
    worker.set_state(ev.State.COMPACTING, detail=f"{kind}: summarizing durable task state")

    def fail(message: str) -> bool:
        worker.conv.transcript.reset(old_ids, old_system_len)
        io.emit(ev.CompactionDone(False, before, before, error=message))
        io.emit(ev.Error(f"compaction failed: {message}"))
        return False

    def pointless(message: str) -> bool:
        # Not a failure: compaction cannot make this context smaller, so it keeps it as it is.
        worker.conv.transcript.reset(old_ids, old_system_len)
        io.emit(ev.CompactionDone(False, before, before, error=message))
        io.emit(ev.Notice(f"nothing compacted: {message}", "warning"))
        return False

    if not worker.conv.transcript.at_turn_boundary():
        return fail("the conversation is in the middle of a turn")
    conversation = before - old_system_len
    if len(_tail(worker)) >= conversation:
        # The tail kept verbatim would be the whole conversation: a summary could only add to it.
        return pointless(f"the whole conversation ({conversation} tokens) is within the last "
                         f"{_tail_keep(ctx)} tokens, which compaction keeps verbatim")
    reason_line = {
        "soft": "the context is nearly full",
        "hard": "a tool result does not fit in the remaining context",
        "manual": "the user asked for it (/compact)",
        "mid-response": "the context filled up during one answer, which continues after it",
    }.get(kind, kind)
    request = template.render(template.user_turn_pieces(f"{SUMMARY_REQUEST}\n\nCompaction reason: {reason_line}.",
                                                        think_mode="nothink"), tok)
    room = ctx - before - len(request) - 1
    if room < SUMMARY_MIN_ROOM:
        return fail(f"not enough room to write a summary ({max(room, 0)} tokens free)")
    worker.conv.transcript.extend(request)
    try:
        if not worker.sync():
            return fail("interrupted")
        text = _write_summary(worker, min(SUMMARY_MAX_TOKENS, room))
        if text is None:
            return fail("interrupted")
        if not text:
            return fail("the model wrote an empty summary")
        worker.conv.transcript.reset(old_ids, old_system_len)  # drop the private request
        tail = _tail(worker)
        goal = _goal_note(worker, tail)
        body = text + (b"\n\n" + goal.encode("utf-8") if goal else b"")
        system = worker.conv.system
        prefix = template.render(template.compacted_prefix_pieces(
            system.builtin, body, extra_system_text=system.extra, tools=worker.tools,
            think_mode="think-max" if worker.conv.system_is_max else "think",
            ctx=ctx), tok)
        new_ids = prefix + tail
        if len(new_ids) >= before:
            return pointless(f"the summary and the kept tail ({len(new_ids)} tokens) would not be "
                             f"smaller than the context now ({before} tokens)")
        if len(new_ids) + SUMMARY_MIN_ROOM >= ctx:
            return fail("the summary and the kept tail do not fit the context")
        # The title is derived from the first user message of the text (kvc-format.md §12.7);
        # after the rebuild that would be whatever turn the tail starts with. Fix it now, so a
        # session first saved after a compaction is still named after the user's request.
        worker.conv.name_if_untitled(lambda: session_title(tok.decode_bytes(old_ids)))
        worker.conv.transcript.reset(new_ids, len(prefix))
        rewind.transcript_compacted(worker)
        if not worker.sync():
            # Keep the compacted transcript: it is consistent; the next round prefills the rest.
            pass
    except Exception as err:  # an engine failure must not lose the conversation
        return fail(str(err) or type(err).__name__)
    # Running bash jobs are re-announced (agent-reference.md §8) as one more tool result in the
    # next User turn, the first thing appended after a compaction (a user turn or a results
    # turn): chronologically after the tail, observed when that turn is rendered, so the model
    # sees the jobs' current state, not the state at the moment of the summary.
    worker.conv.after_compaction()  # the conversation differs from its file too
    after = len(worker.conv.transcript)
    io.emit(ev.CompactionDone(True, before, after, summary_tokens=len(prefix) - old_system_len,
                              tail_tokens=len(tail)))
    io.emit(ev.Notice(f"compacted context: old={before} summary+tail={after} tail={len(tail)}"))
    worker.trace.line(f"compaction {kind}: old={before} new={after} tail={len(tail)}")
    sessionops.journal_write(worker)
    return True
