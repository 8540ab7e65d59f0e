"""`@path` attachments: files as `read` shows them (and seen by the edit guard), directories as
`list` shows them, nothing from outside the working tree."""

from __future__ import annotations

from ds4agent.tools import ToolContext, run_tool
from ds4agent.tools.attach import expand, strip


def _ctx(tmp_path):
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "a.py").write_text("x = 1\ny = 2\n")
    (work / "pkg" / "m.py").write_text("")
    (work / "blob.bin").write_bytes(b"\0\1\2")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return ToolContext(cwd=work)


def test_files_and_directories_are_attached_as_the_tools_show_them(tmp_path):
    ctx = _ctx(tmp_path)
    read = run_tool("read", {"path": "a.py"}, ToolContext(cwd=ctx.cwd)).text
    listing = run_tool("list", {"path": "pkg"}, ToolContext(cwd=ctx.cwd)).text
    att = expand("look at @a.py, and @pkg please; mail me@example.com about @nothing.txt", ctx)
    assert att.attached == ["a.py", "pkg"] and att.notes == []
    assert att.text == ("look at @a.py, and @pkg please; mail me@example.com about @nothing.txt\n\n"
                        f"@a.py:\n{read.rstrip()}\n\n@pkg:\n{listing.rstrip()}\n")
    assert "1" in read and "x = 1" in read
    assert strip(att.text) == "look at @a.py, and @pkg please; mail me@example.com about @nothing.txt"
    assert strip("a\n\n@b.py:\nnot an attachment of this text") == "a\n\n@b.py:\nnot an attachment of this text"
    # The attached lines count as seen: an edit goes through without a read.
    res = run_tool("edit", {"path": "a.py", "old": "y = 2\n", "new": "y = 3\n"}, ctx)
    assert res.ok, res.text
    assert (ctx.cwd / "a.py").read_text() == "x = 1\ny = 3\n"


def test_what_cannot_be_attached_is_left_as_text_with_a_note(tmp_path):
    ctx = _ctx(tmp_path)
    att = expand("@../secret.txt and @blob.bin and @a.py and @a.py again", ctx)
    assert att.attached == ["a.py"]
    assert att.notes == ["@../secret.txt was not attached: it is outside the working directory",
                         "@blob.bin was not attached: binary file: blob.bin contains NUL bytes; "
                         "inspect it with bash (for example xxd or file)"]
    assert "top secret" not in att.text and att.text.count("@a.py:\n") == 1
    assert expand("no mentions here", ctx).text == "no mentions here"


def test_a_nul_byte_in_a_mention_is_plain_text(tmp_path):
    ctx = _ctx(tmp_path)
    out = expand("look at @a.py\0x and @a.py", ctx)
    assert out.attached == ["a.py"] and out.notes == []
    ctx.close()
