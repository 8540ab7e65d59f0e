"""A search cannot freeze the agent: a catastrophically backtracking regex is cut by the time limit
and by the user's interrupt while the regex engine runs (issue 10, item 2)."""

import time

from ds4agent.tools import search
from ds4agent.tools.regex_worker import RegexTimeout, RegexWorker

CATASTROPHIC = r"^(\w+\s?)+$"
# 40 word characters and a '!': the pattern almost matches, so `re` tries ~2^40 splits.
EVIL_LINE = "a" * 40 + "!\n"
HINT = ("a regex with nested repetition such as (a+)+ can take exponential time on a line that almost "
        "matches: simplify the regex, or narrow the path or glob")


def test_a_catastrophic_regex_times_out_with_a_clear_error(call, ctx, monkeypatch, within):
    monkeypatch.setattr(search, "SEARCH_TIME_LIMIT", 1.0)
    (ctx.cwd / "evil.txt").write_text(EVIL_LINE)
    t0 = time.monotonic()
    with within(60):
        r = call("search", query=CATASTROPHIC, mode="regex")
    assert time.monotonic() - t0 < 30
    assert (r.ok, r.text) == (False, f"Tool error: search timed out after 1 s before any match was found; {HINT}\n")


def test_a_timed_out_search_keeps_the_matches_found_before(call, ctx, monkeypatch, within):
    monkeypatch.setattr(search, "SEARCH_TIME_LIMIT", 1.0)
    (ctx.cwd / "a.txt").write_text("plain words\n")
    (ctx.cwd / "b.txt").write_text(EVIL_LINE)
    with within(60):
        r = call("search", query=CATASTROPHIC, mode="regex")
    assert r.text == (
        "1 match shown\n\na.txt\n  1 plain words\n\n"
        f"[search timed out after 1 s; results are incomplete: {HINT}]\n"
    )


def test_an_interrupt_stops_a_running_regex(call, ctx, within):
    polls = []

    def should_stop():
        # The first poll is the search's own, before the file; later ones come from the wait for
        # the regex: this process keeps running Python while the regex runs.
        polls.append(time.monotonic())
        return len(polls) > 3

    ctx.should_stop = should_stop
    (ctx.cwd / "evil.txt").write_text(EVIL_LINE)
    with within(20):
        r = call("search", query=CATASTROPHIC, mode="regex")
    assert r.text == "Tool error: search interrupted by the user before any match was found\n"
    assert len(polls) == 4


def test_the_worker_is_killed_at_the_deadline(within):
    worker = RegexWorker(CATASTROPHIC, 0, 30.0)
    try:
        assert worker.hits(["ab cd", "x!", "yz"], 5, time.monotonic() + 20, lambda: False) == [0, 2]
        with within(20):
            try:
                worker.hits([EVIL_LINE.strip()], 5, time.monotonic() + 0.5, lambda: False)
            except RegexTimeout:
                pass
            else:
                raise AssertionError("no timeout")
        assert worker._proc.returncode is not None  # reaped, not left spinning
    finally:
        worker.close()
