"""The undo log meet the file tools' hardening: a write over a file the
preview left unread (binary, too large) is undone by putting its bytes back, and a code rewind
never opens what is no longer a regular file."""

import os

from ds4agent.sessions.undo import UndoLog


def _recording(ctx, tmp_path):
    ckpt = UndoLog(tmp_path / "ckpt")
    ckpt.at = 5
    ctx.on_write = ckpt.record
    return ckpt


def test_writing_over_a_binary_file_keeps_its_bytes_for_the_rewind(call, ctx, tmp_path):
    old = b"\x00\x01binary\xff" * 10
    (ctx.cwd / "blob").write_bytes(old)
    ckpt = _recording(ctx, tmp_path)
    r = call("write", path="blob", content="text now\n")
    assert r.ok, r.text
    plan = ckpt.plan(5)
    # The preview showed no diff (binary), yet the undo is the old bytes, not "remove the file".
    assert [(f.path, f.content) for f in plan.clean] == [(str(ctx.cwd / "blob"), old)]
    assert ckpt.apply(plan) == ((str(ctx.cwd / "blob"),), ())
    assert (ctx.cwd / "blob").read_bytes() == old


def test_a_new_file_is_still_recorded_as_absent(call, ctx, tmp_path):
    ckpt = _recording(ctx, tmp_path)
    assert call("write", path="new.txt", content="x\n").ok
    ckpt.apply(ckpt.plan(5))
    assert not (ctx.cwd / "new.txt").exists()


def test_a_fifo_where_the_agent_wrote_is_a_conflict_not_a_hang(call, ctx, tmp_path, within):
    ckpt = _recording(ctx, tmp_path)
    assert call("write", path="f.txt", content="agent\n").ok
    os.unlink(ctx.cwd / "f.txt")
    os.mkfifo(ctx.cwd / "f.txt")
    with within(10):
        plan = ckpt.plan(5)
        restored, refused = ckpt.apply(plan)
    assert plan.clean == () and [c.reason for c in plan.conflicts] == ["no longer a regular file"]
    assert restored == () and refused == (f"{ctx.cwd / 'f.txt'}: no longer a regular file",)
    assert not (ctx.cwd / "f.txt").is_file()  # left alone without confirmation


def test_a_write_over_a_huge_sparse_file_keeps_no_copy_and_says_so(call, ctx, tmp_path, within):
    big = ctx.cwd / "sparse.img"
    with open(big, "wb") as f:
        f.truncate(1 << 40)  # a terabyte of holes: copying it would fill the disk
    ckpt = _recording(ctx, tmp_path)
    with within(10):
        r = call("write", path="sparse.img", content="small now\n")
    assert r.ok, r.text
    assert r.text.startswith("Wrote 10 bytes to sparse.img\n")
    assert f"Note: the old sparse.img ({1 << 40} bytes) is over the 64 MiB limit of the undo log" in r.text
    assert big.read_bytes() == b"small now\n"
    # Nothing recorded: no copy of the terabyte, and no entry that would "undo" it to nothing.
    assert ckpt.entries() == [] and not (ckpt.dir / "objects").exists()


def test_a_write_over_a_file_within_the_limit_is_still_undoable(call, ctx, tmp_path):
    old = b"\x00" + b"x" * (20 << 20)  # binary and over read/edit's limit, under the undo log's
    (ctx.cwd / "blob").write_bytes(old)
    ckpt = _recording(ctx, tmp_path)
    r = call("write", path="blob", content="y\n")
    assert r.ok and "Note:" not in r.text
    ckpt.apply(ckpt.plan(5))
    assert (ctx.cwd / "blob").read_bytes() == old
