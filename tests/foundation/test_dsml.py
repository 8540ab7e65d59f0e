"""Streaming DSML parser (prompt-and-dsml.md §11) and greedy classifier (§12)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.protocol import dsml as D
from ds4agent.protocol.dsml import DsmlParser, GreedyState
from ds4agent.protocol.template import assistant_output_pieces, render, render_dsml_block
from ds4agent.protocol.tokenizer import DSML, END_THINK, EOS, THINK, Tokenizer

B = "｜"  # the full-width bar (U+FF5C) is the protocol's
M = f"<{B}DSML{B}tool_calls>"
OPEN_INV = f"<{B}DSML{B}invoke"
OPEN_PAR = f"<{B}DSML{B}parameter"
CLOSE_PAR = f"</{B}DSML{B}parameter>"
CLOSE_INV = f"</{B}DSML{B}invoke>"
CLOSE_TC = f"</{B}DSML{B}tool_calls>"


def run(chunks, *, thinking=False, ids=False):
    """Feed chunks (bytes/str, or token ids when ids=True); stop at DONE/ERROR like the agent does.
    Bytes fed without ids are read by the byte grammar alone (every `｜DSML｜` spelling counts)."""
    p = DsmlParser(thinking=thinking, special_tokens_only=ids)
    events = []
    for c in chunks:
        if ids:
            events += p.feed(c)
        else:
            events += p.feed(None, c.encode() if isinstance(c, str) else c)
        if p.stop:
            break
    events += p.finish()
    return p, events


def text_of(events, kind=D.TextPart):
    return "".join(e.text for e in events if isinstance(e, kind))


def block(body: str) -> str:
    return M + body


def err_of(body: str, **kw) -> str | None:
    p, events = run([block(body)], **kw)
    assert p.outcome.kind == "error", p.outcome
    errs = [e for e in events if isinstance(e, D.BlockError)]
    assert len(errs) == 1 and p.stop
    assert p.outcome.calls == ()
    return errs[0].reason


# ------------------------------------------------------------------ round trip

_values = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", " lead", "trail\n", "a</b", "x</｜DSML｜parameter>y", "&amp; &lt;", "<｜DSML｜invoke>",
                     "</｜DSML｜parameter", "</｜DSML｜parameterx>", "q\"uote"]),
    st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
_names = st.text(alphabet=st.characters(blacklist_characters='">', blacklist_categories=("Cs",)),
                 min_size=1, max_size=8)
_calls = st.lists(st.tuples(_names, st.dictionaries(_names, _values, max_size=3)), min_size=1, max_size=3)


def _expected(calls):
    return [(name, dict(args)) for name, args in calls]


def _got(outcome):
    return [(c.name, c.arguments) for c in outcome.calls]


def _renderable(calls):
    try:
        return render_dsml_block(calls)
    except Exception:
        return None


@settings(max_examples=40, deadline=None)
@given(_calls, st.data())
def test_rendered_calls_parse_back_whatever_the_split(calls, data):
    text = _renderable(calls)
    if text is None:
        return
    raw = ("answer " + text).encode()
    whole, _ = run([raw])
    assert whole.outcome.kind == "done"
    assert _got(whole.outcome) == _expected(calls)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    p, _ = run(chunks)
    assert _got(p.outcome) == _expected(calls)


def test_every_two_way_split_and_single_bytes_of_a_block():
    calls = [("bash", {"command": "ls *.py && echo '<x>'"}),
             ("read", {"path": "sétup.py", "max_lines": 1, "opts": {"a": [1, "</b"]}, "w": "a</｜DSML｜parameter>b"})]
    raw = ("Sure." + render_dsml_block(calls)).encode()
    for i in range(len(raw) + 1):
        p, events = run([raw[:i], raw[i:]])
        assert _got(p.outcome) == _expected(calls), i
        assert text_of(events) == "Sure.\n\n", i  # no marker byte ever leaks into the text
    p, events = run([raw[i:i + 1] for i in range(len(raw))])
    assert _got(p.outcome) == _expected(calls)
    assert text_of(events) == "Sure.\n\n"


def test_real_token_ids_of_a_rendered_output():
    tok = Tokenizer.load()
    calls = [("edit", {"path": "a.py", "old": "x = 1\n", "new": "y = [1, 2]\n", "count": 2})]
    ids = render(assistant_output_pieces(reasoning="plan ｜DSML｜ no", text="Doing it.", calls=calls,
                                  think_mode="think", eos=False))
    # reasoning holds an untrusted DSML string: plain BPE, yet the thinking rule sees its bytes
    p, events = run(ids, thinking=True, ids=True)
    assert p.outcome.kind == "done" and _got(p.outcome) == _expected(calls)
    assert p.outcome.thinking_violation
    assert text_of(events, D.ThinkingPart) == "plan ｜DSML｜ no"
    assert text_of(events) == "Doing it.\n\n"
    ids = render(assistant_output_pieces(reasoning="plan", text="", calls=calls, think_mode="think", eos=False))
    p, _ = run(ids, thinking=True, ids=True)
    assert p.outcome.runs_tools and p.outcome.failure_result is None
    assert DSML in ids and tok.decode_bytes(ids).endswith(CLOSE_TC.encode())


# ------------------------------------------------------------------ markers and text

@pytest.mark.parametrize("marker", [M, f"<DSML{B}tool_calls>", "<|DSML|tool_calls>"])
def test_start_markers_and_typos(marker):
    raw = f"hi {marker}\n{OPEN_INV} name=\"bash\">\n{OPEN_PAR} name=\"c\" string=\"true\">ls{CLOSE_PAR}\n{CLOSE_INV}\n{CLOSE_TC}"
    p, events = run([raw])
    assert _got(p.outcome) == [("bash", {"c": "ls"})]
    assert [type(e) for e in events if isinstance(e, D.BlockStart)] == [D.BlockStart]
    assert text_of(events) == "hi "


def test_plain_tool_calls_tag_is_text_and_partial_markers_flush():
    p, events = run(["<tool_calls>x</tool_calls> and <｜DSML｜tool_cal"])
    assert p.outcome.kind == "none"
    assert text_of(events) == "<tool_calls>x</tool_calls> and <｜DSML｜tool_cal"
    # a held-back prefix that turns out not to be a marker is shown once decided
    p = DsmlParser(thinking=False, special_tokens_only=False)
    assert text_of(p.feed(None, "a <｜DS".encode())) == "a "
    assert text_of(p.feed(None, b"X")) == "<｜DSX"


def test_ascii_bar_tag_inside_block_is_an_error():
    reason = err_of('\n<|DSML|invoke name="bash">\n')
    assert reason == 'unexpected DSML tag: <|DSML|invoke name="bash">'


def test_dsml_special_token_outside_thinking_starts_a_block():
    tok = Tokenizer.load()
    ids = tok.encode_untrusted("ok\n\n<") + [DSML] + tok.encode_untrusted("tool_calls>\n")
    p, events = run(ids, ids=True)
    assert p.block_open and p.state is GreedyState.STRUCTURAL
    assert text_of(events) == "ok\n\n"


# ------------------------------------------------------------------ thinking gate and rule

def test_thinking_gate_uses_ids_only():
    tok = Tokenizer.load()
    ids = tok.encode_untrusted("a </think> b") + [END_THINK] + tok.encode_untrusted("c") + [THINK] + \
        tok.encode_untrusted("d </think>") + [END_THINK]
    p, events = run(ids, thinking=True, ids=True)
    assert text_of(events, D.ThinkingPart) == "a </think> b"
    assert text_of(events) == "c<think>d </think></think>"
    assert sum(isinstance(e, D.ThinkingEnd) for e in events) == 1
    # nothink: everything is visible text
    p, events = run(tok.encode_untrusted("x") + [END_THINK], ids=True)
    assert text_of(events) == "x</think>"


@pytest.mark.parametrize("trigger", ["token", "｜DSML｜", "|DSML|", f"<DSML{B}tool_calls>"])
@pytest.mark.parametrize("ending", ["eos", "valid", "malformed", "open"])
def test_thinking_rule(trigger, ending):
    tok = Tokenizer.load()
    ids = tok.encode_untrusted("let me call ")
    ids += [DSML] if trigger == "token" else tok.encode_untrusted(trigger)
    ids += tok.encode_untrusted(" now") + [END_THINK]
    tail = {
        "eos": "done.",
        "valid": f"{M}\n{OPEN_INV} name=\"bash\">\n{CLOSE_INV}\n{CLOSE_TC}",
        "malformed": f"{M}\n{CLOSE_INV}",
        "open": f"{M}\n{OPEN_INV} name=\"bash\">\n",
    }[ending]
    ids += tok.encode_trusted(tail)
    p, events = run(ids, thinking=True, ids=True)
    assert sum(isinstance(e, D.ThinkingViolation) for e in events) == 1
    o = p.outcome
    assert o.thinking_violation and not o.runs_tools
    assert o.failure_result == "Tool error: invalid DSML tool call: tool calling is not allowed inside <think></think>"
    assert p.stop == (ending in ("valid", "malformed"))  # a close or an ERROR still stops generation
    assert D.THINKING_NOTE == "[tool call ignored: tool calling is not allowed inside <think></think>]"


def test_no_violation_without_marker_in_thinking():
    tok = Tokenizer.load()
    p, events = run(tok.encode_untrusted("I will use DSML later <tool_calls>") + [END_THINK], thinking=True, ids=True)
    assert not p.outcome.thinking_violation


# ------------------------------------------------------------------ structure and errors

def test_tolerant_closes():
    raw = block(f'\n{OPEN_INV} name="a">\n{OPEN_PAR} name="p" string="true">v</{B}DSML{B}parameter \n{B}\t>'
                f'\n</{B}DSML{B}invoke {B}>\n{OPEN_INV} name="b">\n</{B}DSML{B}invoke\n>\n</{B}DSML{B}tool_calls{B}>')
    p, _ = run([raw])
    assert _got(p.outcome) == [("a", {"p": "v"}), ("b", {})]


def test_close_tool_calls_completes_an_open_invoke():
    p, _ = run([block(f'{OPEN_INV} name="a">{CLOSE_TC}')])
    assert _got(p.outcome) == [("a", {})]


@pytest.mark.parametrize(
    "body,reason",
    [
        (f"\n{CLOSE_TC}", "empty tool call block"),
        (f'{OPEN_INV} name="a">{OPEN_INV} name="b">', f'unexpected DSML tag: {OPEN_INV} name="b">'),
        (f'{OPEN_PAR} name="p">', f'unexpected DSML tag: {OPEN_PAR} name="p">'),
        (CLOSE_INV, f"unexpected DSML tag: {CLOSE_INV}"),
        (f'{OPEN_INV} name="a">{CLOSE_PAR}', f"unexpected DSML tag: {CLOSE_PAR}"),
        (f"{M}", f"unexpected DSML tag: {M}"),
        (f'<{B}DSML{B}invokes name="a">', f'unexpected DSML tag: <{B}DSML{B}invokes name="a">'),
        (f"<{B}DSML{B}foo>", f"unexpected DSML tag: <{B}DSML{B}foo>"),
        (f'<DSML{B}invoke name="a">', f'unexpected DSML tag: <DSML{B}invoke name="a">'),
        ("hello>", "unexpected DSML tag: hello>"),
        (f"{OPEN_INV}>", "tool invoke without name"),
        (f'{OPEN_INV} name="">', "tool invoke without name"),
        (f'{OPEN_INV} name = "a">', "tool invoke without name"),
        (f"{OPEN_INV} name='a'>", "tool invoke without name"),
        (f'{OPEN_INV}\tname="a>b">', "tool invoke without name"),  # a '>' inside quotes ends the tag
        (f'{OPEN_INV} name="a">{OPEN_PAR} string="true">', "tool parameter without name"),
        (f'{OPEN_INV} name="a">{CLOSE_INV}{CLOSE_INV}', f"unexpected DSML tag: {CLOSE_INV}"),
        (f"</{B}DSML{B}invoke x>", f"unexpected DSML tag: </{B}DSML{B}invoke x>"),
    ],
)
def test_error_table(body, reason):
    assert err_of(body) == reason


def test_error_after_complete_invokes_runs_nothing():
    p, events = run([block(f'{OPEN_INV} name="a">{CLOSE_INV}\n{OPEN_INV} name="b">junk>')])
    assert p.outcome.kind == "error" and p.outcome.calls == ()
    err = [e for e in events if isinstance(e, D.BlockError)][0]
    assert err.result == "Tool error: invalid DSML tool call: unexpected DSML tag: junk>"
    assert err.note == "[invalid tool call: unexpected DSML tag: junk>]"
    assert err.stanza.startswith(M) and err.stanza.endswith("junk>")


def test_item_limits_and_cut_at_character_boundary():
    # foreign item: reported once 80 bytes arrived, no '>' needed
    p, events = run([block("x" * 79), "y"])
    assert p.outcome.error == "unexpected DSML tag: " + "x" * 79 + "y"
    p, _ = run([block("x" * 79)])
    assert p.outcome.kind == "unterminated"
    # an item that still looks like a DSML tag waits up to 256 bytes
    long_tag = (f'{OPEN_INV} name="' + "a" * 300).encode()
    p, _ = run([M.encode() + long_tag[:255]])
    assert p.outcome.kind == "unterminated"
    p, _ = run([M.encode() + long_tag[:255], b"a"])
    assert p.outcome.kind == "error"
    assert p.outcome.error == "unexpected DSML tag: " + long_tag[:80].decode()
    # cut moved back so a 3-byte character is not split: 78 ASCII bytes + "é€"
    item = "a" * 78 + "€€>"
    assert err_of(item) == "unexpected DSML tag: " + "a" * 78


def test_open_tag_attributes():
    cases = [
        (f'{OPEN_INV} name="a" x="1">{OPEN_PAR} string="false" name="n">5{CLOSE_PAR}{CLOSE_TC}', ("a", {"n": 5})),
        (f'{OPEN_INV} other="q" name="a" name="b">{CLOSE_TC}', ("a", {})),
        (f'{OPEN_INV} name="a">{OPEN_PAR} name="s" string="yes">5{CLOSE_PAR}{CLOSE_TC}', ("a", {"s": "5"})),
        (f'{OPEN_INV} name="a">{OPEN_PAR} name="s">[1]{CLOSE_PAR}{CLOSE_TC}', ("a", {"s": "[1]"})),
        (f'{OPEN_INV}\nname="a">{OPEN_PAR} name="d" string="true">1{CLOSE_PAR}'
         f'{OPEN_PAR} name="d" string="true">2{CLOSE_PAR}{CLOSE_TC}', ("a", {"d": "1"})),
    ]
    for body, call in cases:
        p, _ = run([block(body)])
        assert _got(p.outcome) == [call], body


def test_values_unescape_no_trim_utf8_and_json_errors():
    body = (f'{OPEN_INV} name="w">{OPEN_PAR} name="s" string="true">  a&lt;/{B}DSML{B}parameter>&amp;&lt;b\n{CLOSE_PAR}'
            f'{OPEN_PAR} name="j" string="false">{{"k": "&lt;/{B}DSML{B}parameter>"}}{CLOSE_PAR}'
            f'{OPEN_PAR} name="bad" string="false">{{oops{CLOSE_PAR}').encode()
    body += f'{OPEN_PAR} name="u" string="true">'.encode() + b"x\xffy" + f"{CLOSE_PAR}{CLOSE_TC}".encode()
    p, _ = run([M.encode() + body])
    (call,) = p.outcome.calls
    args = call.arguments
    assert args["s"] == f"  a</{B}DSML{B}parameter>&amp;&lt;b\n"
    assert args["j"] == {"k": f"</{B}DSML{B}parameter>"}
    assert args["bad"] == "{oops" and args["u"] == "x\ufffdy"
    bad = [q for q in call.params if q.name == "bad"][0]
    assert bad.is_json and "invalid JSON" in bad.json_error and "'bad'" in bad.json_error


def test_failed_close_candidates_stay_in_value():
    v = f"a</b </{B}DSML{B}parameterx> </{B}DSML{B}parameter {B} {B}> </{B}DSML{B}invoke>"
    p, _ = run([block(f'{OPEN_INV} name="a">{OPEN_PAR} name="v" string="true">{v}{CLOSE_PAR}{CLOSE_TC}')])
    assert _got(p.outcome) == [("a", {"v": v})]


def test_done_keeps_trailing_bytes_and_stops():
    tok = Tokenizer.load()
    ids = tok.encode_trusted(f'{M}\n{OPEN_INV} name="a">\n{CLOSE_INV}\n</{B}DSML{B}tool_calls') + [1018]
    p = DsmlParser(thinking=False, special_tokens_only=False)
    events = [e for t in ids for e in p.feed(t)]
    done = [e for e in events if isinstance(e, D.BlockDone)]
    assert len(done) == 1 and done[0].trailing == b"\n" and p.stop
    assert p.feed(None, b"more") == []  # nothing after the close is parsed
    assert p.outcome.kind == "done"


def test_eos_and_stop_tokens_give_no_events_and_leave_block_unterminated():
    p = DsmlParser(thinking=False, special_tokens_only=False)
    p.feed(None, (M + "\n").encode())
    for t in (EOS, 0, 2, 128803, 128804, 128805, 128806, 128000):
        assert p.feed(t) == []
    p.finish()
    assert p.outcome.kind == "unterminated" and p.outcome.failure_result is None
    with pytest.raises(D.DsmlParseError):
        p.feed(None, b"x")


# ------------------------------------------------------------------ greedy classifier

def _states_by_byte(raw: bytes):
    p = DsmlParser(thinking=False, special_tokens_only=False)
    states = []
    for i in range(len(raw)):
        p.feed(None, raw[i:i + 1])
        states.append(p.state)
    return states


def test_greedy_states_at_every_position():
    j = '{"a": "q\\"</b", "n": [1]}'
    s = "x<y</z"
    raw = (f'pre{M}\n{OPEN_INV} name="t">\n{OPEN_PAR} name="j" string="false">{j}{CLOSE_PAR}\n'
           f'{OPEN_PAR} name="s" string="true">{s}</{B}DSML{B}parameter {B} >\n{CLOSE_INV}\n{CLOSE_TC}').encode()
    st_ = _states_by_byte(raw)
    S, O, SB, JS, JQ = (GreedyState.STRUCTURAL, GreedyState.OUTSIDE, GreedyState.STRING_BODY,
                        GreedyState.JSON_STRUCTURAL, GreedyState.JSON_STRING)

    def at(prefix: str):  # state after the last byte of `prefix`
        return st_[len(prefix.encode()) - 1]

    head = f"pre{M}"
    assert all(x is O for x in st_[: len(head.encode()) - 1])  # while the marker forms
    assert at(head) is S
    jopen = f'{head}\n{OPEN_INV} name="t">\n{OPEN_PAR} name="j" string="false">'
    assert at(jopen[:-1]) is S and at(jopen) is JS
    assert at(jopen + '{"') is JQ
    assert at(jopen + '{"a') is JQ
    assert at(jopen + '{"a"') is JS
    assert at(jopen + '{"a": "q\\') is JQ
    assert at(jopen + '{"a": "q\\"') is JQ  # escaped quote stays inside the string
    assert at(jopen + '{"a": "q\\"<') is JQ
    assert at(jopen + '{"a": "q\\"</') is S  # a possible close takes precedence
    assert at(jopen + '{"a": "q\\"</b') is JQ  # failed candidate: back to the JSON state
    assert at(jopen + '{"a": "q\\"</b"') is JS
    assert at(jopen + j) is JS
    assert at(jopen + j + f"</{B}DSML{B}param") is S
    sopen = f'{jopen}{j}{CLOSE_PAR}\n{OPEN_PAR} name="s" string="true">'
    assert at(sopen[:-1]) is S and at(sopen) is SB
    assert at(sopen + "x<") is SB
    assert at(sopen + "x<y</") is S
    assert at(sopen + "x<y</z") is SB
    tail = sopen + s + f"</{B}DSML{B}parameter {B} "
    assert at(tail) is S and at(tail[:-2]) is S
    assert st_[-2] is S and st_[-1] is O  # DONE
    # the state never depends on how the bytes were split into tokens
    for i in range(0, len(raw), 7):
        p = DsmlParser(thinking=False, special_tokens_only=False)
        p.feed(None, raw[: i + 1])
        assert p.state is st_[i], i
    assert D.DsmlParser(thinking=True).state is O


def test_in_syntax_and_in_payload_flags():
    p = DsmlParser(thinking=False, special_tokens_only=False)
    p.feed(None, f'{M}{OPEN_INV} name="a">'.encode())
    assert p.in_syntax and not p.in_payload
    p.feed(None, f'{OPEN_PAR} name="v" string="true">ab'.encode())
    assert not p.in_syntax and p.in_payload
    p.feed(None, f'</{B}DS'.encode())
    assert p.in_syntax and not p.in_payload


# ------------------------------------------------------------------ fuzz

_EVENT_TYPES = (D.ThinkingPart, D.ThinkingEnd, D.TextPart, D.ThinkingViolation, D.BlockStart, D.InvokeStart,
                D.ParamStart, D.ParamDelta, D.ParamEnd, D.InvokeEnd, D.BlockDone, D.BlockError)
_frag = st.sampled_from([M, OPEN_INV, OPEN_PAR, CLOSE_PAR, CLOSE_INV, CLOSE_TC, ' name="a"', ' string="false"',
                         ">", "<", "</", B, "DSML", "\n", " ", '"', "{", "&lt;", "|DSML|", "\\"]).map(str.encode)


@settings(max_examples=120, deadline=None)
@given(st.booleans(), st.lists(st.one_of(st.binary(max_size=6), _frag), max_size=40))
def test_fuzz_bytes_never_raise(thinking, chunks):
    p = DsmlParser(thinking=thinking, special_tokens_only=False)
    for c in chunks:
        for e in p.feed(None, c):
            assert isinstance(e, _EVENT_TYPES)
        assert isinstance(p.state, GreedyState)
    p.finish()
    assert p.outcome.kind in ("none", "done", "error", "unterminated")


@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.lists(st.one_of(st.integers(0, 129279),
                                          st.sampled_from([DSML, END_THINK, THINK, 30, 32, 1018, 28217])),
                               max_size=60))
def test_fuzz_token_ids_never_raise(thinking, ids):
    p = DsmlParser(thinking=thinking, special_tokens_only=False)
    for t in ids:
        for e in p.feed(t):
            assert isinstance(e, _EVENT_TYPES)
        _ = p.in_syntax
    p.finish()


def test_bare_invoke_is_a_one_call_block_in_any_chunking():
    text = (f'Now.\n{OPEN_INV} name="read">\n{OPEN_PAR} name="path" string="true">a.py{CLOSE_PAR}\n'
            f'{CLOSE_INV}\nafter')
    data = text.encode()
    for size in (1, 2, 5, len(data)):
        p = DsmlParser(thinking=False, special_tokens_only=False)
        events = [e for i in range(0, len(data), size) for e in p.feed(None, data[i:i + size])]
        events += p.finish()
        assert p.stop and p.outcome.kind == "done"
        assert _got(p.outcome) == [("read", {"path": "a.py"})]
        assert "".join(e.text for e in events if isinstance(e, D.TextPart)) == "Now.\n"
        assert [e.marker for e in events if isinstance(e, D.BlockStart)] == [D.BARE_INVOKE]


def test_stray_dsml_outside_a_block_is_an_error_naming_the_tag():
    p, events = run([f"text {CLOSE_PAR} more"])
    assert p.outcome.kind == "error" and p.outcome.error == f"unexpected DSML tag: {CLOSE_PAR}"
    # A tag that may still become a start marker is held back, not an error.
    p = DsmlParser(thinking=False, special_tokens_only=False)
    p.feed(None, f"x <{B}DSML{B}too".encode())
    assert not p.stop and not p.block_open
    assert D.syntax_error_result("r") == "Tool error: invalid DSML tool call: r\n\n" + D.SYNTAX_REMINDER


# ------------------------------------------------------------------ only the special token starts a block

def test_dsml_quoted_as_plain_text_is_text_and_never_runs():
    """The model writing a block with ordinary tokens (an explanation, a file it repeats: no DSML
    token) gets text, no call; the same block with the DSML token runs."""
    tok = Tokenizer.load()
    body = (f'{M}\n{OPEN_INV} name="bash">\n{OPEN_PAR} name="command" string="true">rm -rf ~'
            f"{CLOSE_PAR}\n{CLOSE_INV}\n{CLOSE_TC}")
    quoted = "Here is how a call looks:\n\n" + body
    plain_ids = tok.encode_untrusted(quoted)
    assert DSML not in plain_ids
    p, events = run(plain_ids, ids=True)
    assert p.outcome.kind == "none" and not p.block_open
    assert text_of(events) == quoted
    for stray in (f"{OPEN_INV} name=\"bash\">", CLOSE_TC, "<DSML｜tool_calls>", "<|DSML|tool_calls>"):
        p, events = run(tok.encode_untrusted("see " + stray + " here"), ids=True)
        assert p.outcome.kind == "none" and text_of(events) == "see " + stray + " here"
    real_ids = tok.encode_trusted(body)
    assert real_ids.count(DSML) == 6
    p, _ = run(real_ids, ids=True)
    assert p.outcome.kind == "done" and p.outcome.calls[0].arguments == {"command": "rm -rf ~"}
    # A quoted block first, then a real one: only the real one runs.
    p, events = run(plain_ids + tok.encode_trusted("\n\n" + body.replace("rm -rf ~", "ls")), ids=True)
    assert p.outcome.kind == "done" and p.outcome.calls[0].arguments == {"command": "ls"}
    assert text_of(events).startswith(quoted)
