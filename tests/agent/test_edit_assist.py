"""The agent's help while the model writes an edit: the forced [upto] and the preflight stop."""

from ds4agent.agent import events as ev
from ds4agent.protocol.tokenizer import Tokenizer
from ds4agent.sessions.store import SessionStore
from tests.support.agent_harness import AgentHarness, of
from tests.support.scripted_engine import reply, text_ids

TOK = Tokenizer.load()
LINES = [f"entry_{i} = compute(alpha, {i})\n" for i in range(1, 11)]
UPTO_IDS = TOK.encode_untrusted("[upto]\n")


def _harness(tmp_path, script, edit_upto=True):
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("read", {"path": "src.py"})]), *script],
                           edit_upto=edit_upto)
    (h.root / "work" / "src.py").write_text("".join(LINES))
    return h


def _last_round(ids):
    """Where the round with the edit starts: after the results turn of the read."""
    marks = [i for i, t in enumerate(ids) if t == TOK.ASSISTANT]
    return marks[-2]


def _sub(seq, part):
    return next((i for i in range(len(seq) - len(part) + 1) if seq[i:i + len(part)] == part), -1)


def test_upto_is_forced_once_old_is_unique_and_the_model_goes_on_with_tail(tmp_path):
    full_old = "".join(LINES[1:7])  # lines 2-7, copied in full by the script
    copy = reply("", think="t", calls=[("edit", {"path": "src.py", "old": full_old, "new": "replaced\n"})])
    h = _harness(tmp_path, [copy, reply("Done.", think="")])
    rest = text_ids(LINES[6] + '</｜DSML｜parameter>\n<｜DSML｜parameter name="new" string="true">replaced\n'
                    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")

    def hook(session, pos):
        if list(session.tokens[-len(UPTO_IDS):]) == UPTO_IDS:
            session.continue_with(rest)  # the model writes TAIL after the agent's [upto]

    h.engine.on_step = hook
    evs = h.turn("replace lines 2 to 7")
    assert (h.root / "work" / "src.py").read_text() == LINES[0] + "replaced\n" + "".join(LINES[7:])
    ids = h.ids
    start = _last_round(ids)  # the system prompt's example has an [upto] of its own
    at = start + _sub(ids[start:], UPTO_IDS)
    assert at > start and _sub(ids[at + 1:], UPTO_IDS) < 0  # forced exactly once
    # What stood before the forced ids is old's start, three lines (>= 64 bytes, unique): the
    # agent wrote [upto] where the model would have copied line 5 (the script's next token).
    before = TOK.decode_bytes(ids[:at])
    assert before.endswith(("".join(LINES[1:4])).encode())
    assert LINES[4].encode() not in TOK.decode_bytes(ids[at:at + 40])
    # Forced tokens are streamed and shown like sampled ones.
    old_text = "".join(e.text for e in of(evs, ev.ToolCallArgDelta) if e.param == "old")
    assert old_text == "".join(LINES[1:4]) + "[upto]\n" + LINES[6]
    results = [e for e in of(evs, ev.ToolResult) if e.name == "edit"]
    assert results and results[0].ok and results[0].text.startswith("Edited src.py\nTouched old lines 2-7;")


def test_an_old_that_selects_nothing_stops_before_new(tmp_path):
    bad = reply("", think="t", calls=[("edit", {"path": "src.py", "old": "entry_3 = compute(alpha, 33)\n",
                                                "new": "X\n" * 50})])
    h = _harness(tmp_path, [bad, reply("I will copy it again.", think="")])
    evs = h.turn("fix entry 3")
    text = h.text()
    round2 = text.split("<｜Assistant｜>".encode())[-2].split("<｜User｜>".encode())[0]
    assert b'name="old"' in round2 and b'name="new"' not in round2
    assert round2.endswith("</｜DSML｜parameter>\n<｜end▁of▁sentence｜>".encode()) or round2.endswith(
        "</｜DSML｜parameter><｜end▁of▁sentence｜>".encode())
    result = [e for e in of(evs, ev.ToolResult) if e.name == "edit"][0]
    assert not result.ok
    assert result.text.startswith("Tool error: old text not found in src.py (0 occurrences;")
    assert "    3 entry_3 = compute(alpha, 3)\n" in result.text  # the closest candidate
    assert ("<tool_result>" + result.text + "</tool_result>").encode() in text
    assert (h.root / "work" / "src.py").read_text() == "".join(LINES)
    assert [e.reason for e in of(evs, ev.TurnEnded)] == ["done"]
    assert text.endswith("I will copy it again.<｜end▁of▁sentence｜>".encode())


def test_no_preflight_and_no_forcing_for_a_file_not_read(tmp_path):
    h = AgentHarness.build(tmp_path, [reply("", think="t", calls=[("edit", {
        "path": "src.py", "old": "".join(LINES[1:7]), "new": "y\n"})]), reply("ok", think="")])
    (h.root / "work" / "src.py").write_text("".join(LINES))
    evs = h.turn("edit blind")
    assert _sub(h.ids[_last_round(h.ids):], UPTO_IDS) < 0
    result = [e for e in of(evs, ev.ToolResult) if e.name == "edit"][0]
    assert result.text == "Tool error: edit requires a recent read/search of src.py; read the lines before editing\n"


def test_without_edit_upto_nothing_is_forced_and_the_exact_old_is_copied(tmp_path):
    full_old = "".join(LINES[1:7])
    copy = reply("", think="t", calls=[("edit", {"path": "src.py", "old": full_old, "new": "replaced\n"})])
    h = _harness(tmp_path, [copy, reply("Done.", think="")], edit_upto=False)
    evs = h.turn("replace lines 2 to 7")
    assert _sub(h.ids, UPTO_IDS) < 0  # neither the system prompt nor the round holds [upto]
    old_text = "".join(e.text for e in of(evs, ev.ToolCallArgDelta) if e.param == "old")
    assert old_text == full_old
    assert (h.root / "work" / "src.py").read_text() == LINES[0] + "replaced\n" + "".join(LINES[7:])


def test_the_system_prompt_cache_keys_on_edit_upto(tmp_path):
    """The [upto] paragraph and the edit schema are part of the system prefix, so each setting
    has its own sysprompt-*.kv: switching --edit-upto never loads the other's KV state."""
    kv = tmp_path / "kv"
    texts = {}
    for flag in (False, True, False):
        h = AgentHarness.build(tmp_path / str(flag), [], store=SessionStore(kv), edit_upto=flag)
        texts[flag] = h.text()
        hit = [e for e in h.events if isinstance(e, ev.Ready)][0].sysprompt_cached
        h.stop()
        if flag is False and len(texts) == 2:
            assert hit  # the third start finds the first one's file
    assert (b"[upto]" in texts[True]) and (b"[upto]" not in texts[False])
    assert len(list(kv.glob("sysprompt-*.kv"))) == 2
