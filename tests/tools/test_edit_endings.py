"""edit keeps a file's line endings (CRLF and CR-only files: no doubled CR, no LF-only line), and
its near-match search does bounded work on large, hostile input and stops on interrupt."""

import difflib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ds4agent.tools.oldtext as oldtext
from ds4agent.tools import ToolContext
from ds4agent.tools import run_tool as _run
from ds4agent.tools.textlines import line_starts


def run_tool(name, args, ctx):
    """An edit of a file the model has read (the guard asks for that; these tests are about
    endings and the near-match search)."""
    if name == "edit":
        _run("read", {"path": args["path"], "whole": True}, ctx)
    return _run(name, args, ctx)


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize(("old", "new", "expect"), [
    # old starting at a line break (the LF of a CRLF must not be matched alone)
    ("\ntwo", "\nTWO", [b"one", b"TWO", b"three"]),
    # old ending at a line break, new adding lines
    ("two\n", "two\nand a half\n", [b"one", b"two", b"and a half", b"three"]),
    # both ends at breaks, the line removed
    ("\ntwo\n", "\n", [b"one", b"three"]),
    # inside a line, new with breaks of its own
    ("tw", "t\nw", [b"one", b"t", b"wo", b"three"]),
])
def test_replacing_at_line_breaks_keeps_the_files_ending(ctx, eol, old, new, expect):
    p = ctx.cwd / "f.txt"
    p.write_bytes(eol.join([b"one", b"two", b"three"]) + eol)
    r = run_tool("edit", {"path": "f.txt", "old": old, "new": new}, ctx)
    assert r.ok, r.text
    assert p.read_bytes() == eol.join(expect) + eol


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_the_last_line_without_an_ending_gets_the_files_ending_for_new_lines(ctx, eol):
    p = ctx.cwd / "f.txt"
    p.write_bytes(b"one" + eol + b"two" + eol + b"last")
    assert run_tool("edit", {"path": "f.txt", "old": "last", "new": "last\nafter"}, ctx).ok
    assert p.read_bytes() == b"one" + eol + b"two" + eol + b"last" + eol + b"after"


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_upto_edits_write_the_files_ending(ctx, eol):
    ctx.edit_upto = True
    p = ctx.cwd / "f.txt"
    p.write_bytes(eol.join([b"a", b"b", b"c", b"d"]) + eol)
    assert run_tool("edit", {"path": "f.txt", "old": "b\n[upto]\nc\n", "new": "B1\nB2\n"}, ctx).ok
    assert p.read_bytes() == eol.join([b"a", b"B1", b"B2", b"d"]) + eol


def test_a_mixed_file_keeps_each_regions_ending(ctx):
    p = ctx.cwd / "f.txt"
    p.write_bytes(b"crlf\r\ncrlf2\r\nlf\nlf2\n")
    assert run_tool("edit", {"path": "f.txt", "old": "lf\nlf2", "new": "LF\nLF2"}, ctx).ok
    assert p.read_bytes() == b"crlf\r\ncrlf2\r\nLF\nLF2\n"
    assert run_tool("edit", {"path": "f.txt", "old": "crlf\ncrlf2", "new": "A\nB"}, ctx).ok
    assert p.read_bytes() == b"A\r\nB\r\nLF\nLF2\n"


_line = st.text(alphabet="ab =", max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eol=st.sampled_from([b"\r\n", b"\r"]), body=st.lists(_line, min_size=1, max_size=8),
       trailing=st.booleans(), data=st.data())
def test_any_replacement_in_a_uniform_file_keeps_every_ending(tmp_path_factory, eol, body, trailing, data):
    assume(len(body) > 1 or trailing)  # a file with no line break at all has no ending to keep
    work = tmp_path_factory.mktemp("w")
    ctx = ToolContext(cwd=work)
    # Every line starts with its own tag, so a run of whole lines occurs exactly once.
    logical = [f"L{i}:{t}" for i, t in enumerate(body)]
    p = work / "f.txt"
    p.write_bytes(eol.join(x.encode() for x in logical) + (eol if trailing else b""))
    i = data.draw(st.integers(0, len(logical) - 1))
    j = data.draw(st.integers(i, len(logical) - 1))
    old = "\n".join(logical[i : j + 1])
    if i > 0 and data.draw(st.booleans()):
        old = "\n" + old  # starts at a line break
    if (j < len(logical) - 1 or trailing) and data.draw(st.booleans()):
        old += "\n"  # ends at a line break
    new = data.draw(st.text(alphabet="xy\n", max_size=6))
    text = "\n".join(logical) + ("\n" if trailing else "")
    assert text.count(old) == 1
    r = run_tool("edit", {"path": "f.txt", "old": old, "new": new}, ctx)
    assert r.ok, r.text
    got = p.read_bytes()
    assert got == text.replace(old, new).encode().replace(b"\n", eol)
    other = b"\n" if eol == b"\r\n" else b"\r\n"
    assert (other not in got) if eol == b"\r" else (b"\r\r" not in got and got.replace(b"\r\n", b"").count(b"\n") == 0)
    ctx.close()


# ------------------------------------------------------------------ near matches, bounded


class Recorder:
    """Counts the full SequenceMatcher comparisons and their input sizes."""

    def __init__(self):
        self.sizes = []
        self.real = difflib.SequenceMatcher

    def __call__(self, isjunk=None, a="", b="", autojunk=True):
        self.sizes.append((len(a), len(b)))
        return self.real(isjunk, a, b, autojunk=autojunk)


@pytest.mark.parametrize("body", [
    (b"a" * 80 + b"\n") * 150_000,  # repetitive: SequenceMatcher's worst case
    (b"x = compute(alpha, beta)\n") * 150_000,  # the first line's words on every line
    b"q" * (15 << 20),  # one 15 MiB line
], ids=["repetitive", "common-words", "one-long-line"])
def test_near_match_search_on_a_large_file_does_bounded_work(ctx, within, monkeypatch, body):
    (ctx.cwd / "big.txt").write_bytes(body)
    rec = Recorder()
    monkeypatch.setattr(difflib, "SequenceMatcher", rec)
    old = "a" * 79 + "b\n" + "x = compute(alpha, gamma)\n" * 40 + "(" * 5000
    # A read shows none of a 15 MiB line in full; a record of the file lets the search run.
    ctx.seen.lines(ctx.abs_key("big.txt")).setdefault(1, 0)
    with within(60):  # a guard against a hang, not a speed target
        r = run_tool("edit", {"path": "big.txt", "old": old, "new": "y"}, ctx)
    assert not r.ok and "old text not found in big.txt" in r.text
    assert len(rec.sizes) <= oldtext.NEAR_FULL
    assert all(a <= oldtext.NEAR_WINDOW and b <= oldtext.NEAR_WINDOW for a, b in rec.sizes)


def test_the_near_match_search_scores_a_bounded_number_of_lines(monkeypatch):
    lines = [b"value = compute(alpha, beta)\n"] * 100_000
    data = b"".join(lines)
    picked = oldtext.lines_to_score(data, line_starts(lines), "value = compute(alpha, gamma)")
    assert len(picked) == oldtext.NEAR_LINES and picked == list(range(oldtext.NEAR_LINES))
    # A rare word finds its line anywhere in the file.
    lines[77_777] = b"value = rare_name(alpha)\n"
    data = b"".join(lines)
    picked = oldtext.lines_to_score(data, line_starts(lines), "rare_name(alpha)")
    assert 77_777 in picked


def test_the_near_match_search_stops_on_interrupt(ctx, stop):
    (ctx.cwd / "big.txt").write_text("value = compute(alpha, beta)\n" * 50_000)
    stop.value = True
    r = run_tool("edit", {"path": "big.txt", "old": "value = compute(alpha, gamma)", "new": "y"}, ctx)
    assert not r.ok and "The search for close candidates was interrupted." in r.text
    assert "Closest candidates" not in r.text


def test_a_one_byte_old_in_a_large_file_is_counted_up_to_a_bound(ctx):
    (ctx.cwd / "big.txt").write_bytes(b"ab\n" * 1_000_000)
    r = run_tool("edit", {"path": "big.txt", "old": "a", "new": "c"}, ctx)
    assert not r.ok and f"more than {oldtext.MAX_OCCURRENCES} occurrences in big.txt" in r.text
