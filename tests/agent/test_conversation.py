"""The live conversation's state has one owner (agent/conversation.py), and the worker's commands
are values dispatched in one place (agent/ops.py, Worker.run).

The ownership rule is read from the source with `ast`: no module but conversation.py assigns an
attribute that Conversation owns (`worker.identity = ...`, `x.conv.turn_times = ...`,
`setattr(x, "transcript", ...)`) or a field of the live identity (`x.conv.identity.dirty = ...`,
`x.conv.identity.subagents.append(...)`), and the Worker assigns none of them to itself either.
A SessionIdentity being built (a local variable) is not the live one and is not looked at."""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from ds4agent.agent import ops
from ds4agent.agent.conversation import Conversation
from ds4agent.agent.identity import SessionIdentity, SubagentRecord
from ds4agent.agent.prompt import SystemText
from ds4agent.agent.skills import SkillSet
from ds4agent.agent.worker import Worker
from ds4agent.tools.todo import TodoItem

PACKAGE = Path(__file__).resolve().parents[2] / "ds4agent"
OWNER = PACKAGE / "agent" / "conversation.py"


def _owned() -> set[str]:
    """The attributes Conversation owns: its read-only properties."""
    tree = ast.parse(OWNER.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Conversation")
    return {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)}


OWNED = _owned()
# Objects with a field of the same name that is another fact: the settings' think_mode is the mode
# the user chose, the conversation's the one in effect; the settings' system is --system's text.
OTHER_OWNERS = {"settings", "s"}
MUTATORS = {"append", "extend", "clear", "insert", "pop", "remove", "update", "setdefault", "sort"}


def _on_identity(node: ast.expr) -> bool:
    """`node` is `<...>.identity`: the live identity reached through its owner."""
    return isinstance(node, ast.Attribute) and node.attr == "identity"


def _targets(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List):
        return [t for e in node.elts for t in _targets(e)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return [node]


def owner_violations(source: str, name: str = "<source>") -> list[str]:
    """Where `source` assigns an attribute Conversation owns: on anything but `self`, or on `self`
    inside the Worker (which holds the conversation and must not keep a second copy)."""
    found: list[str] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls
            targets: list[ast.expr] = []
            if isinstance(child, ast.Assign):
                targets = [t for target in child.targets for t in _targets(target)]
            elif isinstance(child, ast.AugAssign | ast.AnnAssign):
                targets = _targets(child.target)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr in MUTATORS and isinstance(child.func.value, ast.Attribute)
                  and _on_identity(child.func.value.value)):
                found.append(f"{name}:{child.lineno} changes {ast.unparse(child.func.value)}")
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "setattr"
                  and len(child.args) >= 2 and isinstance(child.args[1], ast.Constant)
                  and child.args[1].value in OWNED):
                found.append(f"{name}:{child.lineno} setattr(..., {child.args[1].value!r})")
            for t in targets:
                if isinstance(t, ast.Attribute) and _on_identity(t.value):
                    found.append(f"{name}:{t.lineno} assigns {ast.unparse(t)}")
                    continue
                if not (isinstance(t, ast.Attribute) and t.attr in OWNED):
                    continue
                base = t.value
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if base_name in OTHER_OWNERS:
                    continue
                on_self = isinstance(base, ast.Name) and base.id == "self"
                if not on_self or cls == "Worker":
                    found.append(f"{name}:{t.lineno} assigns {ast.unparse(t)}")
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def test_owned_attributes_are_the_conversations_state():
    assert {"transcript", "identity", "think_mode", "turn_times", "turn_at", "jobs_update_due", "todo_list",
            "plan_return", "generated", "decode_tps", "last_prefilled", "system_ids", "system_is_max"} <= OWNED


def test_the_checker_finds_assignments_from_outside():
    src = ("def f(worker, x):\n"
           "    worker.identity = x\n"
           "    worker.conv.turn_times = {}\n"
           "    a, worker.conv.todo_list = 1, ()\n"
           "    worker.conv.generated += 1\n"
           "    setattr(worker, 'transcript', x)\n"
           "    worker.conv.identity.dirty = True\n"
           "    worker.conv.identity.subagents.append(x)\n"
           "    worker.settings.think_mode = x\n"  # the user's chosen mode: the settings' own field
           "    identity = SessionIdentity()\n"
           "    identity.undo = x\n"  # an identity being built, not the live one
           "class SkillTool:\n"
           "    def __init__(self, skills):\n"
           "        self.skills = skills\n"  # another class's own attribute of the same name
           "class Worker:\n"
           "    def __init__(self):\n"
           "        self.think_mode = 'think'\n")
    assert owner_violations(src) == [
        "<source>:2 assigns worker.identity",
        "<source>:3 assigns worker.conv.turn_times",
        "<source>:4 assigns worker.conv.todo_list",
        "<source>:5 assigns worker.conv.generated",
        "<source>:6 setattr(..., 'transcript')",
        "<source>:7 assigns worker.conv.identity.dirty",
        "<source>:8 changes worker.conv.identity.subagents",
        "<source>:17 assigns self.think_mode",
    ]


def test_only_the_conversation_assigns_its_state():
    wrong: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != OWNER:
            wrong += owner_violations(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------- the state's methods


def test_fields_are_read_only():
    conv = Conversation("think")
    with pytest.raises(AttributeError):
        conv.identity = SessionIdentity()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        conv.think_mode = "nothink"  # type: ignore[misc]


def test_a_new_conversation_forgets_the_old_one():
    conv = Conversation("think")
    conv.transcript.reset([1, 2, 3], 3)
    conv.turn_started(100.0)
    conv.adopt_loaded(SessionIdentity(session_id="a" * 40, activity=True))
    conv.after_compaction()
    loaded = conv.identity
    old = conv.reset_new()
    assert old is loaded and old.session_id == "a" * 40 and old.dirty
    assert conv.identity == SessionIdentity() and conv.identity is not loaded
    assert dict(conv.turn_times) == {}
    assert not conv.jobs_update_due
    assert conv.pending_results(lambda: "never asked") == []


def test_turns_are_timed_and_cut():
    conv = Conversation("think")
    conv.transcript.reset([9, 9], 2)
    conv.turn_started(10.0)
    assert conv.turn_at == 2
    conv.transcript.extend([5, 6, 7])
    conv.turn_started(20.0)
    conv.transcript.extend([8, 8])
    assert dict(conv.turn_times) == {2: 10.0, 5: 20.0} and conv.turn_at == 5
    kept = conv.cut(5)
    assert kept == [9, 9, 5, 6, 7] and conv.transcript.ids == kept and conv.transcript.system_len == 2
    assert dict(conv.turn_times) == {2: 10.0}
    assert conv.cut(1) == [9] and conv.transcript.system_len == 1 and dict(conv.turn_times) == {}
    conv.turn_started(30.0)
    conv.forget_turn_times()
    assert dict(conv.turn_times) == {}


def test_the_job_update_after_a_compaction_is_observed_once_and_kept_until_delivered():
    conv = Conversation("think")
    calls: list[int] = []

    def observe() -> str:
        calls.append(1)
        return "job 1 running"

    assert conv.pending_results(observe) == [] and calls == []
    conv.after_compaction()
    assert conv.jobs_update_due and conv.identity.dirty
    assert conv.pending_results(observe) == ["job 1 running"]
    assert conv.pending_results(observe) == ["job 1 running"] and calls == [1]  # a re-render: same text
    conv.results_delivered()
    assert conv.pending_results(observe) == [] and calls == [1]
    conv.after_compaction()
    assert conv.pending_results(lambda: "") == []  # no jobs: nothing to say
    conv.after_compaction()
    conv.forget_pending_results()
    assert not conv.jobs_update_due and conv.pending_results(observe) == [] and calls == [1]


def test_identity_think_mode_plan_and_todos():
    conv = Conversation("think-max")
    assert conv.think_mode == "think-max" and conv.plan_return == "ask" and conv.todo_list == ()
    fork = SessionIdentity(title=b"x (fork)")
    conv.become_fork(fork)
    assert conv.identity is fork
    conv.use_think_mode("nothink")
    assert conv.think_mode == "nothink"
    conv.enter_plan("auto")
    assert conv.plan_return == "auto"
    items = (TodoItem("a", "pending"),)
    assert conv.show_todos(items) and conv.todo_list == items
    assert not conv.show_todos((TodoItem("a", "pending"),))
    assert conv.show_todos(()) and conv.todo_list == ()


def test_system_prefix_and_status_figures():
    conv = Conversation("think")
    system, skills = SystemText("rules", "agents"), SkillSet()
    conv.system_rendered(system, skills, is_max=True)
    assert conv.system is system and conv.skills is skills and conv.system_is_max
    ids = [1, 2, 3]
    conv.system_kept(ids)
    ids.append(4)  # the caller's list is not the kept one
    assert list(conv.system_ids) == [1, 2, 3]
    conv.decoding(16, 8.0, greedy=True)
    assert (conv.generated, conv.decode_tps, conv.greedy) == (16, 8.0, True)
    conv.decoding(20)  # no new rate measured: the last one stays
    assert (conv.generated, conv.decode_tps, conv.greedy) == (20, 8.0, True)
    conv.turn_over()
    assert (conv.generated, conv.decode_tps, conv.greedy) == (0, 8.0, False)
    conv.prefilling(50.0)
    assert conv.prefill_tps == 50.0
    conv.prefilled(120, 60.0)
    assert (conv.last_prefilled, conv.prefill_tps) == (120, 60.0)
    conv.prefilled(0)
    assert (conv.last_prefilled, conv.prefill_tps) == (0, 60.0)


# ---------------------------------------------------------------------- typed commands


def test_every_command_has_its_own_name_and_failure_wording():
    commands = typing.get_args(ops.WorkerCommand)
    names = [c.name for c in commands]
    assert len(set(names)) == len(names) == 10
    assert {c.name: c.failure for c in commands if c.failure != c.name} == {
        "new": "new session", "compact": "compaction"}
    assert ops.Rewind().number is None and ops.Rewind().mode == "both"
    with pytest.raises(AttributeError):
        ops.LoadSession("ab").prefix = "cd"  # type: ignore[misc]


def test_the_worker_dispatches_each_command_to_its_handler():
    calls: list[tuple[object, ...]] = []

    def record(name: str, result: object = None):
        def handler(*args: object) -> object:
            calls.append((name, *args))
            return result
        return handler

    fake = SimpleNamespace(**{n: record(n) for n in ("cmd_turn", "cmd_save", "cmd_load", "cmd_new", "cmd_compact",
                                                      "cmd_rewind", "cmd_fork", "cmd_delete", "cmd_strip")},
                           confirm_leave=record("confirm_leave", True))
    run = Worker.run
    leave = [run(fake, c) for c in (  # type: ignore[arg-type]
        ops.Turn("hi", queued=True), ops.Save("t"), ops.LoadSession("ab"), ops.NewSession(), ops.Compact(),
        ops.Rewind(), ops.Rewind(2, "code"), ops.Fork("f"), ops.DeleteSession("cd"), ops.Strip("ef"), ops.Quit())]
    assert calls == [("cmd_turn", "hi", True), ("cmd_save", "t"), ("cmd_load", "ab"), ("cmd_new",),
                     ("cmd_compact",), ("cmd_rewind", None, "both"), ("cmd_rewind", 2, "code"), ("cmd_fork", "f"),
                     ("cmd_delete", "cd"), ("cmd_strip", "ef"), ("confirm_leave",)]
    assert leave == [False] * 10 + [True]  # only a /quit the user did not cancel ends the worker
    fake.confirm_leave = record("confirm_leave", False)
    assert run(fake, ops.Quit()) is False  # type: ignore[arg-type]


def test_changes_saves_and_titles_on_the_identity():
    from ds4agent.sessions.entries import SavedSession

    conv = Conversation("think")
    conv.changed()
    assert conv.identity.dirty and conv.identity.activity
    conv.adopt_loaded(SessionIdentity(session_id="b" * 40, legacy_path="/old.kv", dirty=True, activity=True))
    saved = SavedSession(id="c" * 40, path=Path("/s.kv"), title=b"T", created_at=7, n_tokens=3, deleted=())
    conv.saved(saved, forked_from="b" * 40)
    i = conv.identity
    assert (i.session_id, i.title, i.created_at, i.legacy_path, i.forked_from, i.dirty, i.activity) == (
        "c" * 40, b"T", 7, None, "b" * 40, False, True)
    conv.saved(SavedSession(id="d" * 40, path=Path("/s.kv"), title=b"U", created_at=8, n_tokens=3, deleted=()))
    assert (conv.identity.session_id, conv.identity.forked_from) == ("d" * 40, "b" * 40)  # parent kept
    conv.name_if_untitled(lambda: pytest.fail("a titled conversation derives no title"))
    assert conv.identity.title == b"U"
    conv.reset_new()
    conv.name_if_untitled(lambda: b"first request")
    assert conv.identity.title == b"first request"


def test_the_undo_log_is_made_at_the_first_write_and_follows_the_turn(tmp_path):
    conv = Conversation("think")
    assert conv.identity.undo is None
    conv.transcript.reset([1, 2, 3], 3)
    conv.turn_started(1.0)
    log = conv.undo_log(tmp_path)
    assert conv.identity.undo is log and log.root == tmp_path and log.at == 3
    conv.transcript.extend([4, 5])
    conv.turn_started(2.0)
    assert conv.undo_log(tmp_path) is log and log.at == 5  # the same log, under the new turn


def test_subagent_records_run_and_loaded():
    conv = Conversation("think")
    a, b = SubagentRecord("a", "g", "s", "t", "done"), SubagentRecord("b", "g", "s", "t", "budget")
    conv.subagent_ran(a)
    assert conv.identity.subagents == [a]
    conv.subagents_loaded([b])
    assert conv.identity.subagents == [b]
    conv.subagents_loaded([])
    assert conv.identity.subagents == []
