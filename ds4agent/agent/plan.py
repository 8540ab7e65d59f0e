"""Plan mode: the model investigates and proposes; nothing changes until the user approves.

Plan mode is a permission mode ("plan", tools/permissions.py): write, edit, bash and MCP tools
that do not declare themselves read-only are refused with a reason the model can act on; read,
search, list and todo run. Every user turn sent in plan mode opens with PLAN_NOTE, so the model
knows why (the note is part of the transcript, like any message: a saved session keeps it).

When a plan-mode turn ends with an answer, that answer is the plan, and the user is asked
(a PermissionRequest with tool "plan", so every front end shows it):
    y  approve: leave plan mode for ask and carry it out (asking before each change)
    a  approve: leave plan mode for auto and carry it out
    n  keep planning; a message with it (the TUI's m) sends the plan back with these comments,
       which start the next plan-mode turn at once. Without one, the user's next message is the
       comment (plain mode and headless have no message field).

    switch(worker, mode)    set the permission mode (plan remembers the mode it left)
    toggle(worker)          /plan and Shift+Tab: into plan mode, or back to the mode it left
    decorate(worker, text)  the user turn's text as sent (PLAN_NOTE first in plan mode)
    review(worker, reason)  after a turn: the approval question; the follow-up turn's text or None
"""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.port import WorkerPort
from ds4agent.protocol.template import split_turns
from ds4agent.protocol.tokenizer import END_THINK, THINK

MODE = "plan"
PLAN_NOTE = ("[Plan mode: read, search and think, but do not edit files or run commands; those calls "
             "are refused. Investigate what the task needs, then answer with a concrete, numbered "
             "plan (files, changes, how to verify) and stop. The user approves it or sends it back.]\n\n")
APPROVED = ("The user approved the plan. Carry it out now, step by step, and verify the result "
            "(permission mode: {mode}).")
SENT_BACK = "The user sends the plan back with these comments; revise it:\n\n{comments}"
QUESTION = "Approve this plan?"
OPTIONS = (("y", "approve: carry it out, asking before changes"),
           ("a", "approve: carry it out without asking (auto)"),
           ("n", "keep planning (your next message is the comment)"),
           ("m", "send it back with comments"))
KEEP_PLANNING = "still in plan mode: your next message revises the plan; /plan or Shift+Tab leaves it"


def switch(worker: WorkerPort, mode: str) -> None:
    """Set the permission mode for the calls that follow (session grants are kept); entering plan
    mode remembers the mode it left, which toggle() and nothing else returns to."""
    old = worker.settings.permission
    if mode == MODE and old != MODE:
        worker.conv.enter_plan(old)
    worker.settings.permission = mode
    worker.policy.mode = mode
    note = "plan mode: the model reads and plans; nothing is changed until you approve" if mode == MODE else ""
    worker.io.emit(ev.Notice(f"permission mode: {mode}" + (f" ({note})" if note else "")))
    worker.emit_status()


def toggle(worker: WorkerPort) -> None:
    if worker.settings.permission == MODE:
        switch(worker, worker.conv.plan_return if worker.conv.plan_return != MODE else "ask")
    else:
        switch(worker, MODE)


def decorate(worker: WorkerPort, text: str) -> str:
    return PLAN_NOTE + text if worker.settings.permission == MODE else text


def last_answer(worker: WorkerPort) -> str:
    """The visible text of the transcript's last assistant output (its reasoning left out)."""
    t = worker.conv.transcript
    turns = split_turns(t.ids, t.system_len)
    if not turns:
        return ""
    turn = turns[-1]
    out = list(turn.output)
    if turn.think_token == THINK:
        out = out[out.index(END_THINK) + 1:] if END_THINK in out else []
    return worker.tok.decode_bytes(out).decode("utf-8", "replace").strip()


def review(worker: WorkerPort, reason: str) -> str | None:
    """After a turn in plan mode that ended with an answer: ask about the plan. Returns the text
    of the turn to run next (approved: carry it out; comments: revise it), or None."""
    if worker.settings.permission != MODE or reason != "done":
        return None
    plan = last_answer(worker)
    if not plan:
        return None
    key, message = worker.io.ask(ev.PermissionRequest(
        id=worker.io.new_id("plan"), tool=MODE, question=QUESTION, detail=plan, options=OPTIONS,
        preview_kind="plan"))
    if key in ("y", "a"):
        mode = "ask" if key == "y" else "auto"
        switch(worker, mode)
        return APPROVED.format(mode=mode)
    if message.strip():
        return SENT_BACK.format(comments=message.strip())
    worker.io.emit(ev.Notice(KEEP_PLANNING))
    return None
