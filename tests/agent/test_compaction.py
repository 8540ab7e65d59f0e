"""Compaction: soft trigger before a turn, hard trigger on a big tool result, /compact."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.agent.compaction import RESULT_RESERVE, compact_threshold
from ds4agent.protocol import template
from ds4agent.protocol.tokenizer import EOS, USER, Tokenizer
from tests.support.agent_harness import DATE_LINE, AgentHarness, of
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import reply, text_ids

TOK = Tokenizer.load()
CTX = 4096
HEAD = b"[ds4-agent compacted earlier conversation. Durable task-state summary follows.]\n"


def words(n: int) -> str:
    """About n tokens of answer text (each " x" is one token)."""
    text = "x" + " x" * (n - 1)
    assert abs(len(TOK.encode_untrusted(text)) - n) <= 2
    return text


def summary(text: str) -> list[int]:
    return text_ids(text) + [EOS]


def test_soft_compaction_before_a_turn_keeps_goal_and_tail(tmp_path, tools):
    h = AgentHarness.build(tmp_path, tools=tools, ctx=CTX)
    u1 = template.render(template.user_turn_pieces("Refactor the parser module please", think_mode="think",
                                   date_line=DATE_LINE))  # the session's first turn
    # Fill to 3 tokens below the soft threshold: the next user turn crosses it.
    n = compact_threshold(CTX) - len(h.ids) - len(u1) - 3
    r = reply(words(n), think="t")
    r = reply(words(n - (len(h.ids) + len(u1) + len(r) - (compact_threshold(CTX) - 3))), think="t")
    h.engine.add(r)
    h.turn("Refactor the parser module please")
    assert compact_threshold(CTX) - 5 <= len(h.ids) < compact_threshold(CTX)
    h.engine.add(summary("Goal: refactor the parser. Done: nothing yet."), reply("Continuing.", think="t"))
    evs = h.turn("and add tests")
    started = of(evs, ev.CompactionStarted)
    assert [s.reason for s in started] == ["soft"]
    done = of(evs, ev.CompactionDone)[0]
    assert done.ok and done.tokens_after < done.tokens_before
    text = h.text()
    assert HEAD + b"Goal: refactor the parser. Done: nothing yet." in text
    # The goal survives verbatim (the tail was too short to keep the first request).
    assert b"The user's first request (verbatim):\nRefactor the parser module please" in text
    assert b"Context compaction:" not in text  # the private request is never kept
    # The rebuilt transcript is the one renderer's output, then the new turn.
    system = h.worker.conv.system
    body = b"Goal: refactor the parser. Done: nothing yet.\n\nThe user's first request (verbatim):\n" \
        b"Refactor the parser module please"
    prefix = template.render(template.compacted_prefix_pieces(system.builtin, body, extra_system_text=system.extra,
                                              tools=tools, ctx=CTX))
    assert h.ids[:len(prefix)] == prefix
    assert h.ids[len(prefix)] == USER
    assert text.endswith("and add tests<｜Assistant｜><think>t</think>Continuing.<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    assert h.live == tuple(h.ids[:-1])
    # First saved after the compaction: still named after the user's first request.
    assert of(h.command(h.agent.save), ev.SessionSaved)[0].title == "Refactor the parser module please"
    h.stop()


def test_hard_compaction_then_result_fits(tmp_path):
    big = RecTool("alpha", text="".join(f"row {i}\n" for i in range(300)))
    h = AgentHarness.build(tmp_path, tools=[big], ctx=CTX)
    n = compact_threshold(CTX) - len(h.ids) - 300  # below the soft threshold, even with the call
    h.engine.add(reply(words(n), think="t"))
    h.turn("first")
    h.engine.add(reply("", think="t", calls=[("alpha", {})]), summary("Summary of work."),
                 reply("Read it.", think=""))
    evs = h.turn("read the rows")
    assert [s.reason for s in of(evs, ev.CompactionStarted)] == ["hard"]
    text = h.text()
    assert b"<tool_result>row 0\n" in text and b"row 299\n</tool_result>" in text
    # The tail kept the current turn from its <｜User｜>: the request and the DSML block.
    assert b"read the rows" in text and "｜DSML｜invoke".encode() in text  # noqa: RUF001
    assert text.endswith(b"Read it.<\xef\xbd\x9cend\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")
    assert len(h.ids) < CTX
    h.stop()


def test_hard_compaction_result_still_too_big(tmp_path):
    huge = RecTool("alpha", text="".join(f"row {i}\n" for i in range(1500)))
    # The conversation is only this turn, all within the verbatim tail: nothing to summarise.
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("alpha", {})]),
                                      reply("Smaller then.", think="")], tools=[huge], ctx=CTX)
    evs = h.turn("read")
    assert [s.reason for s in of(evs, ev.CompactionStarted)] == ["hard"]
    assert of(evs, ev.Notice)[0].text.startswith("nothing compacted: the whole conversation (")
    text = h.text()
    assert b"<tool_result>Tool error: tool result still does not fit after context compaction (projected_prompt=" in text
    assert b"Retry with a smaller read/search/bash output.</tool_result>" in text
    assert b"row 1499" not in text
    assert of(evs, ev.TurnEnded)[-1].reason == "done"
    h.stop()


def test_manual_compact_and_failure_keeps_transcript(tmp_path, tools):
    # Longer than the verbatim tail (ctx/10): there is something to summarise.
    h = AgentHarness.build(tmp_path, [reply(words(500), think="t")], tools=tools, ctx=CTX)
    h.turn("q")
    before = h.ids
    h.engine.add([EOS])  # an empty summary: compaction fails, nothing is lost
    evs = h.command(h.agent.compact)
    assert of(evs, ev.CompactionDone)[0].ok is False
    assert of(evs, ev.Error)[0].text == "compaction failed: the model wrote an empty summary"
    assert h.ids == before
    h.engine.add(summary("Short summary."))
    evs = h.command(h.agent.compact)
    assert of(evs, ev.CompactionDone)[0].ok and [s.reason for s in of(evs, ev.CompactionStarted)] == ["manual"]
    assert HEAD + b"Short summary.\n" in h.text()
    assert len(h.ids) < len(before)
    h.stop()


def test_compact_never_grows_the_context_and_says_why(tmp_path, tools):
    h = AgentHarness.build(tmp_path, [reply("a short answer", think="t")], tools=tools, ctx=CTX)
    h.turn("a short question")
    before = h.ids
    conversation = len(before) - h.worker.conv.transcript.system_len
    # A short chat is all within the verbatim tail: a summary could only be added to it.
    evs = h.command(h.agent.compact)
    assert of(evs, ev.CompactionDone)[0].ok is False and of(evs, ev.Error) == []
    assert [n.text for n in of(evs, ev.Notice)] == [
        f"nothing compacted: the whole conversation ({conversation} tokens) is within the last "
        f"{CTX // 10} tokens, which compaction keeps verbatim"]
    assert h.ids == before

    # Longer than the tail, but the summary is longer than what it would replace.
    h.engine.add(reply(words(300), think="t"), reply(words(300), think="t"))
    h.turn("first request about the parser")
    h.turn("second request about the tests")
    before = h.ids
    h.engine.add(summary(words(700)))
    evs = h.command(h.agent.compact)
    assert of(evs, ev.CompactionDone)[0].ok is False and of(evs, ev.Error) == []
    [note] = [n.text for n in of(evs, ev.Notice)]
    assert note.startswith("nothing compacted: the summary and the kept tail (")
    assert note.endswith(f"tokens) would not be smaller than the context now ({len(before)} tokens)")
    assert h.ids == before
    # The session goes on from the old context.
    h.engine.add(reply("Still here.", think="t"))
    h.turn("go on")
    assert h.text().endswith("Still here.<｜end▁of▁sentence｜>".encode())  # noqa: RUF001
    assert h.ids[:len(before)] == before
    h.stop()


def test_running_bash_job_is_reannounced_in_the_next_user_turn(tmp_path):
    from ds4agent.tools import default_tools

    call = reply("", think="t", calls=[("bash", {"command": "sleep 30", "refresh_sec": 1})])
    h = AgentHarness.build(tmp_path, [call, reply("Started.", think="")], tools=default_tools())
    h.turn("start a long job")
    assert b"status=running" in h.text()
    h.engine.add(reply(words(1800), think="t"))  # longer than the verbatim tail: worth compacting
    h.turn("talk a while")
    h.engine.add(summary("A job runs."))
    evs = h.command(h.agent.compact)
    assert of(evs, ev.CompactionDone)[0].ok
    compacted = len(h.ids)
    text = h.text()
    block = text[text.index(HEAD):text.index(b"[End compacted summary.")]
    assert b"A job runs." in block and b"Bash job update" not in block
    # agent-reference.md §8: a tool message after the compaction, i.e. one more tool result at
    # the start of the next User turn, observed then; the user's message follows it.
    h.engine.add(reply("Still running.", think="t"), reply("Fine.", think="t"))
    h.turn("what now?")
    turn = TOK.decode_bytes(h.ids[compacted:])
    head = (b"<\xef\xbd\x9cUser\xef\xbd\x9c><tool_result>Bash job update after context compaction. "
            b"These jobs are still running:\n\nbash job=1 pid=")
    assert turn.startswith(head), turn[:200]
    assert b" status=running elapsed_sec=" in turn
    assert b"</tool_result>\n\nwhat now?<\xef\xbd\x9cAssistant\xef\xbd\x9c><think>" in turn
    # Announced once: the following turn is a plain message again.
    n = len(h.ids)
    h.turn("ok")
    assert TOK.decode_bytes(h.ids[n:]).startswith("<｜User｜>ok<｜Assistant｜>".encode())  # noqa: RUF001
    h.stop()  # stops the job


def test_job_update_follows_the_results_after_a_hard_compaction(tmp_path):
    from ds4agent.tools import default_tools

    tools = default_tools() + [RecTool("alpha", text="".join(f"row {i}\n" for i in range(100)))]
    start = reply("", think="t", calls=[("bash", {"command": "sleep 30", "refresh_sec": 1})])
    h = AgentHarness.build(tmp_path, [start, reply("Started.", think="")], tools=tools, ctx=CTX)
    h.turn("start a job")
    # Below the soft threshold, so that only the 100 rows (~400 tokens) cross the hard one.
    n = CTX - RESULT_RESERVE - len(h.ids) - 250
    h.engine.add(reply(words(n), think="t"))
    h.turn("talk")
    assert len(h.ids) < compact_threshold(CTX)
    h.engine.add(reply("", think="t", calls=[("alpha", {})]), summary("Summary."), reply("Done.", think=""))
    evs = h.turn("read the rows")
    assert [s.reason for s in of(evs, ev.CompactionStarted)] == ["hard"]
    text = h.text()
    assert b"row 99\n</tool_result>\n\n<tool_result>Bash job update after context compaction." in text
    assert b"to stop execution\n</tool_result><\xef\xbd\x9cAssistant" in text
    assert text.count(b"Bash job update") == 1
    h.stop()
