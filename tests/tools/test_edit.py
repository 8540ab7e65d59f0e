"""edit: path, old and new; old found once, or HEAD[upto]TAIL; the span within lines read."""

from ds4agent.tools import run_tool
from ds4agent.tools.oldtext import UPTO_MIN_BYTES, upto_ready


def _lines(n):
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def _setup(ctx, name="f.txt", n=20):
    p = ctx.cwd / name
    p.write_text(_lines(n))
    return p


GUARD_NO_READ = "Tool error: edit requires a recent read/search of f.txt; read the lines before editing\n"


def test_guard_refusal_without_any_read_shows_nothing_of_the_file(call, ctx):
    p = _setup(ctx)
    assert call("edit", path="f.txt", old="line 3\n", new="X\n").text == GUARD_NO_READ
    assert call("edit", path="f.txt", old="no such text", new="X").text == GUARD_NO_READ
    assert p.read_text() == _lines(20)


def test_old_outside_the_lines_read_is_refused(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt", max_lines=5)
    r = call("edit", path="f.txt", old="line 4\nline 5\nline 6\n", new="X\n")
    assert r.text == ("Tool error: old covers line 6 of f.txt, which was not shown recently or moved "
                      "after an edit; read lines 4-6 again before editing\n")
    assert p.read_text() == _lines(20)
    assert call("edit", path="f.txt", old="line 4\nline 5\n", new="X\n").ok


def test_guard_refusal_when_the_file_changed(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt")
    p.write_text(_lines(20).replace("line 9\n", "line nine\n"))
    r = call("edit", path="f.txt", old="line 8\nline nine\n", new="X\n")
    assert r.text == "Tool error: file changed around line 9 of f.txt; read lines 8-9 again before editing\n"
    call("read", path="f.txt", start_line=8, max_lines=3)
    assert call("edit", path="f.txt", old="line 8\nline nine\n", new="X\n").ok


def test_exact_old_replacement_result_and_shift(call, ctx):
    p = ctx.cwd / "g.py"
    p.write_text("def foo(x):\n    return x + 1\n\n\ndef bar(y):\n    return y * 2\n")
    call("read", path="g.py")
    r = call("edit", path="g.py", old="x + 1", new="x + 2")
    assert r.text == (
        "Edited g.py\n"
        "Touched old lines 2-2; current post-edit context follows.\n"
        "Current file around edit: g.py lines 1-6 of 6\n"
        "1 def foo(x):\n2     return x + 2\n3 \n4 \n5 def bar(y):\n6     return y * 2\n"
    )
    r = call("edit", path="g.py", old="\n\ndef bar", new="")
    assert "Line shift: old lines after 5 moved by -2" in r.text
    assert p.read_text() == "def foo(x):\n    return x + 2\n(y):\n    return y * 2\n"
    assert call("edit", path="g.py", old="", new="x").text.startswith("Tool error: old text is empty")


def test_path_old_and_new_are_all_required(call, ctx):
    _setup(ctx, n=3)
    call("read", path="f.txt")
    want = 'Tool error: edit requires path, old and new (new="" deletes the old text)\n'
    assert call("edit", path="f.txt", old="line 1").text == want
    assert call("edit", path="f.txt", new="x").text == want
    # Line numbers are no way to edit any more: unknown parameters are ignored.
    assert call("edit", path="f.txt", range="1:2", new="x").text == want


def test_upto_selects_from_head_to_the_end_of_tail(call, ctx):
    ctx.edit_upto = True  # --edit-upto
    p = _setup(ctx)
    call("read", path="f.txt")
    r = call("edit", path="f.txt", old="line 3\n[upto]\nline 6\n", new="X\n")
    assert r.ok, r.text
    assert p.read_text() == _lines(20).replace("line 3\nline 4\nline 5\nline 6\n", "X\n")
    assert r.text.startswith("Edited f.txt\nTouched old lines 3-6;")


def test_newlines_after_upto_are_not_part_of_tail_and_an_empty_tail_ends_with_head(call, ctx):
    ctx.edit_upto = True  # --edit-upto
    p = _setup(ctx, n=8)
    call("read", path="f.txt")
    assert call("edit", path="f.txt", old="line 2\n[upto]\n\n\nline 4", new="Y").ok
    assert p.read_text() == "line 1\nY\nline 5\nline 6\nline 7\nline 8\n"
    call("read", path="f.txt")
    assert call("edit", path="f.txt", old="line 6\n[upto]\n", new="Z\n").ok
    assert p.read_text() == "line 1\nY\nline 5\nZ\nline 7\nline 8\n"


def test_head_must_be_unique_and_tail_unique_after_head(call, ctx):
    ctx.edit_upto = True  # --edit-upto
    p = ctx.cwd / "u.txt"
    body = "a\nx\nb\nend\nc\nx\nend\nd\n"
    p.write_text(body)
    call("read", path="u.txt")
    r = call("edit", path="u.txt", old="x\n[upto]\nend\n", new="-")
    assert r.text == (
        "Tool error: HEAD (old before [upto]) is not unique (2 occurrences in u.txt, starting at lines 2, 6); "
        "add lines to HEAD until it occurs once:\n    2 x\n    6 x\n")
    # TAIL is searched only after HEAD: `end` occurs twice in the file, once after `c\nx`.
    r = call("edit", path="u.txt", old="c\nx\n[upto]\nend\n", new="-\n")
    assert r.ok, r.text
    assert p.read_text() == "a\nx\nb\nend\n-\nd\n"
    call("read", path="u.txt")
    p.write_text("h\nt\nt\n")
    call("read", path="u.txt")
    r = call("edit", path="u.txt", old="h\n[upto]\nt\n", new="-")
    assert r.text.startswith("Tool error: TAIL (old after [upto]) after HEAD is not unique (2 occurrences")
    r = call("edit", path="u.txt", old="h\n[upto]\nzzz\n", new="-")
    assert r.text.startswith("Tool error: TAIL (old after [upto]) after HEAD (line 1) not found in u.txt")
    r = call("edit", path="u.txt", old="[upto]\nt\n", new="-")
    assert r.text.startswith("Tool error: HEAD[upto]TAIL needs the text")
    assert p.read_text() == "h\nt\nt\n"


def test_a_literal_unique_old_wins_over_upto(call, ctx):
    ctx.edit_upto = True  # --edit-upto
    p = ctx.cwd / "doc.md"
    p.write_text("write HEAD[upto]TAIL\nother\n")
    call("read", path="doc.md")
    assert call("edit", path="doc.md", old="HEAD[upto]TAIL", new="H..T").ok
    assert p.read_text() == "write H..T\nother\n"


def test_old_not_found_shows_closest_candidates_which_count_as_read(call, ctx):
    p = ctx.cwd / "g.py"
    body = "import os\n\n\ndef foo(x):\n    return x + 1\n\n\ndef other():\n    pass\n"
    p.write_text(body)
    call("read", path="g.py", max_lines=1)
    r = run_tool("edit", {"path": "g.py", "old": "def foo(x):\n    return x+1\n", "new": "y"}, ctx)
    assert r.text.startswith(
        "Tool error: old text not found in g.py (0 occurrences; the match is exact and case-sensitive). "
        "Closest candidates:\n  lines 4-5 (")
    assert "    4 def foo(x):\n    5     return x + 1\n" in r.text
    assert r.text.endswith("Retry with old copied exactly from these lines.\n")
    assert p.read_text() == body
    assert call("edit", path="g.py", old="def foo(x):\n    return x + 1\n", new="def foo(x):\n    return x+1\n").ok


def test_old_not_unique_reports_count_and_lines(call, ctx):
    p = ctx.cwd / "h.py"
    p.write_text("x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n")
    call("read", path="h.py")
    r = call("edit", path="h.py", old="x = 1", new="x = 9")
    assert r.text == (
        "Tool error: old text is not unique (3 occurrences in h.py, starting at lines 1, 3, 5); add lines "
        "around it until it occurs once:\n"
        "    1 x = 1\n    3 x = 1\n    5 x = 1\n"
    )
    ctx.edit_upto = True  # --edit-upto: the hint names the form this run accepts
    r = call("edit", path="h.py", old="x = 1", new="x = 9")
    assert r.text.startswith("Tool error: old text is not unique (3 occurrences in h.py, starting at lines 1, "
                             "3, 5); add lines around it until it occurs once, or write old as HEAD[upto]TAIL:\n")
    assert call("edit", path="h.py", old="y = 2\nx = 1\n", new="y = 2\nx = 9\n").ok
    assert p.read_text() == "x = 1\ny = 2\nx = 9\nz = 3\nx = 1\n"


def test_overlapping_occurrences_are_not_unique(call, ctx):
    p = ctx.cwd / "o.txt"
    p.write_text("aaa\n")
    call("read", path="o.txt")
    r = call("edit", path="o.txt", old="aa", new="b")
    assert r.text.startswith("Tool error: old text is not unique (2 occurrences in o.txt, starting at lines 1)")
    assert p.read_text() == "aaa\n"


def test_context_lines_count_as_read_after_an_edit(call, ctx):
    p = _setup(ctx, n=40)
    call("read", path="f.txt", max_lines=10)
    r = call("edit", path="f.txt", old="line 3\nline 4\n", new="A\nB\nC\n")
    assert "Line shift: old lines after 4 moved by +1 (old line 5 is now line 6)." in r.text
    # The context block ran to new line 13 (old line 12): those lines are editable now.
    assert call("edit", path="f.txt", old="line 12\n", new="twelve\n").ok
    assert call("edit", path="f.txt", old="line 30\n", new="x\n").text.startswith(
        "Tool error: old covers line 31 of f.txt")
    assert "twelve\n" in p.read_text()


def test_crlf_file_keeps_its_line_endings(call, ctx):
    ctx.edit_upto = True
    p = ctx.cwd / "win.txt"
    p.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    call("read", path="win.txt")
    r = call("edit", path="win.txt", old="two\n", new="TWO\nTWO-B\n")
    assert r.ok, r.text
    assert p.read_bytes() == b"one\r\nTWO\r\nTWO-B\r\nthree\r\n"
    assert call("edit", path="win.txt", old="TWO\n[upto]\nthree", new="3\n3b").ok
    assert p.read_bytes() == b"one\r\n3\r\n3b\r\n"


def test_edit_refuses_missing_and_binary_files(call, ctx):
    assert call("edit", path="nope.txt", old="a", new="b").text == (
        "Tool error: cannot open nope.txt: No such file or directory\n")
    (ctx.cwd / "b.bin").write_bytes(b"a\x00b")
    assert call("edit", path="b.bin", old="a", new="b").text.startswith("Tool error: binary file: b.bin")


def test_guard_memory_is_cleared_on_session_reset(call, ctx):
    _setup(ctx)
    call("read", path="f.txt")
    ctx.reset_session()
    assert call("edit", path="f.txt", old="line 1\n", new="x\n").text == GUARD_NO_READ


def test_relative_and_absolute_paths_share_the_guard(call, ctx):
    p = _setup(ctx)
    call("read", path="./f.txt")
    assert call("edit", path=str(p), old="line 1\n", new="first\n").ok
    assert p.read_text().startswith("first\nline 2\n")


def test_upto_ready_rules():
    body = "".join(f"    value_{i} = compute(alpha, beta, {i})\n" for i in range(10)).encode()
    two = "    value_3 = compute(alpha, beta, 3)\n    value_4 = compute(alpha, beta, 4)\n"
    assert len(two.encode()) >= UPTO_MIN_BYTES
    assert upto_ready(body, two)
    assert not upto_ready(body, two[:-1])  # not at a line end
    one = "    value_3 = compute(alpha, beta, 3)   \n"
    assert not upto_ready(body + one.encode(), one)  # one line
    short = "x = 1\ny = 2\n"
    assert not upto_ready(b"x = 1\ny = 2\nz\n", short)  # under 64 bytes
    assert not upto_ready(body + two.encode(), two)  # found twice
    assert not upto_ready(body, two + "[upto]\n")  # already written
    assert not upto_ready(body, "\n\n" + two.replace("value_3", "nothing"))  # not in the file


def test_without_edit_upto_upto_is_plain_text_and_the_error_says_how_to_enable_it(call, ctx):
    p = _setup(ctx, n=8)
    call("read", path="f.txt")
    r = call("edit", path="f.txt", old="line 2\n[upto]\nline 4\n", new="Y\n")
    assert not r.ok
    assert r.text.startswith("Tool error: old text not found in f.txt")
    assert r.text.endswith("[upto] is plain text here: give old as the exact text (HEAD[upto]TAIL selection "
                           "is off; the user enables it with --edit-upto).\n")
    assert p.read_text() == _lines(8)
    # The same call selects lines 2-4 once the form is on.
    ctx.edit_upto = True
    assert call("edit", path="f.txt", old="line 2\n[upto]\nline 4\n", new="Y\n").ok
    assert p.read_text() == "line 1\nY\nline 5\nline 6\nline 7\nline 8\n"


def test_the_edit_schema_names_upto_only_when_enabled():
    from ds4agent.tools import default_tools

    exact = next(t for t in default_tools() if t.name == "edit")
    upto = next(t for t in default_tools(edit_upto=True) if t.name == "edit")
    assert "[upto]" not in exact.description and "[upto]" not in str(exact.schema)
    assert "HEAD[upto]TAIL" in upto.description
    assert upto.schema["properties"]["old"]["description"] == "exact text to replace (once in the file), or HEAD[upto]TAIL"
    assert exact.schema["properties"]["old"]["description"] == "exact text to replace (once in the file)"
