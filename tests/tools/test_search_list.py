import os


def _tree(root):
    (root / "src").mkdir()
    (root / "src" / "b.py").write_text("import os\nx = 1\nprint('Hello')\n")
    (root / "src" / "a.py").write_text("def hello():\n    return 'hello'\n")
    (root / "notes.md").write_text("hello world\nbye\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("hello from git\n")
    (root / "blob.bin").write_bytes(b"hello\x00binary")


def test_literal_search_sorted_and_recorded(call, ctx):
    _tree(ctx.cwd)
    r = call("search", query="hello")
    assert r.text == (
        "3 matches shown\n\n"
        "notes.md\n  1 hello world\n\n"
        "src/a.py\n  1 def hello():\n  2     return 'hello'\n\n"
    )
    assert r.display.summary == "search 'hello': 3 matches in 2 files"
    # Printed lines count as shown for the edit guard.
    assert call("edit", path="src/a.py", old="    return 'hello'", new="    return 'hi'").ok


def test_case_insensitive_regex_glob_and_context(call, ctx):
    _tree(ctx.cwd)
    r = call("search", query="HELLO", case_sensitive="false", glob="*.py")
    assert r.text == (
        "3 matches shown\n\nsrc/a.py\n  1 def hello():\n  2     return 'hello'\n\n"
        "src/b.py\n  3 print('Hello')\n\n")
    r = call("search", query=r"^x\s*=\s*\d+$", mode="regex", path="src", context=1)
    assert r.text == "1 match shown\n\nsrc/b.py\n  1 import os\n  2 x = 1\n  3 print('Hello')\n\n"
    r = call("search", query="hello", glob="src/*.py", context="9")  # context clamps to 5
    assert r.text.startswith("2 matches shown\n\nsrc/a.py\n  1 def hello():\n  2     return 'hello'\n")


def test_single_file_no_matches_and_bad_regex(call, ctx):
    _tree(ctx.cwd)
    assert call("search", query="bye", path="notes.md").text == "1 match shown\n\nnotes.md\n  2 bye\n\n"
    assert call("search", query="absent").text == "No matches\n"
    assert call("search", query="(", mode="regex").text.startswith("Tool error: invalid regex: ")
    assert call("search", query="x", path="nowhere").text == (
        "Tool error: cannot search nowhere: No such file or directory\n")


def test_max_results_cut_is_marked(call, ctx):
    (ctx.cwd / "many.txt").write_text("hit\n" * 10)
    r = call("search", query="hit", max_results=3)
    assert r.text == (
        "3 matches shown\n\nmany.txt\n  1 hit\n  2 hit\n  3 hit\n\n"
        "[search stopped at max_results=3; more matches exist: narrow the query, path or glob]\n")
    r = call("search", query="hit", max_results=10)
    assert "search stopped" not in r.text


def test_search_skips_symlinks_and_long_lines_are_clipped(call, ctx):
    (ctx.cwd / "t.txt").write_text("needle " + "x" * 1000 + "\n")
    os.symlink("t.txt", ctx.cwd / "link.txt")
    r = call("search", query="needle")
    assert r.text.startswith("1 match shown\n\nt.txt\n  1 needle ")
    assert r.text.endswith(" [... 607 more chars]\n\n")
    # A clipped line was not fully shown, so it is not editable.
    assert call("edit", path="t.txt", old="needle", new="x").text.startswith(
        "Tool error: edit requires a recent read/search of t.txt")


def test_list_format(call, ctx):
    (ctx.cwd / "d").mkdir()
    (ctx.cwd / "f.txt").write_text("12345")
    (ctx.cwd / ".hidden").write_text("")
    os.symlink("f.txt", ctx.cwd / "ln")
    r = call("list", path=".")
    assert r.text == (
        ".:\n"
        "-          0 .hidden\n"
        f"d {os.lstat(ctx.cwd / 'd').st_size:>10} d/\n"
        "-          5 f.txt\n"
        "l          5 ln\n"
    )
    assert r.display.summary == "list .: 4 entries"
    assert call("list", path="").text.startswith(".:\n")


def test_list_caps_entries_and_reports_errors(call, ctx):
    d = ctx.cwd / "many"
    d.mkdir()
    for i in range(305):
        (d / f"f{i:03d}").write_text("")
    r = call("list", path="many")
    lines = r.text.splitlines()
    assert len(lines) == 302
    assert lines[1].endswith(" f000") and lines[300].endswith(" f299")
    assert lines[-1] == "... more entries omitted ..."
    assert call("list", path="missing").text == "Tool error: opendir failed: No such file or directory\n"
    (ctx.cwd / "file").write_text("x")
    assert call("list", path="file").text == "Tool error: opendir failed: Not a directory\n"


def test_search_output_stays_inside_the_result_cap(call, ctx):
    from ds4agent.tools import RESULT_CAP_BYTES

    (ctx.cwd / "w.txt").write_text(("hit" + "y" * 390 + "\n") * 500)
    r = call("search", query="hit", max_results=500)
    shown = int(r.text.split(" ", 1)[0])
    assert 100 < shown < 500
    assert r.text.count("\n  ") == shown
    assert r.text.endswith("[search output reached the size limit; narrow the query, path or glob]\n")
    assert len(r.text.encode()) <= RESULT_CAP_BYTES


def test_search_stops_on_interrupt(call, ctx):
    _tree(ctx.cwd)
    ctx.should_stop = lambda: True
    assert call("search", query="hello").text == (
        "Tool error: search interrupted by the user before any match was found\n")
