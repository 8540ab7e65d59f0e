import os
import stat

from ds4agent.tools.files import MAX_FILE_BYTES


def _lines(n, fmt="line {}"):
    return "".join(fmt.format(i) + "\n" for i in range(1, n + 1))


def test_read_decorated_chunks_and_more(call, ctx):
    (ctx.cwd / "a.txt").write_text(_lines(7))
    r = call("read", path="a.txt", max_lines="3")
    assert r.text == (
        "a.txt: lines 1-3 of 7; continue_offset=4; call the more tool with count=3 to read the next chunk\n"
        "1 line 1\n2 line 2\n3 line 3\n"
    )
    assert r.display.summary == "Read a.txt: lines 1-3 of 7"
    r = call("more", count=3)
    assert r.text.startswith("a.txt: lines 4-6 of 7; continue_offset=7; call the more tool with count=3")
    r = call("more")
    assert r.text == "a.txt: lines 7-7 of 7\n7 line 7\n"
    assert call("more").text == "Tool error: end of file: a.txt has 7 lines; nothing more to read\n"
    r = call("read", path="a.txt", start_line=6)
    assert r.text == "a.txt: lines 6-7 of 7\n6 line 6\n7 line 7\n"
    assert call("read", path="a.txt", start_line=9).text == (
        "Tool error: start_line 9 is past the end of a.txt (7 lines)\n")


def test_more_without_read(call):
    assert call("more").text == "Tool error: no previous output to continue\n"


def test_default_chunk_is_500_and_whole_reads_to_the_end(call, ctx):
    (ctx.cwd / "big.txt").write_text(_lines(1200))
    r = call("read", path="big.txt")
    assert r.text.splitlines()[0] == (
        "big.txt: lines 1-500 of 1200; continue_offset=501; call the more tool with count=500 to read the next chunk")
    assert r.text.endswith("500 line 500\n")
    r = call("read", path="big.txt", start_line=1000, whole="true")
    assert r.text.splitlines()[0] == "big.txt: lines 1000-1200 of 1200"
    assert len(r.text.splitlines()) == 202


def test_empty_file_and_line_terminators(call, ctx):
    (ctx.cwd / "e.txt").write_bytes(b"")
    assert call("read", path="e.txt").text == "e.txt: lines 0-0 of 0\n"
    (ctx.cwd / "mixed.txt").write_bytes(b"a\r\nb\rc\nd")
    assert call("read", path="mixed.txt").text == "mixed.txt: lines 1-4 of 4\n1 a\n2 b\n3 c\n4 d\n"


def test_raw_preserves_crlf_and_marks_truncation(call, ctx):
    (ctx.cwd / "w.txt").write_bytes(b"one\r\ntwo\r\nthree")
    r = call("read", path="w.txt", raw=True)
    assert r.text == "one\r\ntwo\r\nthree\n"
    r = call("read", path="w.txt", raw="yes", max_lines=1)
    assert r.text == (
        "one\r\n[Read truncated at line 1 of 3. continue_offset=2. "
        "Call the more tool with count=1 to read the next chunk.]\n")
    r = call("more", count=5)
    assert r.text == "two\r\nthree\n"  # raw mode carries over to more


def test_read_refusals(call, ctx):
    big = ctx.cwd / "huge.bin"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    assert call("read", path="huge.bin").text == (
        f"Tool error: file too large: huge.bin exceeds {MAX_FILE_BYTES} bytes\n")
    (ctx.cwd / "b.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    assert call("read", path="b.bin").text.startswith("Tool error: binary file: b.bin contains NUL bytes")
    assert call("read", path="missing.txt").text == (
        "Tool error: cannot open missing.txt: No such file or directory\n")
    (ctx.cwd / "d").mkdir()
    assert call("read", path="d").text.startswith("Tool error: d is a directory")


def test_unicode_paths_and_content(call, ctx):
    d = ctx.cwd / "données"
    d.mkdir()
    (d / "日本.txt").write_text("héllo\nwörld\n", encoding="utf-8")
    r = call("read", path="données/日本.txt")
    assert r.text == "données/日本.txt: lines 1-2 of 2\n1 héllo\n2 wörld\n"
    r = call("write", path="données/ñ/新.txt", content="ü\n")
    assert r.text == "Wrote 3 bytes to données/ñ/新.txt\n"
    assert (d / "ñ" / "新.txt").read_text(encoding="utf-8") == "ü\n"


def test_write_creates_dirs_atomically_and_reports_a_diff(call, ctx):
    r = call("write", path="sub/dir/new.py", content="a = 1\nb = 2\n")
    assert r.text == "Wrote 12 bytes to sub/dir/new.py\n"
    target = ctx.cwd / "sub/dir/new.py"
    assert target.read_text() == "a = 1\nb = 2\n"
    assert r.display.created and r.display.added == 2 and r.display.removed == 0
    assert [(x.kind, x.new_no, x.text) for x in r.display.lines if x.kind == "add"] == [
        ("add", 1, "a = 1"), ("add", 2, "b = 2")]
    os.chmod(target, 0o751)
    r = call("write", path="sub/dir/new.py", content="a = 1\nb = 3\n")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751
    assert not r.display.created
    assert "-b = 2\n+b = 3\n" in r.display.unified
    assert [(x.kind, x.old_no, x.new_no) for x in r.display.lines if x.kind != "hunk"] == [
        ("context", 1, 1), ("remove", 2, None), ("add", None, 2)]
    assert sorted(p.name for p in target.parent.iterdir()) == ["new.py"]  # no temp file left behind
    assert call("write", path="x.txt", content="").text == "Wrote 0 bytes to x.txt\n"
    assert call("write", path="sub", content="x").text == "Tool error: sub is a directory\n"
    assert call("write", path="y.txt").text == "Tool error: missing required parameter: content\n"


def test_write_through_a_symlink_keeps_the_link(call, ctx):
    real = ctx.cwd / "real.txt"
    real.write_text("old\n")
    (ctx.cwd / "link.txt").symlink_to("real.txt")
    call("write", path="link.txt", content="new\n")
    assert (ctx.cwd / "link.txt").is_symlink()
    assert real.read_text() == "new\n"


def test_written_file_is_editable_at_once(call, ctx):
    call("write", path="w.txt", content="x\ny\nz\n")
    r = call("edit", path="w.txt", old="y\n", new="Y\n")
    assert r.ok, r.text
    assert (ctx.cwd / "w.txt").read_text() == "x\nY\nz\n"


def test_big_reads_stop_at_a_line_boundary_inside_the_result_cap(call, ctx):
    from ds4agent.tools import RESULT_CAP_BYTES

    (ctx.cwd / "wide.txt").write_text("".join(f"{i:05d} " + "x" * 94 + "\n" for i in range(1, 3001)))
    r = call("read", path="wide.txt", whole=True)
    header = r.text.split("\n", 1)[0]
    b = int(header.split("lines 1-")[1].split(" ")[0])
    assert 1000 < b < 3000
    assert header.endswith(f"; continue_offset={b + 1}; call the more tool with count=500 to read the next chunk")
    assert len(r.text.encode()) <= RESULT_CAP_BYTES and "tool result truncated" not in r.text
    assert r.text.endswith(f"{b} {b:05d} " + "x" * 94 + "\n")
    assert call("edit", path="wide.txt", old=f"{b + 1:05d} ", new="no").text.startswith(
        f"Tool error: old covers line {b + 1} of wide.txt, which was not shown recently")
    assert call("edit", path="wide.txt", old=f"{b:05d} ", new="ok").ok
