"""Property tests of the line model and the diff numbering (small, bounded example counts)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.tools import ToolContext, run_tool
from ds4agent.tools.files import make_diff, split_lines, strip_eol

line = st.text(alphabet="ab é\t", max_size=6)
eol = st.sampled_from(["\n", "\r\n", "\r", ""])
text_lines = st.lists(st.tuples(line, eol), max_size=12)


def _join(pairs):
    # An empty terminator is only valid on the last line (otherwise two lines would merge).
    out = []
    for i, (t, e) in enumerate(pairs):
        out.append(t + (e if e or i == len(pairs) - 1 else "\n"))
    return "".join(out).encode()


@settings(max_examples=60, deadline=None)
@given(text_lines)
def test_split_lines_round_trips(pairs):
    data = _join(pairs)
    lines = split_lines(data)
    assert b"".join(lines) == data
    for x in lines[:-1]:
        assert x.endswith((b"\n", b"\r"))
    for x in lines:
        assert b"\n" not in strip_eol(x) and b"\r" not in strip_eol(x)


@settings(max_examples=60, deadline=None)
@given(text_lines, text_lines)
def test_diff_line_numbers_rebuild_both_sides(a, b):
    before, after = _join(a), _join(b)
    d = make_diff("f", before, after)
    old = [strip_eol(x).decode() for x in split_lines(before)]
    new = [strip_eol(x).decode() for x in split_lines(after)]
    for x in d.lines:
        if x.kind in ("context", "remove"):
            assert old[x.old_no - 1] == x.text
        if x.kind in ("context", "add"):
            assert new[x.new_no - 1] == x.text
    assert d.added == sum(1 for x in d.lines if x.kind == "add")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="xyz", min_size=1, max_size=3), min_size=1, max_size=10), st.data())
def test_upto_edit_replaces_exactly_the_span(tmp_path_factory, rows, data):
    work = tmp_path_factory.mktemp("p")
    ctx = ToolContext(cwd=work, edit_upto=True)
    rows = [f"<{i}>{r}" for i, r in enumerate(rows)]  # each line once in the file
    (work / "f.txt").write_text("".join(r + "\n" for r in rows))
    a = data.draw(st.integers(1, len(rows)))
    b = data.draw(st.integers(a, len(rows)))
    new = data.draw(st.lists(st.text(alphabet="NM", min_size=1, max_size=2), max_size=4))
    run_tool("read", {"path": "f.txt"}, ctx)
    old = rows[a - 1] + "\n" + ("" if a == b else "[upto]\n" + rows[b - 1] + "\n")
    r = run_tool("edit", {"path": "f.txt", "old": old, "new": "".join(x + "\n" for x in new)}, ctx)
    assert r.ok, r.text
    assert (work / "f.txt").read_text() == "".join(x + "\n" for x in rows[: a - 1] + new + rows[b:])


# Shell text from the characters that matter to the scanner (no here-documents: a body that
# swallows the rest of the command is a real reason for a write not to run).
shell_junk = st.lists(st.sampled_from(list("ab ./~$\\'\"`;&|(){}*?[]=#-\t2>\n") + ["tee ", "cd ", "git ", "ln "]),
                      max_size=30).map("".join).filter(lambda s: "<<" not in s)


@settings(max_examples=300, deadline=None)
@given(shell_junk)
def test_a_write_outside_after_any_text_is_never_missed(junk):
    from ds4agent.tools.shellscan import scan

    found = scan(junk + "\necho x > /etc/outside\n", "/tmp/work")
    # Opaque (None) or the write is reported: never a silent pass.
    assert found is None or any(r.startswith("/etc/outside ") for r in found.risky_writes)
