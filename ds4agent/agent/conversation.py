"""Conversation: the live conversation's mutable state, with one owner.

The worker holds one Conversation (`worker.conv`); the session commands (sessionops, compaction,
rewind, plan, todos) read its fields and change them only through the methods below, each named
for what happened. So "who changes the identity" has one answer: this class, when a session is
started, loaded, resumed or forked (tests/agent/test_conversation.py keeps it so).

    transcript       the token transcript (the object stays; its own methods append and reset it)
    identity         who the conversation is (identity.py): replaced at /new, /load, resume, /fork
    think_mode       the THINK token later turns use (may differ from the setting: think-max)
    turn_times       transcript index of a user turn's <｜User｜> -> when it was sent (rewind)
    turn_at          transcript index of the current user turn (the undo log records under it)
    todo_list        the model's task list as last published (todos.py)
    plan_return      the permission mode plan mode returns to (plan.py)
    system, skills   the system text and the skills found when the system prefix was rendered
    system_ids       the rendered system prefix; system_is_max: rendered for think-max
    status figures   generated, decode_tps, prefill_tps, greedy, last_prefilled

A compaction leaves a bash job update due: it is observed once, when the next User turn is
rendered, and kept until that turn is appended (`pending_results`, `results_delivered`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ds4agent.agent.identity import SessionIdentity, SubagentRecord, title_bytes
from ds4agent.agent.prompt import SystemText
from ds4agent.agent.skills import SkillSet
from ds4agent.agent.transcript import Transcript
from ds4agent.sessions.undo import UndoLog

if TYPE_CHECKING:
    from ds4agent.sessions.entries import SavedSession
    from ds4agent.tools.todo import TodoItem


class Conversation:
    """See the module docstring. Every field is read through a property; nothing outside this
    class assigns one."""

    def __init__(self, think_mode: str) -> None:
        self._transcript = Transcript()
        self._identity = SessionIdentity()
        self._think_mode = think_mode
        self._turn_times: dict[int, float] = {}
        self._turn_at = 0
        self._jobs_update_due = False
        self._jobs_update: str | None = None
        self._todo_list: tuple[TodoItem, ...] = ()
        self._plan_return = "ask"
        self._system = SystemText("", "", ())
        self._skills = SkillSet()
        self._system_ids: list[int] = []
        self._system_is_max = False
        self._generated = 0
        self._decode_tps = 0.0
        self._prefill_tps = 0.0
        self._greedy = False
        self._last_prefilled = 0

    # ------------------------------------------------------------------ reading

    @property
    def transcript(self) -> Transcript:
        return self._transcript

    @property
    def identity(self) -> SessionIdentity:
        return self._identity

    @property
    def think_mode(self) -> str:
        return self._think_mode

    @property
    def turn_times(self) -> Mapping[int, float]:
        return self._turn_times

    @property
    def turn_at(self) -> int:
        return self._turn_at

    @property
    def jobs_update_due(self) -> bool:
        return self._jobs_update_due

    @property
    def todo_list(self) -> tuple[TodoItem, ...]:
        return self._todo_list

    @property
    def plan_return(self) -> str:
        return self._plan_return

    @property
    def system(self) -> SystemText:
        return self._system

    @property
    def skills(self) -> SkillSet:
        return self._skills

    @property
    def system_ids(self) -> Sequence[int]:
        return self._system_ids

    @property
    def system_is_max(self) -> bool:
        return self._system_is_max

    @property
    def generated(self) -> int:
        return self._generated

    @property
    def decode_tps(self) -> float:
        return self._decode_tps

    @property
    def prefill_tps(self) -> float:
        return self._prefill_tps

    @property
    def greedy(self) -> bool:
        return self._greedy

    @property
    def last_prefilled(self) -> int:
        return self._last_prefilled

    # ------------------------------------------------------------------ the system prefix

    def system_rendered(self, system: SystemText, skills: SkillSet, *, is_max: bool) -> None:
        """The system text was built (start, /new): its skills, and whether it is think-max's."""
        self._system = system
        self._skills = skills
        self._system_is_max = is_max

    def system_kept(self, ids: Sequence[int]) -> None:
        """The rendered system prefix every new conversation of this run starts from."""
        self._system_ids = list(ids)

    # ------------------------------------------------------------------ the whole conversation

    def reset_new(self) -> SessionIdentity:
        """A new conversation begins (/new, /load, a failed resume): a blank identity, no turn
        times, no pending job update. Returns the identity left behind (its undo log may go)."""
        old = self._identity
        self._identity = SessionIdentity()
        self._turn_times = {}
        self.forget_pending_results()
        return old

    def adopt_loaded(self, identity: SessionIdentity) -> None:
        """The transcript now is a saved or journalled session's: it is that session."""
        self._identity = identity

    def become_fork(self, identity: SessionIdentity) -> None:
        """/fork: the same turns, a new identity; the next save writes the fork's file."""
        self._identity = identity

    def changed(self) -> None:
        """Turns were added or cut (a user turn, a rewind): the conversation differs from its
        saved file, and it has something to save."""
        self._identity.dirty = True
        self._identity.activity = True

    def saved(self, saved: SavedSession, *, forked_from: str | None = None) -> None:
        """The conversation was written as `saved` (/save, /fork; forked_from: the session it was
        saved beside as a fork, when another instance had saved over it)."""
        if forked_from is not None:
            self._identity.forked_from = forked_from
        self.file_rewritten(saved)
        self._identity.dirty = False

    def file_rewritten(self, saved: SavedSession) -> None:
        """The conversation's file is now `saved` (/save, or /strip of the live session's file): its
        id, title and the stamp the next save expects to find there."""
        identity = self._identity
        identity.file_stamp = saved.stamp
        identity.title = title_bytes(saved.title)
        identity.created_at = saved.created_at
        identity.session_id = saved.id
        identity.legacy_path = None

    def name_if_untitled(self, derive: Callable[[], bytes]) -> None:
        """Give the conversation the title `derive` makes when it has none yet (a compaction keeps
        the first request's); derived only then (it decodes the whole transcript)."""
        if self._identity.title is None:
            self._identity.title = derive()

    def undo_log(self, undo_dir: Path | None) -> UndoLog:
        """The undo log a tool's file write is recorded in, under the current turn (made at the
        conversation's first write, in `undo_dir`)."""
        identity = self._identity
        if identity.undo is None:
            identity.undo = UndoLog(undo_dir)
        identity.undo.at = self._turn_at
        return identity.undo

    def subagent_ran(self, record: SubagentRecord) -> None:
        self._identity.subagents.append(record)

    def subagents_loaded(self, records: list[SubagentRecord]) -> None:
        """The subagent records saved with the session just loaded."""
        self._identity.subagents[:] = records

    def use_think_mode(self, mode: str) -> None:
        self._think_mode = mode

    def after_compaction(self) -> None:
        """The conversation was replaced by summary + tail: it differs from its file, and the
        next User turn re-announces the running bash jobs."""
        self._identity.dirty = True
        self._jobs_update_due = True

    def forget_turn_times(self) -> None:
        """The turns moved to other transcript positions (a compaction): their send times go."""
        self._turn_times = {}

    # ------------------------------------------------------------------ turns

    def turn_started(self, when: float) -> None:
        """A user turn begins at the transcript's end, sent at `when` (epoch seconds)."""
        at = len(self._transcript)
        self._turn_times[at] = when
        self._turn_at = at

    def cut(self, keep: int) -> list[int]:
        """Cut the transcript to its first `keep` tokens (a rewind, a message taken back): the
        turns from there on and their send times go. Returns the ids kept."""
        target = list(self._transcript.ids[:keep])
        self._transcript.reset(target, min(self._transcript.system_len, keep))
        self._turn_times = {k: v for k, v in self._turn_times.items() if k < keep}
        return target

    def pending_results(self, observe: Callable[[], str]) -> list[str]:
        """Extra tool results for the next User turn: the bash job update after a compaction
        (agent-reference.md §8). `observe` is asked once, the first time after the compaction;
        its text is kept until results_delivered (rendering may be retried to fit the context)."""
        if self._jobs_update_due:
            self._jobs_update_due = False
            self._jobs_update = observe() or None
        return [self._jobs_update] if self._jobs_update else []

    def results_delivered(self) -> None:
        """The User turn carrying the pending results was appended."""
        self._jobs_update = None

    def forget_pending_results(self) -> None:
        """The transcript the job update belonged to was replaced (/new, /load, a rewind)."""
        self._jobs_update_due = False
        self._jobs_update = None

    # ------------------------------------------------------------------ task list, plan mode

    def show_todos(self, items: tuple[TodoItem, ...]) -> bool:
        """The task list now shown; True when it differs from the one shown before."""
        changed = items != self._todo_list
        self._todo_list = items
        return changed

    def enter_plan(self, left: str) -> None:
        """Plan mode was entered from permission mode `left`, which leaving it returns to."""
        self._plan_return = left

    # ------------------------------------------------------------------ status figures

    def decoding(self, generated: int, tps: float | None = None, *, greedy: bool | None = None) -> None:
        """Tokens generated so far in this round (and its rate, when measured)."""
        self._generated = generated
        if tps is not None:
            self._decode_tps = tps
        if greedy is not None:
            self._greedy = greedy

    def turn_over(self) -> None:
        """The turn ended: nothing is being generated."""
        self._generated = 0
        self._greedy = False

    def prefilling(self, tps: float) -> None:
        self._prefill_tps = tps

    def prefilled(self, n: int, tps: float | None = None) -> None:
        """A sync finished: `n` tokens were really prefilled (the engine may rewind further back)."""
        self._last_prefilled = n
        if tps is not None:
            self._prefill_tps = tps
