"""/rewind, /fork and undo log with the scripted engine, the real store and real tools."""

from __future__ import annotations

import json

from ds4agent.agent import events as ev
from ds4agent.protocol import template
from ds4agent.sessions.index import SessionIndex
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply


def _three_turns(tmp_path, **kw):
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t"), reply("A3", think="t")],
                           **kw)
    starts = []
    for text in ("first question", "second\nquestion", "third question"):
        starts.append(len(h.ids))
        h.turn(text)
    return h, starts


def test_rewind_lists_user_turns_and_cuts_the_conversation(tmp_path, tools):
    h, starts = _three_turns(tmp_path, tools=tools)
    lst = of(h.command(h.agent.rewind_points), ev.RewindList)[0]
    assert [(p.number, p.preview, p.tokens) for p in lst.points] == [
        (1, "first question", starts[0]), (2, "second", starts[1]), (3, "third question", starts[2])]
    assert all(p.time > 0 for p in lst.points)
    assert "bash" in lst.note
    before_two = h.ids[:starts[1]]
    evs = h.command(lambda: h.agent.rewind(2, "chat"))
    done = of(evs, ev.Rewound)[0]
    assert (done.number, done.mode, done.prompt, done.tokens) == (2, "chat", "second\nquestion", starts[1])
    assert done.prefilled == 0
    assert h.ids == before_two and h.live == tuple(before_two)
    assert of(evs, ev.Notice)[-1].text == f"rewound to turn 2 (conversation): {starts[1]} tokens, 0 prefilled"
    assert h.worker.conv.identity.dirty
    # The list now ends at turn 1, and the conversation goes on from there.
    assert len(of(h.command(h.agent.rewind_points), ev.RewindList)[0].points) == 1
    h.engine.add(reply("again", think="t"))
    h.turn("second question, edited")
    user = template.render(template.user_turn_pieces("second question, edited", think_mode="think"))
    assert h.ids[starts[1]:starts[1] + len(user)] == user
    h.stop()


def test_rewind_rejects_bad_turns_and_modes(tmp_path, tools):
    h = AgentHarness.build(tmp_path, tools=tools)
    assert of(h.command(lambda: h.agent.rewind(1, "chat")), ev.Error)[0].text == \
        "nothing to rewind: the session has no user turn yet"
    h.engine.add(reply("A", think="t"))
    h.turn("q")
    assert of(h.command(lambda: h.agent.rewind(3, "chat")), ev.Error)[0].text == "no user turn 3 (1..1)"
    assert of(h.command(lambda: h.agent.rewind(1, "sideways")), ev.Error)[0].text == \
        "unknown rewind mode: sideways (both, chat, code, fork)"
    h.stop()


def _writer(tmp_path, answer):
    script = [
        reply(think="t", calls=[("write", {"path": "a.txt", "content": "one\n"})]), reply("ok1", think="t"),
        reply(think="t", calls=[("write", {"path": "a.txt", "content": "two\n"}),
                                ("write", {"path": "new.txt", "content": "fresh\n"})]), reply("ok2", think="t"),
    ]
    h = AgentHarness.build(tmp_path, script, answer=answer)
    h.turn("write one")
    h.turn("write two")
    work = tmp_path / "work"
    assert (work / "a.txt").read_text() == "two\n" and (work / "new.txt").exists()
    return h, work


def test_code_rewind_restores_files_and_removes_created_ones(tmp_path):
    h, work = _writer(tmp_path, answer=lambda e: "n")
    n_ids = len(h.ids)
    evs = h.command(lambda: h.agent.rewind(2, "code"))
    done = of(evs, ev.Rewound)[0]
    assert sorted(done.restored) == sorted([str(work / "a.txt"), str(work / "new.txt")])
    assert done.refused == ()
    assert (work / "a.txt").read_text() == "one\n" and not (work / "new.txt").exists()
    assert len(h.ids) == n_ids  # code only: the conversation is untouched
    # Turn 1 created a.txt: going back before it removes it.
    evs = h.command(lambda: h.agent.rewind(1, "both"))
    assert not (work / "a.txt").exists()
    assert of(evs, ev.Rewound)[0].tokens == len(h.worker.conv.system_ids)
    h.stop()


def test_code_rewind_refuses_files_changed_outside_unless_confirmed(tmp_path):
    answers = []

    def answer(e):
        if isinstance(e, ev.Question) and e.kind == "rewind":
            answers.append(e.question)
            return answers_wanted.pop(0)
        return "y"

    answers_wanted = ["n", "y"]
    h, work = _writer(tmp_path, answer)
    (work / "a.txt").write_text("edited by hand\n")
    done = of(h.command(lambda: h.agent.rewind(2, "code")), ev.Rewound)[0]
    assert done.restored == (str(work / "new.txt"),)
    assert done.refused == (f"{work / 'a.txt'}: changed since the agent last wrote it",)
    assert (work / "a.txt").read_text() == "edited by hand\n" and not (work / "new.txt").exists()
    assert "a.txt: changed since the agent last wrote it" in answers[0]
    # Asked again and confirmed: the hand edit is overwritten with the undo copy.
    done = of(h.command(lambda: h.agent.rewind(2, "code")), ev.Rewound)[0]
    assert done.restored == (str(work / "a.txt"),) and done.refused == ()
    assert (work / "a.txt").read_text() == "one\n"
    h.stop()


def test_fork_leaves_the_original_untouched_and_later_saves_go_to_the_fork(tmp_path, tools):
    h, starts = _three_turns(tmp_path, tools=tools)
    original = of(h.command(h.agent.save), ev.SessionSaved)[0]
    original_bytes = (tmp_path / "kv" / f"{original.id}.kv").read_bytes()
    evs = h.command(lambda: h.agent.fork("my fork"))
    forked = of(evs, ev.SessionSaved)[0]
    assert forked.id != original.id and forked.title == "my fork"
    assert of(evs, ev.Notice)[-1].text == f"forked {forked.short_id} from {original.short_id}"
    h.engine.add(reply("A4", think="t"))
    h.turn("fourth")
    again = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert again.id == forked.id and again.tokens == len(h.ids)
    # The original's text is a prefix of the fork's, yet it is not deleted as an ancestor.
    assert (tmp_path / "kv" / f"{original.id}.kv").read_bytes() == original_bytes
    idx = SessionIndex(tmp_path / "kv")
    assert idx.get(forked.id).forked_from == original.id
    assert idx.get(original.id).cwd == str(tmp_path / "work")
    infos = {s.id: s for s in of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions}
    assert infos[forked.id].forked_from == original.id[:8] and infos[original.id].forked_from == ""
    h.stop()


def test_rewind_fork_saves_the_earlier_point_as_a_new_session(tmp_path, tools):
    h, starts = _three_turns(tmp_path, tools=tools)
    assert of(h.command(lambda: h.agent.fork("")), ev.SessionSaved)  # (a fork of a fork is fine too)
    h.stop()
    h = AgentHarness.build(tmp_path / "b", [reply("A1", think="t"), reply("A2", think="t")], tools=tools)
    assert of(h.command(lambda: h.agent.fork("x")), ev.Error)[0].text == "fork failed: nothing to fork yet"
    starts = []
    for text in ("first question", "second\nquestion"):
        starts.append(len(h.ids))
        h.turn(text)
    full = len(h.ids)
    # Unsaved: "fork from here" saves the whole conversation first, then the fork.
    evs = h.command(lambda: h.agent.rewind(2, "fork"))
    original, forked = of(evs, ev.SessionSaved)
    assert original.tokens == full
    assert forked.tokens == starts[1] and forked.title == "first question (fork)"
    assert of(evs, ev.Rewound)[0].prompt == "second\nquestion"
    assert (tmp_path / "b" / "kv" / f"{original.id}.kv").exists()
    h.stop()


def test_deleting_a_session_removes_its_undo_log_and_index_entry(tmp_path):
    h, work = _writer(tmp_path, answer=lambda e: "n")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    key = h.worker.conv.identity.undo.key
    ckdir = tmp_path / "checkpoints" / key
    log = [json.loads(line) for line in (ckdir / "log.jsonl").read_text().splitlines()]
    assert [(e["path"], e["before"] is None) for e in log] == [
        (str(work / "a.txt"), True), (str(work / "a.txt"), False), (str(work / "new.txt"), True)]
    assert SessionIndex(tmp_path / "kv").get(saved.id).undo == key
    h.agent.delete_session(saved.short_id)
    assert not ckdir.exists() and SessionIndex(tmp_path / "kv").get(saved.id) is None
    h.stop()


def test_retitling_a_fork_replaces_the_fork_file_only_and_lists_beside_unreadable_files(tmp_path, tools):
    # /save TITLE renames (unreadable files listed) meets forks: the renamed
    # fork's old file goes, the original stays, the listing shows both kinds of note.
    h, starts = _three_turns(tmp_path, tools=tools)
    original = of(h.command(h.agent.save), ev.SessionSaved)[0]
    forked = of(h.command(lambda: h.agent.fork("  my   fork ")), ev.SessionSaved)[0]
    assert forked.title == "my fork"  # normalised like a /save title
    renamed = of(h.command(lambda: h.agent.save("renamed fork")), ev.SessionSaved)[0]
    kv = tmp_path / "kv"
    assert renamed.id != forked.id and not (kv / f"{forked.id}.kv").exists()
    assert (kv / f"{original.id}.kv").exists() and (kv / f"{renamed.id}.kv").exists()
    assert SessionIndex(kv).get(renamed.id).forked_from == original.id
    bad = kv / ("ab" + "0" * 38 + ".kv")
    bad.write_bytes(b"KVC\x01 broken")
    listed = {s.short_id: (s.title, s.forked_from, s.unreadable)
              for s in of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions}
    assert listed == {
        original.id[:8]: ("first question", "", ""),
        renamed.id[:8]: ("renamed fork", original.id[:8], ""),
        "ab000000": ("(unreadable session: invalid KV header)", "", "invalid KV header"),
    }
    h.stop()


def test_a_fork_kept_as_a_bookmark_survives_a_later_save_of_its_parent(tmp_path, tools):
    h, _ = _three_turns(tmp_path, tools=tools)
    parent = of(h.command(h.agent.save), ev.SessionSaved)[0]
    bookmark = of(h.command(lambda: h.agent.fork("bookmark")), ev.SessionSaved)[0]
    bookmark_bytes = (tmp_path / "kv" / f"{bookmark.id}.kv").read_bytes()
    # Back to the parent, one more turn, saved: the bookmark's text is now a strict prefix of it.
    assert of(h.command(lambda: h.agent.load(parent.id[:8])), ev.SessionLoaded)
    h.engine.add(reply("A4", think="t"))
    h.turn("fourth")
    again = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert again.id == parent.id and again.tokens > bookmark.tokens
    assert (tmp_path / "kv" / f"{bookmark.id}.kv").read_bytes() == bookmark_bytes
    listed = {s.id for s in of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions}
    assert listed == {parent.id, bookmark.id}
    h.stop()
