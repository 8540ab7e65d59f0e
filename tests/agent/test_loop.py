"""The DSML tool loop against the scripted engine: exact transcript bytes and events."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.protocol import dsml, template
from ds4agent.protocol.tokenizer import ASSISTANT, EOS, THINK, USER, Tokenizer
from tests.support.agent_harness import DATE_LINE, AgentHarness, of
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import reply, text_ids

TOK = Tokenizer.load()
INTERRUPTED = "Tool call not executed: the user interrupted."


def after_last_eos_before(h: AgentHarness, n_back: int = 1) -> bytes:
    """Bytes from after the n-th last EOS to the end."""
    ids = h.ids
    idx = [i for i, t in enumerate(ids) if t == EOS]
    return TOK.decode_bytes(ids[idx[-n_back] + 1:])


def _user(text: str, date_line: str = "") -> list[int]:
    return template.render(template.user_turn_pieces(text, think_mode="think", date_line=date_line))


def test_plain_answer_transcript_is_exact(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("Hello there.", think="Greet.")], tools=tools)
    sys_len = len(h.ids)
    evs = h.turn("  hi  ")
    expect = _user("hi", date_line=DATE_LINE) + reply("Hello there.", think="Greet.")
    assert h.ids[sys_len:] == expect
    assert h.live == tuple(h.ids[:-1])  # the sampled EOS is evaluated only at the next prefill
    assert "".join(e.text for e in of(evs, ev.TextDelta)) == "Hello there."
    assert "".join(e.text for e in of(evs, ev.ThinkingDelta)) == "Greet."
    end = of(evs, ev.TurnEnded)[-1]
    assert (end.reason, end.rounds) == ("done", 1)
    assert of(evs, ev.UserTurn)[0].text == "hi"
    assert of(evs, ev.Status)[-1].state is ev.State.IDLE and of(evs, ev.Status)[-1].unsaved
    h.stop()


def test_multi_call_block_runs_in_order_and_stops_at_close(tmp_path, tools):
    calls = [("alpha", {"x": "1"}), ("beta", {"x": "2", "n": 5})]
    # The scripted model keeps talking after the close: the agent must not sample any of it.
    first = reply("Calling.", think="Plan.", calls=calls) + text_ids("GARBAGE")
    h = AgentHarness.build(tmp_path, [first, reply("Both ran.", think="Done.")], tools=tools)
    evs = h.turn("run both")
    assert tools[0].calls == [{"x": "1"}] and tools[1].calls == [{"x": "2", "n": 5}]
    assert b"GARBAGE" not in h.text()
    text = h.text()
    block_end = "</｜DSML｜tool_calls>".encode() + "<｜end▁of▁sentence｜>".encode()
    assert text.count(block_end) == 1
    results = ("<｜User｜><tool_result>A1\n</tool_result>\n\n<tool_result>B1\n</tool_result>"
               "<｜Assistant｜><think>").encode()
    assert results in text
    assert [e.name for e in of(evs, ev.ToolCallStart)] == ["alpha", "beta"]
    assert [e.args for e in of(evs, ev.ToolCallEnd)] == [{"x": "1"}, {"x": "2", "n": 5}]
    assert [(r.index, r.name, r.ok, r.text) for r in of(evs, ev.ToolResult)] == [
        (0, "alpha", True, "A1\n"), (1, "beta", True, "B1\n")]
    assert of(evs, ev.TurnEnded)[-1].rounds == 2
    assert text.endswith("Both ran.<｜end▁of▁sentence｜>".encode())
    h.stop()


def test_malformed_block_gives_error_result_and_next_round(tmp_path, tools):
    bad = text_ids('Try.\n\n<｜DSML｜tool_calls>\n<｜DSML｜parameter name="x" string="true">1</｜DSML｜parameter>')
    h = AgentHarness.build(tmp_path, [text_ids("Plan.</think>") + bad, reply("Sorry.", think="")],
                           tools=tools)
    evs = h.turn("go")
    assert tools[0].calls == [] and tools[1].calls == []
    inv = of(evs, ev.ToolCallInvalid)
    assert inv and inv[0].kind == "error" and inv[0].reason.startswith("unexpected DSML tag")
    expected = (f"<｜User｜><tool_result>Tool error: invalid DSML tool call: {inv[0].reason}\n\n"
                f"{dsml.SYNTAX_REMINDER}</tool_result>")
    assert expected.encode() in h.text()
    assert of(evs, ev.TurnEnded)[-1].rounds == 2
    h.stop()


def test_call_inside_thinking_is_refused_and_nothing_runs(tmp_path, tools):
    calls = [("alpha", {"x": "1"})]
    think_block = template.render_dsml_block(calls)
    first = text_ids("I will call " + think_block + " now</think>Answer.") + [EOS]
    h = AgentHarness.build(tmp_path, [first, reply("Ok.", think="")], tools=tools)
    evs = h.turn("go")
    assert tools[0].calls == []
    assert [e.kind for e in of(evs, ev.ToolCallInvalid)] == ["thinking"]
    expected = (b"<tool_result>Tool error: invalid DSML tool call: tool calling is not allowed inside "
                b"<think></think></tool_result>")
    assert expected in h.text()
    # The result is untrusted text: its <think></think> are plain BPE, never the special ids.
    res_turn = h.ids[h.ids.index(USER, h.ids.index(EOS, len(h.worker.conv.system_ids)))+1:]
    assert THINK not in res_turn[: res_turn.index(ASSISTANT)]
    h.stop()


def test_unknown_tool_and_stop_token(tmp_path, tools):
    first = reply("", think="x", calls=[("nosuch", {"x": "1"})])
    second = text_ids("y</think>Partial") + [USER] + text_ids("never")
    h = AgentHarness.build(tmp_path, [first, second], tools=tools)
    evs = h.turn("go")
    assert b"<tool_result>Tool error: unknown tool: nosuch</tool_result>" in h.text()
    assert h.text().endswith("Partial<｜end▁of▁sentence｜>".encode())
    assert h.ids.count(USER) == 2  # the sampled <｜User｜> was never appended
    assert any("generation stopped" in n.text for n in of(evs, ev.Notice))
    assert of(evs, ev.TurnEnded)[-1].reason == "stop_token"
    h.stop()


def test_token_cap_ends_round_with_eos(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("one two three four five six seven", think="t")],
                           tools=tools, round_tokens=4)
    sys_len = len(h.ids)
    evs = h.turn("go")
    out = h.ids[sys_len + len(_user("go", date_line=DATE_LINE)):]
    assert len(out) == 5 and out[-1] == EOS
    assert of(evs, ev.TurnEnded)[-1].reason == "token_cap"
    h.stop()


def test_greedy_exactly_on_structure(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {"x": "payload text"})]),
                                      reply("ok", think="")], tools=tools)
    drawn: list[tuple[object, bool]] = []
    real = h.worker.sampler.draw

    def spy(logits, *, greedy=False):
        t = real(logits, greedy=greedy)  # the device-side id, read after the turn
        drawn.append((t, greedy))
        return t

    h.worker.sampler.draw = spy
    h.turn("go")
    flags = [(int(t.item()), g) for t, g in drawn]
    # Tokens sampled while writing the payload (after the value's opening tag) are not greedy;
    # the tag tokens are.
    toks = [t for t, _ in flags]
    text = TOK.decode_bytes(toks)
    assert b"payload text" in text
    greedy_bytes = b"".join(TOK.token_bytes(t) for t, g in flags if g)
    normal_bytes = b"".join(TOK.token_bytes(t) for t, g in flags if not g)
    assert b"payload" in normal_bytes and b"payload" not in greedy_bytes
    assert b"invoke" in greedy_bytes and b"parameter" in greedy_bytes
    h.stop()


def test_interrupt_mid_generation_then_save_load_restores(tmp_path, tools):
    long = reply(" ".join(f"w{i}" for i in range(60)), think="t")
    h = AgentHarness.build(tmp_path, [long], tools=tools)

    h.at_step(20, h.agent.interrupt)
    evs = h.turn("talk")
    h.engine.on_step = None
    assert of(evs, ev.TurnEnded)[-1].reason == "interrupted"
    ids = h.ids
    assert ids[-1] == EOS and ids.count(EOS) == 1
    gen_start = len(h.worker.conv.system_ids) + len(_user("talk", date_line=DATE_LINE))
    assert ids[gen_start:-1] == long[:len(ids) - 1 - gen_start]  # the partial output stays
    evs = h.command(h.agent.save)
    saved = of(evs, ev.SessionSaved)[0]
    assert saved.tokens == len(ids)
    h.stop()

    h2 = AgentHarness.build(tmp_path / "second", [reply("Next.", think="")], store=h.store)
    prefills = list(h2.engine.prefills)
    evs = h2.command(lambda: h2.agent.load(saved.short_id))
    loaded = of(evs, ev.SessionLoaded)[0]
    assert h2.ids == ids and h2.live == tuple(ids) and loaded.prefilled == 0
    assert h2.engine.prefills == prefills  # no prefill at load
    assert [i.kind for i in loaded.history][:1] == ["user"] and loaded.history[0].text == "talk"
    h2.turn("more")
    user2 = _user("more")
    assert h2.engine.prefills[-1] == len(user2)  # only the new suffix
    assert h2.ids[:len(ids)] == ids
    h2.stop()


def test_queued_message_during_generation_runs_the_calls_then_follows_their_results(tmp_path, tools):
    calls = [("alpha", {"x": "1"}), ("beta", {"x": "2"})]
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=calls), reply("Fine.", think="")],
                           tools=tools)
    h.at_step(10, lambda: h.agent.submit("Use pytest instead."))
    evs = h.turn("test it")
    # A queued message never costs a tool: both calls ran, the message follows their results.
    assert tools[0].calls == [{"x": "1"}] and tools[1].calls == [{"x": "2"}]
    expected = ("<｜User｜><tool_result>A1\n</tool_result>\n\n<tool_result>B1\n</tool_result>"
                "\n\nUse pytest instead.<｜Assistant｜><think>").encode()
    assert expected in h.text()
    assert [e.queued for e in of(evs, ev.UserTurn)] == [False, True]
    assert of(evs, ev.QueueChanged)[-1].items == ()
    assert of(evs, ev.TurnEnded)[-1].rounds == 2  # no idle in between: one turn
    h.stop()


def test_message_queued_during_a_tool_call_lands_after_its_result_with_the_next_call_run(tmp_path):
    holder: list[AgentHarness] = []
    a = RecTool("alpha", fn=lambda args: (holder[0].agent.submit("Stop and use B."), "R1\n")[1])
    b = RecTool("beta", "R2\n")
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {}), ("beta", {})]),
                                      reply("Ok.", think="")], tools=[a, b])
    holder.append(h)
    evs = h.turn("go")
    assert len(a.calls) == 1 and len(b.calls) == 1
    expected = ("<｜User｜><tool_result>R1\n</tool_result>\n\n<tool_result>R2\n</tool_result>"
                "\n\nStop and use B.<｜Assistant｜><think></think>Ok.").encode()
    assert expected in h.text()
    assert [(r.name, r.ok) for r in of(evs, ev.ToolResult)] == [("alpha", True), ("beta", True)]
    h.stop()


def test_several_queued_messages_are_numbered_after_the_results(tmp_path):
    holder: list[AgentHarness] = []

    def first(args):
        holder[0].agent.submit("one")
        holder[0].agent.submit("  two  ")
        return "R1\n"

    a = RecTool("alpha", fn=first)
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {})]), reply("Ok.", think="")],
                           tools=[a])
    holder.append(h)
    h.turn("go")
    expected = ("<tool_result>R1\n</tool_result>\n\nQueued user message 1:\none\n\n"
                "Queued user message 2:\ntwo<｜Assistant｜><think>").encode()
    assert expected in h.text()
    h.stop()


def test_interrupt_during_tool_without_queue_ends_turn(tmp_path):
    holder: list[AgentHarness] = []
    a = RecTool("alpha", fn=lambda args: (holder[0].agent.interrupt(), "R1\n")[1])
    b = RecTool("beta", "R2\n")
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {}), ("beta", {})])],
                           tools=[a, b])
    holder.append(h)
    evs = h.turn("go")
    assert b.calls == []
    tail = ("<tool_result>R1\n</tool_result>\n\n<tool_result>Tool call not executed: the user "
            "interrupted.</tool_result><｜Assistant｜><think><｜end▁of▁sentence｜>").encode()
    assert h.text().endswith(tail)
    assert h.engine.responses_started == 1  # the next round produced nothing
    assert of(evs, ev.TurnEnded)[-1].reason == "done"
    # Nothing persists: the next turn runs normally.
    h.engine.add(reply("Back.", think=""))
    h.turn("again")
    assert h.text().endswith("Back.<｜end▁of▁sentence｜>".encode())
    h.stop()


def test_queued_text_after_plain_answer_is_next_turn(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("First answer here.", think="t"), reply("Second.", think="")],
                           tools=tools)
    h.at_step(3, lambda: h.agent.submit("follow-up"))
    evs = h.turn("q1")
    assert [(u.text, u.queued) for u in of(evs, ev.UserTurn)] == [("q1", False), ("follow-up", True)]
    assert len(of(evs, ev.TurnEnded)) == 2
    assert "<｜end▁of▁sentence｜><｜User｜>follow-up<｜Assistant｜><think></think>Second.".encode() in h.text()
    h.stop()


def test_pull_queued_and_busy_commands(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("x " * 40, think="t")], tools=tools)
    seen = []

    def hook(session, pos):
        if pos == 2 and not seen:
            seen.append(1)
            h.agent.submit("a")
            h.agent.submit("b")
            seen.append(h.agent.pull_queued())
            h.agent.new()  # not allowed while busy

    h.engine.on_step = hook
    evs = h.turn("go")
    assert seen[1] == "b"
    assert [u.text for u in of(evs, ev.UserTurn)] == ["go", "a"]
    assert any(e.text == "command requires the model to be idle: /new" for e in of(evs, ev.Error))
    h.stop()


def test_interrupt_during_tool_with_queued_text_runs_next_round(tmp_path):
    holder: list[AgentHarness] = []

    def first(args):
        holder[0].agent.submit("Do B differently.")
        holder[0].agent.interrupt()
        return "R1\n"

    a, b = RecTool("alpha", fn=first), RecTool("beta", "R2\n")
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {}), ("beta", {})]),
                                      reply("Understood.", think="")], tools=[a, b])
    holder.append(h)
    evs = h.turn("go")
    assert b.calls == []  # the interrupt (not the message) stopped the second call
    expected = (f"<tool_result>R1\n</tool_result>\n\n<tool_result>{INTERRUPTED}</tool_result>\n\n"
                "Do B differently.<｜Assistant｜><think></think>Understood.<｜end▁of▁sentence｜>").encode()
    assert h.text().endswith(expected)
    assert of(evs, ev.TurnEnded)[-1].rounds == 2
    h.stop()


def test_failed_turn_leaves_an_error_status_until_the_next_turn(tmp_path, tools):
    h = AgentHarness.build(tmp_path, tools=tools, ctx=4096)
    evs = h.turn(" ".join(f"w{i}" for i in range(3000)))  # more than the context holds
    message = "context full: the message does not fit the context"
    assert of(evs, ev.TurnEnded)[-1].error == message and of(evs, ev.Error)[-1].text == message
    last = of(evs, ev.Status)[-1]
    assert (last.state, last.detail) == (ev.State.ERROR, message) and not h.agent.busy
    h.engine.add(reply("fine", think="t"))
    assert of(h.turn("small"), ev.Status)[-1].state == ev.State.IDLE
    h.stop()


def test_startup_failure_is_a_fatal_error_and_an_error_status(tmp_path):
    def loader(progress):
        raise OSError("no such model file")

    h = AgentHarness.build(tmp_path, engine=loader, ctx=4096, start=False)
    h.agent.start()
    h.until(lambda e: isinstance(e, ev.Exited))
    err = of(h.events, ev.Error)[-1]
    assert err.fatal and err.text == "startup failed: no such model file"
    assert of(h.events, ev.Status)[-1].state == ev.State.ERROR
    assert of(h.events, ev.Exited)[-1].status == 1
    h.stop()


def test_bare_invoke_without_the_block_is_parsed_and_run(tmp_path, tools):
    bare = text_ids('Reading.\n<｜DSML｜invoke name="alpha">\n<｜DSML｜parameter name="x" string="true">7'
                    '</｜DSML｜parameter>\n</｜DSML｜invoke>') + text_ids("\nGARBAGE")
    h = AgentHarness.build(tmp_path, [text_ids("Plan.</think>") + bare, reply("Done.", think="")],
                           tools=tools)
    evs = h.turn("go")
    assert tools[0].calls == [{"x": "7"}]
    assert b"GARBAGE" not in h.text()  # generation stops at the invoke's close
    assert "</｜DSML｜invoke><｜end▁of▁sentence｜><｜User｜><tool_result>A1\n</tool_result>".encode() in h.text()
    assert [(r.name, r.ok) for r in of(evs, ev.ToolResult)] == [("alpha", True)]
    assert of(evs, ev.TurnEnded)[-1].rounds == 2
    h.stop()


def test_incomplete_block_gets_the_syntax_reminder_and_the_turn_continues(tmp_path, tools):
    cut = text_ids('Plan.</think>Try.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="alpha">\n') + [EOS]
    h = AgentHarness.build(tmp_path, [cut, reply("Second try.", think="")], tools=tools)
    evs = h.turn("go")
    assert tools[0].calls == []
    result = dsml.syntax_error_result(dsml.INCOMPLETE_REASON)
    assert result.endswith(dsml.SYNTAX_REMINDER)
    assert f"<｜User｜><tool_result>{result}</tool_result><｜Assistant｜><think>".encode() in h.text()
    assert h.text().endswith("Second try.<｜end▁of▁sentence｜>".encode())
    end = of(evs, ev.TurnEnded)[-1]
    assert (end.reason, end.rounds) == ("done", 2)
    h.stop()


def test_stray_dsml_tag_in_text_is_a_tool_error_with_the_reminder(tmp_path, tools):
    stray = text_ids('Plan.</think>Value </｜DSML｜parameter> here') + [EOS]
    h = AgentHarness.build(tmp_path, [stray, reply("Ok.", think="")], tools=tools)
    evs = h.turn("go")
    inv = of(evs, ev.ToolCallInvalid)
    assert inv and inv[0].reason == "unexpected DSML tag: </｜DSML｜parameter>"
    assert dsml.syntax_error_result(inv[0].reason).encode() in h.text()
    assert of(evs, ev.TurnEnded)[-1].rounds == 2
    h.stop()


def test_a_lone_surrogate_in_a_call_runs_no_call_of_its_block(tmp_path, tools, monkeypatch):
    """JSON lets a parameter spell "\\ud800": a string no file or prompt can hold. The block is
    refused whole before anything runs (a write must not happen and then the turn fail)."""
    import json
    import types

    from ds4agent.protocol import template

    # The scripted model writes the JSON parameter with ASCII escapes, as a model may.
    monkeypatch.setattr(template, "json", types.SimpleNamespace(
        dumps=lambda v, **kw: json.dumps(v, **{**kw, "ensure_ascii": True}), loads=json.loads))
    calls = [("alpha", {"x": "1"}), ("beta", {"x": ["ok", "\ud800"]})]
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=calls), reply("Fixed.", think="")], tools=tools)
    evs = h.turn("go")
    assert tools[0].calls == [] and tools[1].calls == []
    texts = [r.text for r in of(evs, ev.ToolResult)]
    assert len(texts) == 2 and all("lone surrogate (U+D800)" in t and "no call of this block was run" in t
                                   for t in texts)
    assert of(evs, ev.TurnEnded)[-1].rounds == 2 and h.text().endswith("Fixed.<｜end▁of▁sentence｜>".encode())
    h.stop()


def test_dsml_written_with_ordinary_tokens_is_text_that_never_runs_and_replays_as_text(tmp_path, tools):
    """A model quoting a block (plain BPE, no ｜DSML｜ special token) has made no call: nothing runs,
    the text is shown, and the saved session re-parses to the same text on load."""
    quoted = template.render_dsml_block([("alpha", {"x": "1"})])
    plain = text_ids("Plan.</think>Like this:") + TOK.encode_untrusted(quoted) + [EOS]
    assert TOK.DSML not in plain
    h = AgentHarness.build(tmp_path, [plain, reply("A2", think="t")], tools=tools, answer=lambda e: "y")
    evs = h.turn("show me")
    assert tools[0].calls == [] and of(evs, ev.ToolCallStart) == [] and of(evs, ev.ToolCallInvalid) == []
    shown = "".join(e.text for e in of(evs, ev.TextDelta))
    assert shown == "Like this:" + quoted
    assert of(evs, ev.TurnEnded)[-1].rounds == 1
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    full = h.ids
    h.command(h.agent.new)
    loaded = of(h.command(lambda: h.agent.load(saved.short_id)), ev.SessionLoaded)[0]
    assert h.ids == full
    assert [(i.kind, i.text) for i in loaded.history if i.kind in ("text", "tool_call")] == [("text", shown)]
    h.stop()
