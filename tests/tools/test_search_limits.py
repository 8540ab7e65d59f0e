"""A search cannot freeze the agent: the regex engine (ripgrep's) is linear in the input, so a
pattern that backtracks for hours in Python's `re` answers at once; a search that is slow for
other reasons (a huge tree) still ends at the time limit or at the user's interrupt, killing rg."""

import os
import stat

import pytest

from ds4agent.tools import search

CATASTROPHIC = [r"^(\w+\s?)+$", r"^([a-z]+,? ?)+$", r"(a+)+b", r"^(a|aa)+$"]
# The pattern almost matches: `re` tries ~2^40 splits before it gives up on each of these.
ALMOST = "a" * 40 + "!"


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_regex_answers_at_once(call, ctx, within, pattern):
    (ctx.cwd / "evil.txt").write_text(ALMOST + "\n" + "ab, cd ef\n" + "aaaa\n")
    with within(20):  # a guard against a hang, not a timing assertion
        r = call("search", query=pattern, mode="regex")
    expected = {r"^(\w+\s?)+$": [3], r"^([a-z]+,? ?)+$": [2, 3], r"(a+)+b": [2], r"^(a|aa)+$": [3]}[pattern]
    assert r.ok, r.text
    shown = [int(line.split()[0]) for line in r.text.splitlines() if line.startswith("  ")]
    assert shown == expected


def test_the_dialect_is_ripgreps_and_its_complaints_are_tool_errors(call, ctx):
    (ctx.cwd / "a.txt").write_text("foobar\n")
    r = call("search", query=r"foo(?=bar)", mode="regex")  # lookaround: not in a linear-time engine
    assert not r.ok and r.text.startswith("Tool error: invalid regex: regex parse error:")
    assert "look-around" in r.text and r.text.endswith("\n") and r.text.count("\n") == 1
    assert call("search", query=r"\bfoo\w+", mode="regex").text == "1 match shown\n\na.txt\n  1 foobar\n\n"


def test_gitignored_files_are_not_searched_but_hidden_files_are(call, ctx):
    (ctx.cwd / ".git").mkdir()
    (ctx.cwd / ".gitignore").write_text("build/\n*.log\n")
    (ctx.cwd / "build").mkdir()
    (ctx.cwd / "build" / "out.txt").write_text("needle\n")
    (ctx.cwd / "run.log").write_text("needle\n")
    (ctx.cwd / ".env").write_text("needle\n")
    (ctx.cwd / "src.txt").write_text("needle\n")
    r = call("search", query="needle")
    assert r.text == "2 matches shown\n\n.env\n  1 needle\n\nsrc.txt\n  1 needle\n\n"
    # An ignored file named explicitly is searched.
    assert call("search", query="needle", path="run.log").text == "1 match shown\n\nrun.log\n  1 needle\n\n"


def test_line_numbers_follow_the_files_own_line_breaks(call, ctx):
    (ctx.cwd / "cr.txt").write_bytes(b"one\rtwo needle\rthree\rneedle four")
    (ctx.cwd / "crlf.txt").write_bytes(b"one\r\nneedle$\r\n")
    r = call("search", query="needle")
    assert r.text == ("3 matches shown\n\ncr.txt\n  2 two needle\n  4 needle four\n\n"
                      "crlf.txt\n  2 needle$\n\n")
    # `$` ends a CRLF line before its CR.
    assert call("search", query=r"needle\$$", mode="regex").text.endswith("crlf.txt\n  2 needle$\n\n")


def test_a_literal_with_a_line_break_matches_nothing(call, ctx):
    (ctx.cwd / "a.txt").write_text("a\nb\n")
    assert call("search", query="a\nb").text == "No matches\n"


def fake_rg(tmp_path, body: str) -> str:
    """An executable standing in for rg: `body` is its shell script."""
    path = tmp_path / "fake-rg"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _records(path) -> bytes:
    """What rg prints for a match on the first line of `path` (see search._RG_OUTPUT)."""
    return os.fsencode(path) + b"\x001:[Omitted long matching line]\n"


def test_a_slow_search_times_out_and_keeps_the_matches_found_before(call, ctx, tmp_path, monkeypatch, within):
    (ctx.cwd / "a.txt").write_text("plain words\n")
    events = tmp_path / "events"
    events.write_bytes(_records(ctx.cwd / "a.txt"))
    pid = ctx.cwd / ".pid"  # rg runs inside the sandbox: it may write in the tree only
    monkeypatch.setattr(search, "find_rg", lambda: fake_rg(tmp_path, f"echo $$ > {pid}\ncat {events}\nexec sleep 60\n"))
    monkeypatch.setattr(search, "SEARCH_TIME_LIMIT", 0.5)
    with within(20):
        r = call("search", query="plain")
    assert r.text == ("1 match shown\n\na.txt\n  1 plain words\n\n"
                      "[search timed out after 0.5 s; results are incomplete: narrow the path or glob]\n")
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid.read_text()), 0)


def test_a_slow_search_with_nothing_found_is_a_timeout_error(call, ctx, tmp_path, monkeypatch, within):
    monkeypatch.setattr(search, "find_rg", lambda: fake_rg(tmp_path, "exec sleep 60\n"))
    monkeypatch.setattr(search, "SEARCH_TIME_LIMIT", 0.5)
    with within(20):
        r = call("search", query="x")
    assert r.text == ("Tool error: search timed out after 0.5 s before any match was found; "
                      "narrow the path or glob\n")


def test_an_interrupt_stops_a_running_search(call, ctx, tmp_path, monkeypatch, within):
    started = ctx.cwd / ".started"  # rg runs inside the sandbox: it may write in the tree only
    monkeypatch.setattr(search, "find_rg", lambda: fake_rg(tmp_path, f"touch {started}\nexec sleep 60\n"))
    ctx.should_stop = lambda: started.exists()  # the user presses Esc once rg is running
    with within(20):
        r = call("search", query="x")
    assert r.text == "Tool error: search interrupted by the user before any match was found\n"


def test_a_missing_rg_is_a_clear_error(call, ctx, monkeypatch):
    monkeypatch.setattr(search, "find_rg", lambda: None)
    (ctx.cwd / "a.txt").write_text("x\n")
    r = call("search", query="x")
    assert r.text == f"Tool error: {search.RG_MISSING}\n"


def test_rg_is_found_where_the_ripgrep_wheel_put_it():
    rg = search.find_rg()
    assert rg is not None and os.access(rg, os.X_OK) and os.path.basename(rg) == "rg"


def test_a_huge_line_full_of_matches_costs_its_own_size_not_one_record_per_match(call, ctx):
    import tracemalloc

    (ctx.cwd / "big.txt").write_bytes(b"a" * (8 << 20) + b"\nb\n")
    tracemalloc.start()
    try:
        r = call("search", query="a")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.text.startswith("1 match shown\n\nbig.txt\n  1 " + "a" * 400 + f" [... {(8 << 20) - 400} more chars]")
    assert peak < 80 << 20  # the file, its lines and its text: a few copies of 8 MiB, not 8M matches


def test_a_file_name_with_a_line_break_is_reported_whole(call, ctx):
    (ctx.cwd / "two\nlines.txt").write_text("needle\n")
    (ctx.cwd / "z.txt").write_text("needle\n")
    r = call("search", query="needle")
    assert r.text == "2 matches shown\n\ntwo\nlines.txt\n  1 needle\n\nz.txt\n  1 needle\n\n"
