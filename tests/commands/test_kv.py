"""`ds4agent kv ls|show|verify|rm`: listing, showing, verifying and removing the KV directory's files."""

import io
import os
import subprocess
import sys

import pytest

from ds4agent.cli import build_parser, parse
from ds4agent.commands import kv
from ds4agent.sessions import errors as E
from ds4agent.sessions.kvc import KVCHeader, text_sha1, write_kvc
from ds4agent.sessions.payload import FLASH_SHAPE
from ds4agent.sessions.store import SessionStore
from tests.sessions.helpers import TINY, peak_memory, random_state, s_layout, session_text


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """The listing fits $COLUMNS; tests that do not set it must not depend on the terminal they run in."""
    monkeypatch.setenv("COLUMNS", "1000")


def run(directory, *argv):
    args = parse(["kv", "--kv-dir", str(directory), *argv])
    out = io.StringIO()
    code = kv.main(args, out=out)
    return code, out.getvalue()


def populate(tmp_path):
    store = SessionStore(tmp_path)
    s = store.save_session(session_text("list this ✓ session"), random_state(TINY, 9, 64), shape=TINY,
                           quant_bits=2, now=1_760_000_000)
    store.save_sysprompt(b"<sys>", random_state(TINY, 3, 64), shape=TINY, quant_bits=2, now=1_760_000_100)
    return store, s


def test_ls(tmp_path):
    _, s = populate(tmp_path)
    code, out = run(tmp_path, "ls")
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"KV files in {tmp_path}:"
    assert "agent-system" in lines[1] and "sysprompt-" in lines[1]  # newer first
    assert lines[2].split()[:2] == [s.id[:8], "agent-session"]
    assert lines[2].endswith("list this ✓ session") and "9 tokens" in lines[2]


def test_ls_empty_and_missing_dir(tmp_path, capsys):
    assert run(tmp_path, "ls") == (0, f"KV files in {tmp_path}:\n  (none)\n")
    # a fresh install: nothing was ever saved, which is not an error
    missing = tmp_path / "missing"
    assert run(missing, "ls") == (0, f"no sessions yet (no KV directory at {missing})\n")
    assert run(missing, "verify") == (0, f"no sessions yet (no KV directory at {missing})\n")
    assert not missing.exists()  # inspecting creates nothing
    code, out = run(missing, "rm", "abc")
    assert code == 1 and capsys.readouterr().err.strip() == f"ds4agent kv: no KV directory at {missing}"
    (tmp_path / "file").write_text("x")
    code, out = run(tmp_path / "file", "ls")
    assert code == 1 and capsys.readouterr().err.strip() == f"ds4agent kv: no KV directory at {tmp_path / 'file'}"


def test_show_file_needs_no_kv_directory_and_kv_dir_goes_after_the_action(tmp_path, capsys):
    _, s = populate(tmp_path / "kv")
    elsewhere = tmp_path / "copy.kv"
    elsewhere.write_bytes(s.path.read_bytes())
    args = parse(["kv", "--kv-dir", str(tmp_path / "missing"), "show", str(elsewhere)])
    out = io.StringIO()
    assert kv.main(args, out=out) == 0 and f"file:           {elsewhere}" in out.getvalue()
    code, _ = run(tmp_path / "missing", "show", "abc")
    assert code == 1
    assert capsys.readouterr().err.strip() == (f"ds4agent kv: abc: no such file, and no KV directory at "
                                                f"{tmp_path / 'missing'}")
    for action in (["ls"], ["verify"], ["show", s.id[:8]], ["rm", s.id[:8]]):
        args = parse(["kv", *action, "--kv-dir", str(tmp_path / "kv")])
        out = io.StringIO()
        assert kv.main(args, out=out) == 0, action
        assert s.id[:8] in out.getvalue() or "0 invalid" in out.getvalue()
    assert not s.path.exists()


def test_show_session(tmp_path):
    _, s = populate(tmp_path)
    code, out = run(tmp_path, "show", s.id[:6])
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line and not line.startswith(" "))
    assert fields["reason"].strip() == "6 (agent-session)"
    assert fields["tokens"].strip() == "9"
    assert fields["ext flags"].strip() == "0x88 (title, checksum)"
    assert fields["title"].strip() == "list this ✓ session"
    assert fields["trailers"].strip() == "title (21 bytes)"
    assert fields["status"].strip() == "ok"
    assert fields["layout"].strip() == "[L]"
    assert "\\n" not in fields["text preview"] and "<｜User｜>" in fields["text preview"]
    assert "size-checked only" in out  # tiny layout: ratios unknown without the model


def test_show_flash_checkpoint_by_path(tmp_path):
    text = b"server prompt"
    path = tmp_path / (text_sha1(text) + ".kv")
    write_kvc(path, KVCHeader(4, 2, 0, 0, 5, 3, 4096, 10, 20, 0), text, random_state(FLASH_SHAPE, 5, 4096), FLASH_SHAPE)
    code, out = run(tmp_path, "show", str(path))
    assert code == 0 and "reason:         2 (continued)" in out and "hits:           3" in out
    layer_lines = [line.split() for line in out.splitlines() if line.startswith("                ")
                   and line.split()[0].isdigit()]
    assert len(layer_lines) == 43
    assert layer_lines[2] == ["2", "4", "1", "1"] and layer_lines[3] == ["3", "128", "0", "0"]
    assert "status:         ok" in out


def test_show_invalid_file(tmp_path):
    bad = tmp_path / "broken.kv"
    bad.write_bytes(b"KVC\x01garbage")
    code, out = run(tmp_path, "show", "broken.kv")
    assert code == 1 and "INVALID: invalid KV header" in out


def test_verify(tmp_path):
    _, s = populate(tmp_path)
    code, out = run(tmp_path, "verify")
    assert code == 0 and out.splitlines()[-1] == "2 file(s) checked, 0 invalid"
    data = s.path.read_bytes()
    (tmp_path / ("0" * 40 + ".kv")).write_bytes(data)  # renamed copy: identity mismatch
    s.path.write_bytes(data[:-15])  # truncated title trailer (and no checksum)
    (tmp_path / "readme.txt").write_text("not a kv file")
    code, out = run(tmp_path, "verify")
    lines = out.splitlines()
    assert code == 1 and lines[-1] == "3 file(s) checked, 2 invalid"
    assert f"INVALID  {'0' * 40}.kv  cached session identity does not match file name" in lines
    assert f"INVALID  {s.path.name}  truncated agent session title trailer" in lines
    # One bit flipped in the payload (a disk error): ds4 would load it; the checksum says no.
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    s.path.write_bytes(bytes(flipped))
    code, out = run(tmp_path, "verify")
    assert code == 1 and f"INVALID  {s.path.name}  {E.CHECKSUM_MISMATCH}" in out.splitlines()


def test_rm(tmp_path, capsys):
    store, s = populate(tmp_path)
    code, out = run(tmp_path, "rm", s.id[:5])
    assert code == 0 and out.startswith(f"deleted session {s.id[:8]} (9 tokens) list this ✓ session")
    assert not s.path.exists() and store.list_sessions() == []
    code, _ = run(tmp_path, "rm", s.id[:5])
    assert code == 1 and f"no saved session matches {s.id[:5]}" in capsys.readouterr().err
    code, _ = run(tmp_path, "rm", "zz")
    assert code == 1 and capsys.readouterr().err.strip() == "ds4agent kv: no saved session matches zz"


def test_ls_and_rm_unreadable_session_files(tmp_path):
    _, s = populate(tmp_path)
    bad = tmp_path / ("ab" + "0" * 38 + ".kv")
    bad.write_bytes(s.path.read_bytes()[:100])
    code, out = run(tmp_path, "ls")
    row = next(line for line in out.splitlines() if line.startswith("  ab000000"))
    assert code == 0 and row.split()[:2] == ["ab000000", "unreadable"]
    assert row.endswith("(unreadable session: truncated cached text)") and "?" in row
    code, out = run(tmp_path, "rm", "ab")
    assert code == 0 and out == f"deleted unreadable session ab000000 (truncated cached text): {bad}\n"
    assert not bad.exists() and s.path.exists()


def test_cli_in_a_pipe_has_no_escape_codes(tmp_path):
    populate(tmp_path)
    r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "kv", "--kv-dir", str(tmp_path), "ls"],
                       capture_output=True, text=True, check=True)
    assert "agent-session" in r.stdout and "\x1b" not in r.stdout and r.stderr == ""


def test_kv_dir_before_the_subcommand_is_kept(tmp_path):
    populate(tmp_path)
    args = parse(["--kv-dir", str(tmp_path), "kv", "ls"])
    out = io.StringIO()
    assert kv.main(args, out=out) == 0 and "agent-session" in out.getvalue()


def test_kv_dir_from_environment(tmp_path, monkeypatch):
    populate(tmp_path)
    monkeypatch.setenv("DS4AGENT_KV_DIR", str(tmp_path))
    out = io.StringIO()
    assert kv.main(parse(["kv", "verify"]), out=out) == 0
    assert out.getvalue().endswith("2 file(s) checked, 0 invalid\n")


class _ClosedPipe(io.StringIO):
    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_pipe_reaches_the_cli_instead_of_exit_0(tmp_path):
    # `kv verify | head` with invalid files must not report success: the CLI turns the
    # BrokenPipeError into its quiet exit 141 (tests/test_smoke_cli.py); the kv command must not
    # swallow it as 0 or report it as an I/O error of the directory.
    populate(tmp_path)
    args = parse(["kv", "--kv-dir", str(tmp_path), "verify"])
    with pytest.raises(BrokenPipeError):
        kv.main(args, out=_ClosedPipe())


def test_verify_reports_kv_entries_that_are_not_regular_files(tmp_path):
    populate(tmp_path)
    os.mkfifo(tmp_path / ("d" * 40 + ".kv"))  # opening it would block: verify must not
    (tmp_path / ("c" * 40 + ".kv")).symlink_to(tmp_path / "gone")
    code, out = run(tmp_path, "verify")
    lines = out.splitlines()
    assert code == 1 and lines[-1] == "4 file(s) checked, 2 invalid"
    assert f"INVALID  {'d' * 40}.kv  not a regular file" in lines
    assert f"INVALID  {'c' * 40}.kv  No such file or directory" in lines


def test_show_by_prefix_explains_an_invalid_file(tmp_path, capsys):
    _, s = populate(tmp_path)
    bad = tmp_path / ("ab" + "0" * 38 + ".kv")
    bad.write_bytes(s.path.read_bytes()[:100])  # scan-invalid: no load prefix matches it ...
    code, out = run(tmp_path, "show", "ab0")
    assert code == 1  # ... but show names it and says why it is invalid
    assert f"file:           {bad}" in out and "INVALID: truncated cached text" in out
    code, out = run(tmp_path, "show", "")
    assert code == 1 and out == ""
    assert capsys.readouterr().err.strip() == "ds4agent kv: give a file path or a session id prefix"


def test_ls_columns_line_up_with_cache_file_names(tmp_path):
    populate(tmp_path)
    _, out = run(tmp_path, "ls")
    rows = out.splitlines()[1:]
    assert len(rows) == 2
    assert len({row.index(" agent-") for row in rows}) == 1


def test_odd_file_names_print_on_one_line_through_a_strict_utf8_stdout(tmp_path):
    # macOS's UTF-8 locale gives a strict stdout: a non-UTF-8 name (a surrogate in Python) must not
    # crash verify, and a newline or ESC in a name must not break the line or reach the terminal.
    try:
        with open(os.path.join(os.fsencode(tmp_path), b"\xff\xfe.kv"), "wb") as f:
            f.write(b"x")
        undecodable = True
    except OSError:  # APFS refuses names that are not UTF-8; the other two still apply
        undecodable = False
    (tmp_path / "a\x1b[31mred.kv").write_bytes(b"y")
    (tmp_path / "line\nbreak.kv").write_bytes(b"z")
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n")
    code = kv.main(parse(["kv", "--kv-dir", str(tmp_path), "verify"]), out=out)
    out.flush()
    lines = raw.getvalue().decode().splitlines()
    n = 2 + undecodable
    assert code == 1 and lines[-1] == f"{n} file(s) checked, {n} invalid"
    assert ("INVALID  \\xff\\xfe.kv  invalid KV header" in lines) == undecodable
    assert "INVALID  a\\x1b[31mred.kv  invalid KV header" in lines
    assert "INVALID  line\\nbreak.kv  invalid KV header" in lines


def test_ls_skips_invalid_files_with_a_hint_and_never_opens_a_fifo(tmp_path):
    populate(tmp_path)
    os.mkfifo(tmp_path / "sysprompt.kv")  # open() on it would block the listing forever
    (tmp_path / ("b" * 40 + ".kv")).write_bytes(b"KVC\x01junk")
    (tmp_path / "other.kv").write_bytes(b"KVC\x01junk")
    (tmp_path / "notes.txt").write_text("unrelated: not counted")
    code, out = run(tmp_path, "ls")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 5
    assert ["bbbbbbbb", "unreadable"] in [line.split()[:2] for line in lines]  # a session name: shown
    assert lines[-1] == "  (2 other .kv file(s) not listed: not valid KV files; see `ds4agent kv verify`)"


def test_s_file_from_an_earlier_ds4_is_listed_shown_and_verified(tmp_path):
    text = session_text("old ds4 session")
    path = tmp_path / (text_sha1(text) + ".kv")
    write_kvc(path, KVCHeader(2, 6, 0, 0, 5, 0, 64, 1_700_000_000, 1_700_000_000, 0), text,
              random_state(TINY, 5, 64), TINY)
    path.write_bytes(s_layout(path.read_bytes()))
    code, out = run(tmp_path, "ls")
    assert code == 0 and out.splitlines()[1].split()[:2] == [path.name[:8], "agent-session"]
    assert out.splitlines()[1].endswith("old ds4 session")
    code, out = run(tmp_path, "show", path.name[:8])
    assert code == 0 and "layout:         [S] (earlier ds4 build; a re-save writes [L] under a new name)" in out
    assert "title:          old ds4 session (derived: legacy session)" in out and "status:         ok" in out
    code, out = run(tmp_path, "verify")
    assert code == 0 and f"ok       {path.name}  agent-session, 5 tokens" in out


def sparse_session(directory, text_bytes, *, title=b"huge text", head=b""):
    """A stripped session whose header claims `text_bytes` of text, written as a sparse file (the
    text is `head` then a hole: no disk space, no memory). title None: a legacy session named by
    the SHA-1 of its text."""
    import hashlib
    import struct

    from ds4agent.sessions.kvc import session_identity

    created = 1_760_000_000
    if title is None:
        h = hashlib.sha1(head)
        zeros, left = bytes(1 << 20), text_bytes - len(head)
        while left:
            h.update(zeros[:min(left, len(zeros))])
            left -= min(left, len(zeros))
        name = h.hexdigest()
    else:
        name = session_identity(title, created)
    hdr = KVCHeader(2, 6, 0x08 if title is not None else 0, 0, 7, 0, 64, created, created, 0)
    path = directory / f"{name}.kv"
    with open(path, "wb") as f:
        f.write(hdr.pack() + struct.pack("<I", text_bytes) + head)
        f.seek(52 + text_bytes)
        if title is not None:
            f.write(struct.pack("<I", len(title)) + title)
        f.truncate()
    return path


def test_a_4_gib_text_claim_is_listed_shown_verified_and_removed_without_reading_it(tmp_path):
    """A header claiming a 4 GiB text (a sparse file) costs a listing nothing."""
    path = sparse_session(tmp_path, 0xFFFFFFFF, head=b"<\xef\xbd\x9cUser\xef\xbd\x9c>first words")
    assert path.stat().st_blocks * 512 < 1 << 20  # really sparse
    limit = 32 << 20
    (code, out), peak = peak_memory(lambda: run(tmp_path, "ls"))
    assert code == 0 and peak < limit and out.splitlines()[1].endswith("huge text")
    (code, out), peak = peak_memory(lambda: run(tmp_path, "show", path.name[:8]))
    assert code == 0 and peak < limit
    assert "text:           4294967295 bytes" in out and "status:         ok" in out
    assert "first words\\x00" in out and f"\\x00 ... ({0xFFFFFFFF - 400} more bytes)" in out
    (code, out), peak = peak_memory(lambda: run(tmp_path, "verify"))
    assert code == 0 and peak < limit and out.endswith("1 file(s) checked, 0 invalid\n")
    listed, peak = peak_memory(lambda: SessionStore(tmp_path).list_sessions())
    assert [s.title for s in listed] == [b"huge text"] and peak < limit
    (code, out), peak = peak_memory(lambda: run(tmp_path, "rm", path.name[:8]))
    assert code == 0 and peak < limit and out.startswith(f"deleted session {path.name[:8]} (7 tokens) huge text")
    assert not path.exists()


def test_a_long_legacy_text_is_verified_by_hashing_it_in_pieces(tmp_path):
    """A legacy name is the SHA-1 of the whole text: verify hashes it without holding it."""
    path = sparse_session(tmp_path, 64 << 20, title=None, head=b"<\xef\xbd\x9cUser\xef\xbd\x9c>legacy words")
    (code, out), peak = peak_memory(lambda: run(tmp_path, "verify"))
    assert code == 0 and f"ok       {path.name}  agent-session, 7 tokens" in out
    assert peak < 16 << 20
    (code, out), peak = peak_memory(lambda: run(tmp_path, "ls"))
    assert code == 0 and "  legacy words" in out.splitlines()[1] and peak < 16 << 20


def test_ls_shows_the_list_columns_for_every_model_or_one(tmp_path):
    """id, kind, model, age, tokens, size, the stripped mark and the title; newest use first
    (creation where a header has no last use); --model-id N keeps that model's files (and the
    unreadable ones, whose model is unknown), --all every model's."""
    store = SessionStore(tmp_path)
    full = store.save_session(session_text("full flash"), random_state(TINY, 9, 64), shape=TINY, quant_bits=2,
                              now=1_760_000_000)
    stripped = store.save_session(session_text("stripped flash"), None, shape=None, quant_bits=2, n_tokens=30,
                                  ctx=64, now=1_760_000_200)
    pro = store.save_session(session_text("other model"), None, shape=None, quant_bits=2, n_tokens=12, ctx=64,
                             model_id=1, created_at=1_760_000_100, now=1_760_000_100)
    with open(pro.path, "r+b") as f:  # no last_used: ordered by its creation
        f.seek(32)
        f.write((0).to_bytes(8, "little"))
    broken = tmp_path / ("ee" + "0" * 38 + ".kv")
    broken.write_bytes(b"KVC\x01 broken")
    os.utime(broken, (1_700_000_000, 1_700_000_000))

    def rows(*argv):
        code, out = run(tmp_path, "ls", *argv)
        assert code == 0
        return out.splitlines()

    everything = rows()
    assert everything == rows("--all")
    assert everything[0] == f"KV files in {tmp_path}:"
    assert [line.split()[0] for line in everything[1:]] == [stripped.id[:8], pro.id[:8], full.id[:8], "ee000000"]
    assert everything[1].split()[1:3] == ["agent-session", "flash"] and everything[2].split()[2] == "pro"
    assert "30 tokens" in everything[1] and everything[1].endswith("stripped  stripped flash")
    assert "stripped" not in everything[3] and everything[3].endswith("full flash")
    flash = rows("--model-id", "0")
    assert flash[0] == f"KV files in {tmp_path} for model flash:"
    assert [line.split()[0] for line in flash[1:-1]] == [stripped.id[:8], full.id[:8], "ee000000"]
    assert flash[-1] == "  (1 file(s) of other models not listed: `ds4agent kv ls --all`)"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["kv", "ls", "--all", "--model-id", "0"])


def test_ls_fits_columns_cutting_titles_and_long_file_names_with_an_ellipsis(tmp_path, monkeypatch):
    store, s = populate(tmp_path)
    long_title = "Investigate why the integration tests for the payment gateway fail on Tuesdays only"
    store.save_session(session_text(long_title), random_state(TINY, 9, 64), shape=TINY, quant_bits=2,
                       now=1_760_000_200)
    monkeypatch.setenv("COLUMNS", "80")
    code, out = run(tmp_path, "ls")
    lines = out.splitlines()[1:]
    assert code == 0 and len(lines) == 3
    assert all(len(line) <= 80 for line in lines), lines
    newest, cache, older = lines
    # The title is what gives way: its start stays, the rest becomes "…".
    assert newest.split()[1] == "agent-session" and newest.endswith("…") and "  Invest" in newest
    name = cache.split()[0]  # a cache file's long name keeps its start
    assert name.startswith("sysprom") and name.endswith("…") and cache.endswith("508.0 KiB")  # the size stays whole
    assert older.split()[0] == s.id[:8] and older.endswith("…") and "  list" in older
    monkeypatch.setenv("COLUMNS", "200")  # wide enough: nothing is cut
    lines = run(tmp_path, "ls")[1].splitlines()
    assert lines[3].endswith("list this ✓ session") and "sysprompt-" in lines[2] and ".kv" in lines[2]


def test_ls_fit_row_keeps_the_other_columns_whole():
    assert kv.fit_row("  abc  1 tokens", "a long title here", 0) == "  abc  1 tokens  a long title here"
    assert kv.fit_row("  abc  1 tokens", "a long title here", 24) == "  abc  1 tokens  a long…"
    assert kv.fit_row("  abc  1 tokens", "", 10) == "  abc  1 …"
