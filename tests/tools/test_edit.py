from ds4agent.tools import run_tool


def _lines(n):
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def _setup(ctx, name="f.txt", n=20):
    p = ctx.cwd / name
    p.write_text(_lines(n))
    return p


GUARD_NO_READ = "Tool error: line edit requires a recent read/search of f.txt; read the range before editing\n"


def test_guard_refusal_without_any_read(call, ctx):
    p = _setup(ctx)
    assert call("edit", path="f.txt", line=3, new="X").text == GUARD_NO_READ
    assert p.read_text() == _lines(20)


def test_guard_refusal_for_lines_not_shown(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt", max_lines=5)
    r = call("edit", path="f.txt", range="4:7", new="X")
    assert r.text == ("Tool error: line 6 of f.txt was not shown recently or moved after an edit; "
                      "read this range again before editing\n")
    assert p.read_text() == _lines(20)


def test_guard_refusal_when_the_file_changed(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt")
    p.write_text(_lines(20).replace("line 9\n", "line nine\n"))
    r = call("edit", path="f.txt", range="8-10", new="X")
    assert r.text == "Tool error: file changed around line 9 of f.txt; read this range again before editing\n"
    call("read", path="f.txt", start_line=8, max_lines=3)
    assert call("edit", path="f.txt", range="8-10", new="X").ok


def test_line_edit_result_shift_and_guard_after_edit(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt", max_lines=10)
    r = call("edit", path="f.txt", range="3:4", new="A\nB\nC")
    assert r.text == (
        "Edited f.txt lines 3-4\n"
        "Line shift: old lines after 4 moved by +1 (old line 5 is now line 6). Lines shown below are safe "
        "for immediate line/range editing; read again before editing other shifted lines.\n"
        "Current file around edit: f.txt lines 1-13 of 21\n"
        "1 line 1\n2 line 2\n3 A\n4 B\n5 C\n6 line 5\n7 line 6\n8 line 7\n9 line 8\n10 line 9\n"
        "11 line 10\n12 line 11\n13 line 12\n"
    )
    assert p.read_text().startswith("line 1\nline 2\nA\nB\nC\nline 5\n")
    d = r.display
    assert (d.added, d.removed) == (3, 2)
    # Context lines are editable at once; shifted lines past the context are not.
    r = call("edit", path="f.txt", line=14, new="L14")
    assert r.text.startswith("Tool error: line 14 of f.txt was not shown recently")
    assert call("edit", path="f.txt", line=13, new="L13").ok


def test_same_size_edit_keeps_later_records(call, ctx):
    p = _setup(ctx)
    call("read", path="f.txt")
    r = call("edit", path="f.txt", line=2, new="two")
    assert "Line shift" not in r.text
    assert call("edit", path="f.txt", line=20, new="twenty").ok
    assert p.read_text().splitlines()[1::18] == ["two", "twenty"]


def test_range_forms_and_errors(call, ctx):
    p = _setup(ctx, n=5)
    call("read", path="f.txt")
    assert call("edit", path="f.txt", range=" 2 : 3 ", new="x\n").ok
    assert p.read_text() == "line 1\nx\nline 4\nline 5\n"
    call("read", path="f.txt")
    assert call("edit", path="f.txt", start_line="3", end_line="4", new="y").ok
    assert p.read_text() == "line 1\nx\ny\n"
    call("read", path="f.txt")
    assert call("edit", path="f.txt", range="3-9", new="z").text == (
        "Tool error: edit line range is outside the file\n")
    for bad in ("3:1", "a:b", "0:2", "1,2"):
        assert call("edit", path="f.txt", range=bad, new="z").text == (
            "Tool error: invalid range; use START:END, for example 10:20\n"), bad
    assert call("edit", path="f.txt", line=2).text == (
        'Tool error: line/range edit requires explicit new text; use new="" only when deleting\n')
    assert call("edit", path="f.txt", new="z").text == (
        'Tool error: edit requires old/new, line+new, range+new, or range="all"+new\n')
    assert p.read_text() == "line 1\nx\ny\n"


def test_delete_lines_and_edit_last_line_without_newline(call, ctx):
    p = ctx.cwd / "f.txt"
    p.write_text("a\nb\nc")
    call("read", path="f.txt")
    r = call("edit", path="f.txt", line=2, new="")
    assert r.text.startswith("Edited f.txt lines 2-2\nLine shift: old lines after 2 moved by -1")
    assert p.read_text() == "a\nc"
    call("read", path="f.txt")
    call("edit", path="f.txt", line=2, new="C")
    assert p.read_text() == "a\nC"


def test_crlf_file_keeps_its_line_endings(call, ctx):
    p = ctx.cwd / "win.txt"
    p.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    call("read", path="win.txt")
    assert call("edit", path="win.txt", line=2, new="TWO\nTWO-B").ok
    assert p.read_bytes() == b"one\r\nTWO\r\nTWO-B\r\nthree\r\n"
    # old written with LF still matches the CRLF text; new gets CRLF too.
    r = call("edit", path="win.txt", old="TWO\nTWO-B\n", new="2\n")
    assert r.ok, r.text
    assert p.read_bytes() == b"one\r\n2\r\nthree\r\n"
    assert call("edit", path="win.txt", old="three", new="3\n3b").ok
    assert p.read_bytes() == b"one\r\n2\r\n3\r\n3b\r\n"


def test_old_new_replacement(call, ctx):
    p = ctx.cwd / "g.py"
    p.write_text("def foo(x):\n    return x + 1\n\n\ndef bar(y):\n    return y * 2\n")
    r = call("edit", path="g.py", old="x + 1", new="x + 2")
    assert r.text == (
        "Edited g.py using old/new replacement\n"
        "Touched old lines 2-2; current post-edit context follows.\n"
        "Current file around edit: g.py lines 1-6 of 6\n"
        "1 def foo(x):\n2     return x + 2\n3 \n4 \n5 def bar(y):\n6     return y * 2\n"
    )
    assert "return x + 2" in p.read_text()
    # Missing new deletes the old text.
    r = call("edit", path="g.py", old="\n\ndef bar")
    assert "Line shift: old lines after 5 moved by -2" in r.text
    assert p.read_text() == "def foo(x):\n    return x + 2\n(y):\n    return y * 2\n"
    assert call("edit", path="g.py", old="", new="x").text.startswith("Tool error: old text is empty")


def test_old_not_found_shows_closest_candidates_which_become_editable(call, ctx):
    p = ctx.cwd / "g.py"
    body = "import os\n\n\ndef foo(x):\n    return x + 1\n\n\ndef other():\n    pass\n"
    p.write_text(body)
    r = run_tool("edit", {"path": "g.py", "old": "def foo(x):\n    return x+1\n", "new": "y"}, ctx)
    assert r.text.startswith(
        "Tool error: old text not found in g.py (0 occurrences; the match is exact and case-sensitive). "
        "Closest candidates:\n  lines 4-5 (")
    assert "    4 def foo(x):\n    5     return x + 1\n" in r.text
    assert r.text.endswith("edit them by line/range plus new.\n")
    assert p.read_text() == body
    # The candidate lines were shown with numbers: a line edit on them passes the guard.
    assert call("edit", path="g.py", range="4:5", new="def foo(x):\n    return x+1").ok
    assert "return x+1\n" in p.read_text()


def test_old_not_unique_reports_count_and_lines(call, ctx):
    p = ctx.cwd / "h.py"
    p.write_text("x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n")
    r = call("edit", path="h.py", old="x = 1", new="x = 9")
    assert r.text == (
        "Tool error: old text is not unique; read the target lines and retry with line/range plus new "
        "(3 occurrences in h.py, starting at lines 1, 3, 5):\n"
        "    1 x = 1\n    3 x = 1\n    5 x = 1\n"
    )
    assert call("edit", path="h.py", line=3, new="x = 9").ok
    assert p.read_text() == "x = 1\ny = 2\nx = 9\nz = 3\nx = 1\n"


def test_range_all_rewrite_and_long_region_context(call, ctx):
    p = _setup(ctx, n=3)
    new = "".join(f"n{i}\n" for i in range(1, 51))
    r = call("edit", path="f.txt", range="all", new=new)
    assert p.read_text() == new
    lines = r.text.splitlines()
    assert lines[:2] == ["Edited f.txt range=all", "Current file around edit: f.txt lines 1-50 of 50"]
    assert lines[2:4] == ["1 n1", "2 n2"]
    assert lines[19:22] == ["18 n18", "... 14 edited lines omitted ...", "33 n33"]
    assert lines[-1] == "50 n50"
    # The whole rewritten file is known to the guard.
    assert call("edit", path="f.txt", line=25, new="mid").ok


def test_edit_refuses_missing_and_binary_files(call, ctx):
    assert call("edit", path="nope.txt", old="a", new="b").text == (
        "Tool error: cannot open nope.txt: No such file or directory\n")
    (ctx.cwd / "b.bin").write_bytes(b"a\x00b")
    assert call("edit", path="b.bin", old="a", new="b").text.startswith("Tool error: binary file: b.bin")


def test_guard_memory_is_cleared_on_session_reset(call, ctx):
    _setup(ctx)
    call("read", path="f.txt")
    ctx.reset_session()
    assert call("edit", path="f.txt", line=1, new="x").text == GUARD_NO_READ


def test_relative_and_absolute_paths_share_the_guard(call, ctx):
    p = _setup(ctx)
    call("read", path="./f.txt")
    assert call("edit", path=str(p), line=1, new="first").ok
    assert p.read_text().startswith("first\nline 2\n")


def test_overlapping_occurrences_are_not_unique(call, ctx):
    p = ctx.cwd / "o.txt"
    p.write_text("aaa\n")
    r = call("edit", path="o.txt", old="aa", new="b")
    assert r.text.startswith("Tool error: old text is not unique; read the target lines and retry with "
                             "line/range plus new (2 occurrences in o.txt, starting at lines 1):\n    1 aaa\n")
    assert p.read_text() == "aaa\n"
