"""FIFOs, devices and huge files: every file tool refuses what is not a regular file at once, and
the write preview stays within read/edit's limits."""

import os

import pytest

from ds4agent.tools import files
from ds4agent.tools.files import MAX_FILE_BYTES
from ds4agent.tools.permissions import PermissionPolicy

FIFO_ERROR = ("Tool error: {p} is a FIFO (named pipe), not a regular file; the file tools open only "
              "regular files (inspect it with bash if needed)\n")


@pytest.fixture
def fifo(ctx):
    path = ctx.cwd / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("tool,args", [
    ("read", {"path": "pipe"}),
    ("edit", {"path": "pipe", "old": "a", "new": "b"}),
    ("edit", {"path": "pipe", "old": "a"}),
    ("write", {"path": "pipe", "content": "x"}),
    ("search", {"query": "x", "path": "pipe"}),
])
def test_a_fifo_is_refused_at_once(call, fifo, within, tool, args):
    with within(10):
        r = call(tool, **args)
    assert not r.ok
    assert r.text == FIFO_ERROR.format(p="pipe")
    assert fifo.exists() and not fifo.is_file()  # write did not replace it either


def test_more_on_a_file_replaced_by_a_fifo(call, ctx, within):
    (ctx.cwd / "f").write_text("a\nb\n")
    assert call("read", path="f", max_lines=1).ok
    os.unlink(ctx.cwd / "f")
    os.mkfifo(ctx.cwd / "f")
    with within(10):
        assert call("more").text == FIFO_ERROR.format(p="f")


def test_search_of_a_tree_skips_a_fifo(call, ctx, fifo, within):
    (ctx.cwd / "a.txt").write_text("x marks\n")
    with within(10):
        r = call("search", query="x")
    assert r.text == "1 match shown\n\na.txt\n  1 x marks\n\n"


@pytest.mark.parametrize("device,what", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused(call, within, device, what):
    with within(10):
        for tool, args in [("read", {"path": device}), ("write", {"path": device, "content": "x"}),
                           ("edit", {"path": device, "old": "a", "new": "x"}),
                           ("search", {"query": "x", "path": device})]:
            r = call(tool, **args)
            assert r.text.startswith(f"Tool error: {device} is {what}, not a regular file"), (tool, r.text)


def test_ask_preview_of_a_write_to_a_fifo_or_device_does_not_block(ctx, fifo, within):
    p = PermissionPolicy("ask")
    with within(10):
        # Nothing to approve: the call is let through to fail with the specific error.
        assert p.check("write", {"path": "pipe", "content": "x"}, ctx).kind == "allow"
        assert p.check("write", {"path": "/dev/zero", "content": "x"}, ctx).kind == "allow"


def test_write_preview_of_a_huge_file_has_no_diff(ctx, within):
    big = ctx.cwd / "big.bin"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, no memory
    with within(20):
        d = PermissionPolicy("ask").check("write", {"path": "big.bin", "content": "one\ntwo\n"}, ctx)
    q = d.question
    assert q.title == "Overwrite big.bin?"
    note = (f"@@ the current file ({MAX_FILE_BYTES + 1} bytes) is over the {MAX_FILE_BYTES} byte limit of "
            "read/edit and is not shown; replaced by 8 bytes, 2 lines @@")
    assert q.preview == f"--- a/big.bin\n+++ b/big.bin\n{note}\n+one\n+two\n"
    assert [(x.kind, x.new_no, x.text) for x in q.diff.lines] == [
        ("hunk", None, note), ("add", 1, "one"), ("add", 2, "two")]
    assert not q.diff.created


def test_write_preview_of_a_binary_file_has_no_diff(ctx):
    (ctx.cwd / "b.bin").write_bytes(b"\x00\x01garbage")
    q = PermissionPolicy("ask").check("write", {"path": "b.bin", "content": "text\n"}, ctx).question
    assert q.title == "Overwrite b.bin?"
    assert q.preview.splitlines()[2] == (
        "@@ the current file (9 bytes) is binary and is not shown; replaced by 5 bytes, 1 lines @@")


def test_write_over_a_huge_file_replaces_it_and_says_so(call, ctx):
    big = ctx.cwd / "big.log"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    r = call("write", path="big.log", content="small\n")
    assert (r.ok, r.text) == (True, "Wrote 6 bytes to big.log\n")
    assert big.read_bytes() == b"small\n"


def test_a_failing_diff_after_the_write_does_not_report_a_failed_write(call, ctx, monkeypatch):
    def broken(*a, **k):
        raise MemoryError

    monkeypatch.setattr(files, "make_diff", broken)
    (ctx.cwd / "a.txt").write_text("old\n")
    r = call("write", path="a.txt", content="new\n")
    assert (r.ok, r.text) == (True, "Wrote 4 bytes to a.txt\n")
    assert r.display.summary == "Wrote 4 bytes to a.txt (no diff: MemoryError)"
    assert (ctx.cwd / "a.txt").read_text() == "new\n"
    # The guard learned the new lines all the same: an edit needs no new read.
    r = call("edit", path="a.txt", old="new\n", new="newer\n")
    assert (r.ok, (ctx.cwd / "a.txt").read_text()) == (True, "newer\n")
