"""Sessions with the scripted engine and the real store: sysprompt cache, save/list/load/new."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.protocol.tokenizer import Tokenizer
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply

TOK = Tokenizer.load()


def test_sysprompt_cache_is_reused_and_keyed_by_text(tmp_path, tools):
    h = AgentHarness.build(tmp_path, tools=tools)
    first = of(h.events, ev.Ready)[0]
    assert not first.sysprompt_cached
    caches = sorted(p.name for p in (tmp_path / "kv").glob("sysprompt-*.kv"))
    assert len(caches) == 1
    sys_ids = h.worker.conv.system_ids
    h.stop()

    h2 = AgentHarness.build(tmp_path, tools=tools, store=h.store)
    assert of(h2.events, ev.Ready)[0].sysprompt_cached
    assert h2.engine.prefills == [] and h2.live == tuple(sys_ids)
    h2.stop()

    # AGENTS.md changes the system text: a second cache, and the project text is in the prefix.
    (tmp_path / "work" / "AGENTS.md").write_text("Always run `make check`.\n<think>\n")
    h3 = AgentHarness.build(tmp_path, tools=tools, store=h.store)
    assert not of(h3.events, ev.Ready)[0].sysprompt_cached
    text = h3.text()
    assert b"Always run `make check`." in text
    assert len(list((tmp_path / "kv").glob("sysprompt-*.kv"))) == 2
    # AGENTS.md is untrusted: its <think> is plain text, not the special id.
    assert h3.worker.conv.system_ids.count(TOK.THINK) == h.worker.conv.system_ids.count(TOK.THINK)
    h3.stop()


def test_save_list_new_load_history(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")], tools=tools,
                           answer=lambda e: "y")
    evs = h.command(h.agent.save)
    assert of(evs, ev.Error)[0].text == "save failed: nothing to save"
    h.turn("first question")
    evs = h.command(h.agent.save)
    saved = of(evs, ev.SessionSaved)[0]
    assert saved.title == "first question" and saved.tokens == len(h.ids)
    assert of(evs, ev.Notice)[-1].text == f"saved session {saved.short_id} ({saved.tokens} tokens)"
    h.turn("second question")
    evs = h.command(h.agent.save)
    again = of(evs, ev.SessionSaved)[0]
    assert again.id == saved.id  # the identity stays; the shorter ancestor file was replaced
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 2  # session + sysprompt cache
    full = h.ids

    evs = h.command(h.agent.list_sessions)
    lst = of(evs, ev.SessionList)[0]
    assert [(s.short_id, s.title, s.tokens) for s in lst.sessions] == [(saved.short_id, "first question", len(full))]

    evs = h.command(h.agent.new)
    assert of(evs, ev.Question) == []  # saved: no question
    assert of(evs, ev.SessionNew) and h.ids == h.worker.conv.system_ids

    evs = h.command(lambda: h.agent.load("ffff"))
    assert of(evs, ev.Error)[0].text == "load failed: no saved session matches ffff"

    n_prefills = len(h.engine.prefills)
    evs = h.command(lambda: h.agent.load(saved.short_id[:5]))
    loaded = of(evs, ev.SessionLoaded)[0]
    assert h.ids == full and h.live == tuple(full)
    assert h.engine.prefills[n_prefills:] == []
    kinds = [(i.kind, i.text) for i in loaded.history if i.kind in ("user", "text")]
    assert kinds == [("user", "first question"), ("text", "A1"), ("user", "second question"), ("text", "A2")]

    evs = h.command(lambda: h.agent.history(1))
    hist = of(evs, ev.History)[0]
    assert [(i.kind, i.text) for i in hist.items if i.kind == "user"] == [("user", "second question")]
    assert hist.turns == 1
    assert of(h.command(lambda: h.agent.history(5)), ev.History)[0].turns == 2  # all there is
    h.stop()


def test_save_question_on_new_when_dirty(tmp_path, tools):
    answers = iter(["c", "y"])
    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools, answer=lambda e: next(answers))
    h.turn("hello")
    before = h.ids
    evs = h.command(h.agent.new)
    q = of(evs, ev.Question)
    assert [x.kind for x in q] == ["save"] and q[0].question == "Save current session?"
    assert h.ids == before and not of(evs, ev.SessionNew)  # cancelled
    evs = h.command(h.agent.new)
    assert of(evs, ev.SessionSaved) and of(evs, ev.SessionNew)
    assert h.ids == h.worker.conv.system_ids
    assert not of(evs, ev.Status)[-1].unsaved
    h.stop()


def test_load_of_an_unknown_prefix_fails_before_the_save_question(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools, answer=lambda e: "n")
    h.turn("hello")
    before = h.ids
    evs = h.command(lambda: h.agent.load("ffff"))
    assert of(evs, ev.Question) == []
    assert of(evs, ev.Error)[0].text == "load failed: no saved session matches ffff"
    assert h.ids == before and of(h.command(h.agent.new), ev.Question)[0].kind == "save"  # still unsaved
    h.stop()


def test_save_while_busy_is_deferred_to_turn_end(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("some words here", think="t")], tools=tools)
    h.at_step(2, h.agent.save)
    evs = h.turn("q")
    names = [type(e).__name__ for e in evs if isinstance(e, (ev.Notice, ev.TurnEnded, ev.SessionSaved))]
    assert names.index("TurnEnded") < names.index("SessionSaved")
    assert any(e.text == "save scheduled at next safe point" for e in of(evs, ev.Notice))
    assert of(evs, ev.SessionSaved)[0].tokens == len(h.ids) == len(h.live)
    h.stop()


def test_new_failure_is_readable_and_think_mode_switches(tmp_path, tools):
    # Slash commands are parsed by the front ends (ds4agent/ui/commands.py, tested in tests/ui);
    # here the facade methods they call.
    h = AgentHarness.build(tmp_path, tools=tools)

    def broken() -> None:
        raise OSError("disk full")

    h.worker.cmd_new = broken
    evs = h.command(h.agent.new)
    assert of(evs, ev.Error)[0].text == "new session failed: disk full"
    assert not h.agent.busy  # and the agent is idle again
    evs = h.command(lambda: h.agent.set_think_mode("nothink"))
    assert of(evs, ev.Status)[-1].think_mode == "nothink"
    h.engine.add(reply("B", think=None))
    h.turn("x")
    assert h.text().endswith("<｜Assistant｜></think>B<｜end▁of▁sentence｜>".encode())
    h.stop()


def test_delete_session_and_trace_file(tmp_path, tools):
    trace = tmp_path / "trace.log"
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {"x": "1"})]), reply("Hi.", think="t")],
                           tools=tools, trace=trace)
    h.turn("hello")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert h.agent.delete_session(saved.short_id) == saved.path
    assert of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions == ()
    h.stop()
    lines = trace.read_text().splitlines()
    import re

    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ", line) for line in lines)
    assert any(line.endswith("worker start") for line in lines)
    hi = TOK.encode_untrusted("Hi")[0]
    assert any(" gen " in line and f" {hi} 2 \"Hi\" 4869" in line for line in lines)
    assert any(" user " in line and '"hello"' in line for line in lines)
    assert any(line.endswith("dsml done: 1 call(s): alpha") for line in lines)


def test_non_utf8_title_keeps_the_session_identity_across_load_save_and_resume(tmp_path, tools):
    """A ds4 file may hold a title that is not UTF-8; the identity is SHA-1 over its exact bytes,
    so the agent keeps the bytes (a str round trip would turn them into U+FFFD and re-save the
    session under a new name, leaving the old file behind)."""
    from ds4agent.sessions.kvc import session_identity

    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")], tools=tools)
    h.turn("first")
    eng = h.worker.engine
    title = b"caf\xe9 \xff title"
    made = h.store.save_session(TOK.decode_bytes(h.ids), h.worker.session.export_state(),
                                shape=eng.payload_shape(), quant_bits=eng.quant_bits, title=title,
                                created_at=1_760_000_000)
    assert made.id == session_identity(title, 1_760_000_000)
    h.worker.conv.identity.dirty = False
    loaded = of(h.command(lambda: h.agent.load(made.id[:8])), ev.SessionLoaded)[0]
    assert loaded.title == "caf\ufffd \ufffd title"  # shown with U+FFFD ...
    h.turn("second")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.id == made.id  # ... but saved under the same name: the bytes were kept
    assert [p.name for p in (tmp_path / "kv").glob("*.kv") if not p.name.startswith("sysprompt")] \
        == [made.id + ".kv"]
    h.engine.add(reply("A3", think="t"))
    h.turn("third")
    h.stop()  # unsaved turn: the journal keeps it, title bytes included

    h2 = AgentHarness.build(tmp_path, tools=tools, store=h.store, answer=lambda e: "y")
    assert of(h2.events, ev.SessionLoaded)[0].resumed
    h2.engine.add(reply("A4", think="t"))
    h2.turn("fourth")
    again = of(h2.command(h2.agent.save), ev.SessionSaved)[0]
    assert again.id == made.id
    h2.stop()


def test_sysprompt_cache_is_rebuilt_for_another_quant_or_context(tmp_path, tools):
    """kvc-format.md §12.2: the cache is keyed by the exact text, and the load chain refuses a
    file of another quantisation or context size: the agent then prefills and overwrites it."""
    h = AgentHarness.build(tmp_path, tools=tools, ctx=8192)
    h.stop()
    for quant, ctx in ((2, 8192), (2, 4096)):
        h = AgentHarness.build(tmp_path, tools=tools, store=h.store, ctx=ctx, start=False)
        h.engine.quant_bits = quant
        h.start()
        assert not of(h.events, ev.Ready)[0].sysprompt_cached
        assert "Updating system prompt cache..." in [n.text for n in of(h.events, ev.Notice)]
        assert h.engine.prefills == [len(h.worker.conv.system_ids)]
        h.stop()
    again = AgentHarness.build(tmp_path, tools=tools, store=h.store, ctx=4096, start=False)
    again.engine.quant_bits = 2
    again.start()
    assert of(again.events, ev.Ready)[0].sysprompt_cached and again.engine.prefills == []
    again.stop()


def test_legacy_file_is_resaved_under_a_title_identity_and_deleted(tmp_path, tools, monkeypatch):
    """kvc-format.md §12.5: a file without a title trailer (name = SHA1(text)) loads with a derived
    title and its header's created_at, and the next save replaces it by `<SHA1(title||created_at)>.kv`."""
    from ds4agent.sessions.kvc import session_identity
    from tests.support.untitled_session import untitled_session

    h, legacy = untitled_session(tmp_path, tools, monkeypatch, "legacy question")
    loaded = of(h.command(lambda: h.agent.load(legacy.stem[:10])), ev.SessionLoaded)[0]
    assert loaded.title == "legacy question" and loaded.prefilled == 0
    h.turn("more")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.id == session_identity(b"legacy question", 1_700_000_000)
    assert not legacy.exists() and (tmp_path / "kv" / f"{saved.id}.kv").exists()
    h.stop()


def test_stripped_session_is_rebuilt_from_its_text_and_prefilled(tmp_path, tools):
    """kvc-format.md §12.6: payload_bytes = 0 -> the text is re-tokenised (rendered-chat rules),
    prefilled, and the agent says so; a later save writes the full state under the same name."""
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")], tools=tools)
    h.turn("strip me")
    eng, ids = h.worker.engine, h.ids
    stripped = h.store.save_session(TOK.decode_bytes(ids), None, shape=None, quant_bits=eng.quant_bits,
                                    n_tokens=len(ids), ctx=eng.ctx, created_at=1_750_000_000)
    h.worker.conv.identity.dirty = False
    h.command(h.agent.new)
    evs = h.command(lambda: h.agent.load(stripped.id[:8]))
    loaded = of(evs, ev.SessionLoaded)[0]
    assert h.ids == TOK.rebuild_from_text(TOK.decode_bytes(ids)) and h.live == tuple(h.ids)
    assert loaded.prefilled == len(h.ids) - len(h.worker.conv.system_ids)  # the system prefix KV was live
    assert f"stripped session: rebuilding {len(h.ids):,} tokens" in [n.text for n in of(evs, ev.Notice)]
    h.turn("next")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.id == stripped.id and h.store.resolve(saved.id).header.payload_bytes > 0
    h.stop()


def test_save_with_a_title_sets_the_sessions_title_everywhere(tmp_path, tools, monkeypatch):
    import io

    from ds4agent.cli import parse
    from ds4agent.commands import kv

    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t"), reply("A3", think="t")],
                           tools=tools)
    h.turn("first question")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert saved.title == "first question"

    def sessions() -> list[tuple[str, bytes]]:
        return [(i.entry.id, i.title) for i in h.store.list_sessions()]

    # A title given to /save replaces the derived one: a new name (the identity is SHA-1 of title
    # and created_at), the file under the old name is replaced, the title is in the trailer.
    titled = of(h.command(lambda: h.agent.save("  Fix the\tflaky   test ")), ev.SessionSaved)[0]
    assert titled.title == "Fix the flaky test" and titled.id != saved.id
    assert sessions() == [(titled.id, b"Fix the flaky test")]
    assert of(h.command(h.agent.list_sessions), ev.SessionList)[0].sessions[0].title == "Fix the flaky test"
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", "1000")  # `kv ls` fits the terminal; whole titles here
    assert kv.main(parse(["--kv-dir", str(tmp_path / "kv"), "kv", "ls"]), out=out) == 0
    assert "Fix the flaky test" in out.getvalue() and "first question" not in out.getvalue()

    # A later /save without a title keeps it; a blank title is no title.
    h.turn("second question")
    again = of(h.command(lambda: h.agent.save("   ")), ev.SessionSaved)[0]
    assert (again.id, again.title) == (titled.id, "Fix the flaky test")

    # While busy the save (and its title) waits for the end of the turn.
    assert h.agent.submit("third question")
    h.agent.save("Renamed while busy")
    evs = h.settle()
    assert "save scheduled at next safe point" in [n.text for n in of(evs, ev.Notice)]
    last = of(evs, ev.SessionSaved)[-1]
    assert last.title == "Renamed while busy" and last.tokens == len(h.ids)
    assert sessions() == [(last.id, b"Renamed while busy")]
    h.stop()


def test_an_unusable_crash_journal_directory_is_named(tmp_path, tools):
    (tmp_path / "journal").write_text("a file where the journal directory should be")
    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools)
    evs = h.events + h.turn("hello")
    warnings = [n.text for n in of(evs, ev.Notice) if n.text.startswith("crash journal disabled")]
    assert warnings == [f"crash journal disabled: cannot use {tmp_path / 'journal'}: File exists"] or \
        warnings == [f"crash journal disabled: cannot use {tmp_path / 'journal'}: Not a directory"]
    h.stop()


def test_list_shows_this_models_sessions_newest_first_with_the_stripped_mark(tmp_path, tools):
    """/list (and the picker, which gets the same event) shows only sessions whose header model_id
    is the loaded model's, newest last_used first (created_at where last_used is 0), and marks the
    stripped ones."""
    import struct

    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools)
    h.turn("full one")
    full = of(h.command(h.agent.save), ev.SessionSaved)[0]
    eng = h.worker.engine
    here = int(getattr(eng, "model_id", 0))

    def stripped(title: str, *, model_id: int, created: int, used: int) -> str:
        text = TOK.decode_bytes(h.worker.conv.system_ids) + f"<｜User｜>{title}<｜Assistant｜></think>".encode()
        return h.store.save_session(text, None, shape=None, quant_bits=eng.quant_bits, title=title,
                                    n_tokens=len(TOK.rebuild_from_text(text)), ctx=eng.ctx, model_id=model_id,
                                    created_at=created, now=used).id

    old = stripped("old one", model_id=here, created=1_700_000_000, used=1_700_000_100)
    newer = stripped("newer one", model_id=here, created=1_700_000_050, used=1_700_000_500)
    other = stripped("other model", model_id=here + 1, created=1_700_000_000, used=1_800_000_000)
    never_used = stripped("never used", model_id=here, created=1_700_000_300, used=1_700_000_300)
    path = h.store.resolve(never_used).path
    with open(path, "r+b") as f:  # a header without last_used: ordered by created_at
        f.seek(32)
        f.write(struct.pack("<Q", 0))

    lst = of(h.command(h.agent.list_sessions), ev.SessionList)[0]
    rows = [(s.id, s.title, s.stripped) for s in lst.sessions]
    assert other not in [r[0] for r in rows]
    assert rows == [(full.id, "full one", False), (newer, "newer one", True),
                    (never_used, "never used", True), (old, "old one", True)]
    assert [s.size_bytes for s in lst.sessions] == [h.store.resolve(r[0]).file_size for r in rows]
    from ds4agent.ui import fmt

    lines = fmt.session_list_lines(lst.directory, lst.sessions, now=1_700_000_600)
    assert lines[3].startswith(f"  {never_used[:8]} (5m ago) never used  [") and lines[3].endswith(", stripped]")
    assert "stripped" not in lines[1]
    h.stop()


def test_an_interrupted_rebuild_of_a_stripped_session_keeps_the_session_and_prefills_the_rest_later(
        tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")], tools=tools)
    h.turn("strip me")
    eng, ids = h.worker.engine, h.ids
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    assert of(h.command(lambda: h.agent.strip(saved.short_id)), ev.Error) == []
    h.command(h.agent.new)
    eng.chunk = 2
    session = h.worker.session
    real = session.sync

    def sync(tokens, *, progress=None, should_stop=None, **rest):
        def interrupt_after_first_chunk(done, total):
            progress(done, total)
            h.agent.interrupt()  # Esc while the rebuild prefills
        return real(tokens, progress=interrupt_after_first_chunk if progress else None, should_stop=should_stop,
                    **rest)

    session.sync = sync
    evs = h.command(lambda: h.agent.load(saved.short_id))
    session.sync = real
    assert of(evs, ev.Error) == []
    loaded = of(evs, ev.SessionLoaded)[0]
    assert loaded.id == saved.id and loaded.prefilled == 0
    assert h.ids == ids and len(h.live) < len(ids) and h.live == tuple(ids[: len(h.live)])
    notice = [n.text for n in of(evs, ev.Notice) if n.text.startswith("rebuild interrupted")]
    assert notice == [f"rebuild interrupted at {len(h.live):,} of {len(ids):,} tokens; the rest is prefilled "
                      "with the next message"]
    h.turn("next")  # the rest of the text and the new turn are prefilled; the turn runs
    # (the live KV ends before the turn's closing EOS: it is evaluated with the next prefill)
    assert h.ids[: len(ids)] == ids and len(h.live) > len(ids) and h.live == tuple(h.ids[: len(h.live)])
    assert b"A2" in h.text(len(ids))
    h.stop()


def test_two_instances_saving_one_session_lose_no_turn(tmp_path, tools):
    """Both resume the same session, both add a turn and save: the second finds the file
    changed since it loaded it and saves a fork beside it; the first's turn stays in its file."""
    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools)
    h.turn("shared start")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    h.stop()
    one = AgentHarness.build(tmp_path, [reply("from one", think="t")], tools=tools, store=h.store)
    two = AgentHarness.build(tmp_path, [reply("from two", think="t")], tools=tools, store=h.store)
    for inst in (one, two):
        assert of(inst.command(lambda i=inst: i.agent.load(saved.short_id)), ev.SessionLoaded)
    one.turn("turn of one")
    two.turn("turn of two")
    first = of(one.command(one.agent.save), ev.SessionSaved)[0]
    evs = two.command(two.agent.save)
    second = of(evs, ev.SessionSaved)[0]
    assert first.id == saved.id and second.id != saved.id
    assert any("saved by another ds4agent" in n.text and second.short_id in n.text for n in of(evs, ev.Notice))
    files = {p.stem: p.read_bytes() for p in (tmp_path / "kv").glob("*.kv") if not p.name.startswith("sysprompt")}
    assert b"turn of one" in files[saved.id] and b"turn of two" not in files[saved.id]
    assert b"turn of two" in files[second.id]
    # A later save of the first instance still writes its own file (it wrote the current version).
    one.turn("again one")
    assert of(one.command(one.agent.save), ev.SessionSaved)[0].id == saved.id
    one.stop()
    two.stop()


def test_a_stripped_text_longer_than_the_context_is_refused_before_it_is_read(tmp_path, tools, monkeypatch):
    import tracemalloc

    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools)
    eng = h.worker.engine
    limit = h.worker.settings.ctx * TOK.max_token_bytes
    text = b"x" * (limit + 1)
    stripped = h.store.save_session(text, None, shape=None, quant_bits=eng.quant_bits, n_tokens=10, ctx=eng.ctx,
                                    created_at=1_750_000_000)
    del text
    read = []
    monkeypatch.setattr(TOK, "rebuild_from_text", lambda b: read.append(len(b)) or [])
    tracemalloc.start()
    evs = h.command(lambda: h.agent.load(stripped.id[:8]))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    errors = [e.text for e in of(evs, ev.Error)]
    assert errors and "longer than a context of" in errors[0]
    assert read == [] and peak < 100 << 20  # nothing tokenised, the text never read whole
    h.stop()


def test_sessions_are_listed_while_the_model_still_loads(tmp_path, tools):
    """/list needs no engine: before the model is loaded (no engine yet) every session is listed,
    not "'Worker' object has no attribute 'engine'"."""
    from ds4agent.agent import sessionops

    h = AgentHarness.build(tmp_path, [reply("A1", think="t")], tools=tools)
    h.turn("listed early")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    engine = h.worker.engine
    del h.worker.engine  # as during load_engine
    try:
        listing = sessionops.list_event(h.worker)
    finally:
        h.worker.engine = engine
    assert [s.id for s in listing.sessions] == [saved.id]
    assert not [e for e in h.agent.poll_events() if isinstance(e, ev.Error)]
    h.stop()
