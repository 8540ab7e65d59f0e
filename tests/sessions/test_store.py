"""The session directory (kvc-format.md §6, §10, §12): naming, listing, prefixes, deletion, titles."""

import os
import struct
import time

import pytest

from ds4agent.sessions import errors as E
from ds4agent.sessions.entries import default_kv_dir, touch
from ds4agent.sessions.errors import KVCError, KVCIOError, KVCStoreError, KVCTextError, KVCWriteError
from ds4agent.sessions.kvc import KVCHeader, session_identity, text_sha1, verify_kvc, write_kvc
from ds4agent.sessions.store import SYSPROMPT_KEEP, SessionStore
from ds4agent.sessions.titles import clip_title, derive_title, display_text

from .helpers import ASSISTANT, TINY, USER, assert_states_equal, random_state, s_layout, session_text

CTX = 64


class Clock:
    def __init__(self, t=1_760_000_000):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    return SessionStore(tmp_path / "kv", clock=clock)


def save(store, text, T=5, **kw):
    return store.save_session(text, random_state(TINY, T, CTX, seed=T), shape=TINY, quant_bits=2, **kw)


def load(store, target):
    return store.load_session(target, shape=TINY, ctx=CTX, model_id=0, quant_bits=2)


# --- directory -----------------------------------------------------------------------------------

def test_default_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("DS4AGENT_KV_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_kv_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert default_kv_dir() == tmp_path / "env"
    monkeypatch.delenv("DS4AGENT_KV_DIR")
    assert default_kv_dir() == tmp_path / "home" / ".ds4" / "kvcache"
    monkeypatch.setenv("HOME", "")
    assert default_kv_dir() == default_kv_dir(None) == __import__("pathlib").Path(".ds4/kvcache")


def test_directory_created_0700_and_files_0600(tmp_path, clock):
    store = SessionStore(tmp_path / "a" / "b", clock=clock)
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    saved = save(store, session_text("hi"))
    assert saved.path.stat().st_mode & 0o777 == 0o600


def test_unwritable_directory_gives_a_clear_error_and_keeps_files(tmp_path, clock, monkeypatch):
    store = SessionStore(tmp_path / "kv", clock=clock)
    first = save(store, session_text("keep me"))
    before = first.path.read_bytes()
    # chmod cannot stop root (tests may run as root in containers): refuse the temp file the way an
    # unwritable directory does instead.
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(KVCWriteError, match="^Permission denied$"):
        save(store, session_text("keep me"), title=first.title, created_at=first.created_at)
    assert [p.name for p in store.directory.iterdir()] == [first.path.name]
    assert first.path.read_bytes() == before


def test_directory_that_cannot_be_created(tmp_path):
    # The message names the directory: the agent shows str(err) as its one startup line.
    (tmp_path / "file").write_text("x")
    with pytest.raises(KVCIOError) as info:
        SessionStore(tmp_path / "file" / "kv")
    assert str(info.value) == (f"KV directory {tmp_path / 'file' / 'kv'} cannot be created: "
                               f"{tmp_path / 'file'} is a file, not a directory")
    assert info.value.with_path() == str(info.value)  # not "<dir>: ... <dir>: ..."


def test_directory_path_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(KVCIOError, match="^KV directory .*f is a file, not a directory$"):
        SessionStore(tmp_path / "f")


def test_unreadable_directory_names_itself(store, monkeypatch):
    def refuse(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "listdir", refuse)  # chmod cannot stop root: refuse the listing instead
    with pytest.raises(KVCIOError) as info:
        store.list_sessions()
    assert str(info.value) == f"cannot read KV directory {store.directory}: Permission denied"


# --- save / load -----------------------------------------------------------------------------------

def test_save_names_by_identity_and_loads_back(store, clock):
    text = session_text("Which Python files are here?")
    state = random_state(TINY, 11, CTX, seed=3)
    saved = store.save_session(text, state, shape=TINY, quant_bits=2)
    assert saved.title == b"Which Python files are here?"
    assert saved.created_at == clock.t
    assert saved.path.name == session_identity(saved.title, clock.t) + ".kv"
    assert saved.message == f"saved session {saved.id[:8]} (11 tokens)"
    loaded = load(store, saved.id[:6].upper())
    assert loaded.text == text and loaded.title == saved.title and not loaded.legacy
    assert loaded.created_at == clock.t and loaded.header.reason == 6 and loaded.header.ext_flags == 0x88  # title, checksum
    assert_states_equal(state, loaded.payload)
    assert load(store, saved.path).id == saved.id  # a path works too


def test_resave_keeps_the_name_and_created_at(store, clock):
    first = save(store, session_text("task"))
    clock.t += 500
    again = save(store, session_text("task", "more"), T=9, title=first.title, created_at=first.created_at)
    assert again.path == first.path and again.created_at == first.created_at
    h = load(store, again.id).header
    assert (h.created_at, h.last_used, h.tokens) == (first.created_at, clock.t, 9)


def test_a_save_never_deletes_another_session_whose_text_is_a_prefix(store, clock):
    """A /fork kept as a bookmark (its text a prefix of the parent's later text), or any other
    session: a save deletes no file but this session's own earlier one."""
    t1 = session_text("conv")
    a = save(store, t1, T=3)
    clock.t += 1
    b = save(store, t1 + b" more", T=4, title=b"explicit other title")  # different identity, longer text
    same_text = save(store, t1 + b" more", T=4, title=b"twin")
    unrelated = save(store, session_text("other conversation"), T=5)
    cp_path = store.directory / (text_sha1(t1) + ".kv")
    write_kvc(cp_path, KVCHeader(2, 2, 0, 0, 3, 0, CTX, 1, 1, 0), t1, random_state(TINY, 3, CTX), TINY)
    cache = store.save_sysprompt(t1[:10], random_state(TINY, 2, CTX), shape=TINY, quant_bits=2)
    clock.t += 1
    final = save(store, t1 + b" more and more", T=6, title=b"final")
    assert b.deleted == same_text.deleted == final.deleted == ()
    names = {p.name for p in store.directory.iterdir()}
    assert names == {a.path.name, b.path.name, same_text.path.name, final.path.name, unrelated.path.name,
                     cp_path.name, cache.name}
    assert {s.id for s in store.list_sessions()} == {a.id, b.id, same_text.id, final.id, unrelated.id}


def test_save_deletes_the_legacy_source(store, clock):
    text = session_text("old style")
    legacy = store.directory / (text_sha1(text) + ".kv")
    write_kvc(legacy, KVCHeader(2, 6, 0, 0, 4, 0, CTX, 1_700_000_000, 1_700_000_000, 0), text,
              random_state(TINY, 4, CTX), TINY)
    loaded = load(store, legacy.name[:8])
    assert loaded.legacy and loaded.title == b"old style" and loaded.created_at == 1_700_000_000
    saved = save(store, text + b"x", title=loaded.title, created_at=loaded.created_at, loaded_from=loaded.path)
    assert legacy in saved.deleted and not legacy.exists()
    assert saved.path.name == session_identity(b"old style", 1_700_000_000) + ".kv"


def test_legacy_file_with_zero_created_at_gets_load_time(store, clock):
    text = session_text("zero")
    path = store.directory / (text_sha1(text) + ".kv")
    write_kvc(path, KVCHeader(2, 6, 0, 0, 4, 0, CTX, 0, 0, 0), text, random_state(TINY, 4, CTX), TINY)
    assert load(store, path).created_at == clock.t


def test_stripped_session_round_trip(store):
    text = session_text("strip me")
    saved = store.save_session(text, None, shape=None, quant_bits=4, n_tokens=42, ctx=CTX)
    loaded = load(store, saved.id)
    assert loaded.payload is None and loaded.text == text and loaded.header.tokens == 42
    assert loaded.header.payload_bytes == 0


def test_failed_save_leaves_the_old_file_and_no_temp(store, monkeypatch):
    first = save(store, session_text("keep"))
    before = first.path.read_bytes()

    import ds4agent.sessions.kvc as kvc

    def explode(f, state, shape):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kvc, "write_payload", explode)
    with pytest.raises(KVCWriteError, match="No space left on device"):
        save(store, session_text("keep"), title=first.title, created_at=first.created_at)
    assert first.path.read_bytes() == before
    assert [p.name for p in store.directory.iterdir()] == [first.path.name]


def test_text_and_title_too_large_are_refused_before_writing(store, monkeypatch):
    import ds4agent.sessions.kvc as kvc

    monkeypatch.setattr(kvc, "U32_MAX", 3)  # stands in for 0xFFFFFFFF: no 4 GiB test data
    hdr = KVCHeader(2, 6, 8, 0, 1, 0, CTX, 1, 1, 0)
    with pytest.raises(KVCTextError, match=f"^{E.TEXT_TOO_LARGE}$"):
        write_kvc(store.directory / "x.kv", hdr, b"abcd", None, None, b"t")
    with pytest.raises(KVCError, match=f"^{E.TITLE_TOO_LARGE}$"):
        write_kvc(store.directory / "x.kv", hdr, b"abc", None, None, b"long")
    assert list(store.directory.iterdir()) == []


# --- listing and prefixes --------------------------------------------------------------------------

def test_list_newest_first_reason6_only(store, clock):
    ids = []
    for i, title in enumerate((b"first", b"second", b"third")):
        clock.t = 1_760_000_000 + [30, 10, 20][i]
        ids.append(save(store, session_text(f"s{i}"), title=title).id)
    store.save_sysprompt(b"sys", random_state(TINY, 2, CTX), shape=TINY, quant_bits=2)
    listed = store.list_sessions()
    assert [s.title for s in listed] == [b"first", b"third", b"second"]
    assert [s.id for s in listed] == [ids[0], ids[2], ids[1]]


def test_listing_ignores_junk_and_reports_unreadable_session_files(store, clock):
    """Junk names are ignored; a 40-hex `.kv` that cannot be read is listed apart, with the reason
   , and its prefix says why it cannot be loaded instead of "no match"."""
    good = save(store, session_text("good"))
    d = store.directory
    (d / "notes.txt").write_text("hello")
    (d / ("a" * 40 + ".kv")).write_bytes(b"KVC\x01" + b"\0" * 100)  # bad header
    (d / ("b" * 40 + ".kv")).write_bytes(good.path.read_bytes()[:200])  # shorter than its header says
    (d / ("c" * 40 + ".kv")).mkdir()
    (d / "sysprompt.kv").write_bytes(good.path.read_bytes())
    (d / ("d" * 40 + ".kv.tmp.abc123")).write_bytes(good.path.read_bytes())
    (d / ("E" * 40 + ".kv")).write_bytes(b"\xff" * 3000)
    (d / ("f" * 40 + ".kv")).write_bytes(good.path.read_bytes()[:-14])  # title trailer cut short
    checkpoint = bytearray(good.path.read_bytes()[:300])
    checkpoint[5] = 2  # a damaged server checkpoint (valid header, reason 2): not a session, not listed
    (d / ("9" * 40 + ".kv")).write_bytes(bytes(checkpoint))
    sessions, unreadable = store.scan_sessions()
    assert [s.id for s in sessions] == [s.id for s in store.list_sessions()] == [good.id]
    assert sorted((u.id[:2], u.reason) for u in unreadable) == [
        ("aa", E.INVALID_HEADER), ("bb", E.SHORTER_THAN_HEADER), ("cc", "not a regular file"),
        ("ee", E.INVALID_HEADER), ("ff", E.TRUNCATED_TITLE)]
    assert unreadable[0].display_title == f"(unreadable session: {unreadable[0].reason})"
    with pytest.raises(KVCStoreError, match=f"^session bbbbbbbb cannot be loaded: {E.SHORTER_THAN_HEADER}$"):
        store.resolve("bbb")
    with pytest.raises(KVCError, match=f"^{E.TRUNCATED_TITLE}$"):  # scan-valid: the load chain says why
        load(store, "fff")
    with pytest.raises(KVCStoreError, match="^no saved session matches 999$"):
        store.resolve("999")


def test_unreadable_session_files_are_deleted_by_prefix(store):
    good = save(store, session_text("good"))
    bad = store.directory / ("ab" + "0" * 38 + ".kv")
    bad.write_bytes(b"not a kv file at all")
    unreadable = store.directory / ("ac" + "0" * 38 + ".kv")
    unreadable.write_bytes(good.path.read_bytes())
    unreadable.chmod(0)
    assert store.delete("ab") == bad and not bad.exists()
    assert store.delete("ac") == unreadable and not unreadable.exists()
    assert store.delete(good.id[:8]) == good.path
    assert store.scan_sessions() == ([], [])


def test_resolve_errors(store, clock):
    a = save(store, session_text("a"), title=b"a")
    b = save(store, session_text("b"), title=b"b")
    assert store.resolve(a.id).path == a.path
    assert store.resolve(a.id[:8].upper()).path == a.path
    common = os.path.commonprefix([a.id, b.id])
    with pytest.raises(KVCStoreError, match=f"^session prefix {common} is ambiguous$") if common else \
            pytest.raises(KVCStoreError, match="^give a session id prefix$"):
        store.resolve(common)
    for bad in ("xyz", "zzz", "0" * 41, "12 4"):  # no id looks like that: no session matches
        with pytest.raises(KVCStoreError, match=f"^no saved session matches {bad}$"):
            store.resolve(bad)
    with pytest.raises(KVCStoreError, match="^give a session id prefix$"):
        store.resolve("")
    missing = next(c for c in "0123456789abcdef" if not a.id.startswith(c) and not b.id.startswith(c))
    with pytest.raises(KVCStoreError, match=f"^no saved session matches {missing}$"):
        store.resolve(missing)


def test_ambiguous_prefix_with_crafted_names(store):
    a = save(store, session_text("x"))
    data = a.path.read_bytes()
    for name in ("ab" + "0" * 38, "ab" + "1" * 38):
        (store.directory / f"{name}.kv").write_bytes(data)  # valid scan entries (identity not checked)
    with pytest.raises(KVCStoreError, match="^session prefix AB is ambiguous$"):
        store.resolve("AB")
    assert store.resolve("ab0").id == "ab" + "0" * 38


def test_delete(store):
    a = save(store, session_text("a"), title=b"a")
    b = save(store, session_text("b"), title=b"b")
    assert store.delete(a.id[:10]) == a.path
    assert not a.path.exists() and b.path.exists()
    with pytest.raises(KVCStoreError):
        store.delete(a.id[:10])


def test_load_errors_are_kvc_errors(store):
    with pytest.raises(KVCStoreError):
        load(store, "abcdef")
    with pytest.raises(KVCError):
        load(store, store.directory / "missing.kv")


# --- titles ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,title", [
    (b"x" + USER + b"  hello \t\n world  " + ASSISTANT + b"answer", b"hello world"),
    (USER + "  日本語の  タイトル\u3000です ".encode() + USER + b"second", "日本語の タイトル\u3000です".encode()),
    (USER + b"\x0b\x0c\r\n" + ASSISTANT, b"(empty user prompt)"),
    (b"no user turn here", b"(no user prompt)"),
    (USER + b"runs to the end\xe2\x82", b"runs to the end\xe2\x82"),
    (USER + b"a\xc2\xa0b", b"a\xc2\xa0b"),  # U+00A0 is not C-locale whitespace
])
def test_derive_title(text, title):
    assert derive_title(text) == title


def test_clip_title_never_splits_a_character():
    assert clip_title(b"a" * 70) == b"a" * 70
    assert clip_title(b"a" * 71) == b"a" * 70 + b"..."
    euro = "€".encode()  # 3 bytes
    t = b"a" * 68 + euro + b"zz"  # byte 70 is inside the euro sign
    assert clip_title(t) == b"a" * 68 + b"..."
    t = b"a" * 69 + "é".encode() + b"x"
    assert clip_title(t) == b"a" * 69 + b"..."
    emoji = "😀".encode() * 30
    clipped = clip_title(emoji)
    assert clipped == "😀".encode() * 17 + b"..." and len(clipped) <= 73
    assert display_text(clipped) == "😀" * 17 + "..."


def test_list_shows_legacy_derived_title(store):
    text = session_text("legacy title")
    write_kvc(store.directory / (text_sha1(text) + ".kv"), KVCHeader(2, 6, 0, 0, 4, 0, CTX, 5, 5, 0), text,
              random_state(TINY, 4, CTX), TINY)
    [info] = store.list_sessions()
    assert info.title == b"legacy title" and info.legacy


# --- system-prompt caches ------------------------------------------------------------------------------

def test_sysprompt_round_trip_touch_and_mismatch(store, clock):
    text = b"<sys prompt v1>"
    state = random_state(TINY, 3, CTX)
    path = store.save_sysprompt(text, state, shape=TINY, quant_bits=2)
    assert path.name.startswith("sysprompt-") and path.name != "sysprompt.kv"
    clock.t += 100
    back = store.load_sysprompt(text, shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    assert_states_equal(state, back)
    h = KVCHeader.unpack(path.read_bytes()[:48])
    assert (h.hits, h.last_used, h.created_at) == (1, clock.t, clock.t - 100)
    # The hit accounting rewritten in place is outside the checksum: the touched cache loads
    # again (a user's third start) and verifies.
    clock.t += 100
    assert_states_equal(state, store.load_sysprompt(text, shape=TINY, ctx=CTX, model_id=0, quant_bits=2))
    assert KVCHeader.unpack(path.read_bytes()[:48]).hits == 2
    assert verify_kvc(path).error is None
    with pytest.raises(KVCError):  # other text -> other name -> missing
        store.load_sysprompt(b"<v2>", shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    with pytest.raises(KVCError, match=E.DIFFERENT_QUANT):
        store.load_sysprompt(text, shape=TINY, ctx=CTX, model_id=0, quant_bits=4)


def test_sysprompt_keeps_the_8_most_recently_used(store, clock):
    (store.directory / "sysprompt.kv").write_bytes(b"ds4-agent's own cache")
    for i in range(SYSPROMPT_KEEP + 3):
        clock.t += 1
        store.save_sysprompt(f"<sys {i}>".encode(), random_state(TINY, 2, CTX), shape=TINY, quant_bits=2)
        if i == 0:
            first = f"<sys {i}>".encode()
        if i == 5:  # refresh the first one: used recently
            clock.t += 1
            store.load_sysprompt(first, shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    names = sorted(p.name for p in store.directory.glob("sysprompt-*.kv"))
    assert len(names) == SYSPROMPT_KEEP
    assert store.sysprompt_path(first).name in names
    assert store.sysprompt_path(b"<sys 1>").name not in names
    assert (store.directory / "sysprompt.kv").read_bytes() == b"ds4-agent's own cache"


# --- housekeeping --------------------------------------------------------------------------------------

def test_stale_temp_files_are_removed_on_open(tmp_path, clock):
    d = tmp_path / "kv"
    d.mkdir()
    old, young = d / ("a" * 40 + ".kv.tmp.x1y2z3"), d / "sysprompt-0123456789abcdef.kv.tmp.999"
    foreign = d / "notes.kv.tmp.1"
    for p in (old, young, foreign):
        p.write_bytes(b"partial")
    past = clock.t - 25 * 3600
    os.utime(old, (past, past))
    os.utime(foreign, (past, past))
    os.utime(young, (clock.t - 3600, clock.t - 3600))
    SessionStore(d, clock=clock)
    assert not old.exists() and young.exists() and foreign.exists()


def test_touch_changes_only_hits_and_last_used(tmp_path):
    path = tmp_path / "f.kv"
    hdr = KVCHeader(2, 9, 0xF8, 3, 4, 7, CTX, 11, 12, 0, reserved=b"\x01\x02\x03")
    write_kvc(path, hdr, b"text", random_state(TINY, 4, CTX), TINY, title=b"t")
    before = path.read_bytes()
    touch(path, now=99)
    after = path.read_bytes()
    assert struct.unpack_from("<I", after, 12)[0] == 8 and struct.unpack_from("<Q", after, 32)[0] == 99
    assert after[:12] == before[:12] and after[16:32] == before[16:32] and after[40:] == before[40:]


def test_wall_clock_default(tmp_path):
    store = SessionStore(tmp_path)
    saved = save(store, session_text("now"))
    assert abs(saved.created_at - time.time()) < 3600


def test_parents_are_created_0700(tmp_path):
    SessionStore(tmp_path / "home" / ".ds4" / "kvcache")
    for p in (tmp_path / "home", tmp_path / "home" / ".ds4", tmp_path / "home" / ".ds4" / "kvcache"):
        assert p.stat().st_mode & 0o777 == 0o700


def test_legacy_source_outside_the_store_is_never_deleted(store, tmp_path):
    text = session_text("backup")
    backup = tmp_path / (text_sha1(text) + ".kv")
    write_kvc(backup, KVCHeader(2, 6, 0, 0, 4, 0, CTX, 5, 5, 0), text, random_state(TINY, 4, CTX), TINY)
    loaded = load(store, backup)
    assert loaded.legacy
    saved = save(store, text + b"!", title=loaded.title, created_at=loaded.created_at, loaded_from=loaded.path)
    assert saved.deleted == () and backup.exists()


def test_duck_typed_engine_shape_and_state(store):
    """The engine hands out its own shape class and SimpleNamespace states (it may not import
    sessions): the store accepts anything with the contract's attribute names."""
    from types import SimpleNamespace

    class EngineShape:
        n_layers, head_dim, indexer_dim, vocab, window = 4, 8, 4, 129280, 8
        ratios = [0, 0, 4, 16]

    real = random_state(TINY, 7, CTX, seed=9)
    duck = SimpleNamespace(ctx=real.ctx, tokens=real.tokens, logits=real.logits,
                           layers=[SimpleNamespace(**vars(lp)) for lp in real.layers])
    saved = store.save_session(session_text("duck"), duck, shape=EngineShape(), quant_bits=2)
    loaded = store.load_session(saved.id, shape=EngineShape(), ctx=CTX, model_id=0, quant_bits=2)
    assert_states_equal(real, loaded.payload)
    store.save_sysprompt(b"<s>", duck, shape=EngineShape(), quant_bits=2)
    back = store.load_sysprompt(b"<s>", shape=EngineShape(), ctx=CTX, model_id=0, quant_bits=2)
    assert_states_equal(real, back)


def test_nearest_prefix_loads_the_longest_saved_prefix(store, clock):
    # A crash resume starts from the saved session whose text is the longest prefix of the
    # journal's; longer texts, other conversations and files with too many tokens do not count.
    short = save(store, b"<sys><user>hello", T=3, title=b"short")
    longer = save(store, b"<sys><user>hello<assistant>", T=5, title=b"longer")
    save(store, b"<sys><user>other", T=4, title=b"other")
    kw = dict(shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    hit = store.nearest_prefix(b"<sys><user>hello<assistant>more", max_tokens=9, **kw)
    assert hit.id == longer.id and len(hit.payload.tokens) == 5
    assert store.nearest_prefix(b"<sys><user>hello<assistant>more", max_tokens=4, **kw).id == short.id
    assert store.nearest_prefix(b"<sys><user>hello!", max_tokens=9, **kw).id == short.id
    assert store.nearest_prefix(b"unrelated", max_tokens=9, **kw) is None


def test_fifo_named_like_a_session_is_skipped_not_opened(store):
    good = save(store, session_text("good"))
    fifo = store.directory / ("f" * 40 + ".kv")
    os.mkfifo(fifo)
    assert [s.id for s in store.list_sessions()] == [good.id]
    with pytest.raises(KVCIOError, match="not a regular file"):
        load(store, fifo)


# --- symlinks and directory permissions -----------------------------------------------

def test_save_replaces_a_symlinked_name_and_never_writes_through_it(store, clock, tmp_path):
    """A link planted under a name the agent writes (the sysprompt cache is rewritten at every
    start, a session name is predictable) is replaced by a regular file; its target stays as it was."""
    victims = []
    for name in ("victim-sys", "victim-session"):
        victim = tmp_path / name
        victim.write_bytes(b"root:x:0:0::/root:/bin/sh\n")
        victims.append(victim)
    sys_text = b"system text"
    sys_link = store.sysprompt_path(sys_text)
    sys_link.symlink_to(victims[0])
    session_link = store.directory / (session_identity(b"linked", clock.t) + ".kv")
    session_link.symlink_to(victims[1])

    store.save_sysprompt(sys_text, random_state(TINY, 2, CTX), shape=TINY, quant_bits=2)
    saved = save(store, session_text("linked"), title=b"linked")

    assert saved.path == session_link
    for link, victim in ((sys_link, victims[0]), (session_link, victims[1])):
        assert victim.read_bytes() == b"root:x:0:0::/root:/bin/sh\n"
        assert not link.is_symlink() and link.is_file()
        assert link.stat().st_mode & 0o777 == 0o600
    assert load(store, saved.id).title == b"linked"
    store.load_sysprompt(sys_text, shape=TINY, ctx=CTX, model_id=0, quant_bits=2)


def test_loading_a_symlinked_cache_never_writes_its_target(store, clock, tmp_path):
    """Loading a cache touches its header (hits, last_used); through a link that would write into
    a file outside the directory, so the touch is skipped and the target keeps every byte."""
    sys_text = b"system text"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = SessionStore(elsewhere, clock=clock).save_sysprompt(sys_text, random_state(TINY, 2, CTX),
                                                                   shape=TINY, quant_bits=2)
    before = outside.read_bytes()
    store.sysprompt_path(sys_text).symlink_to(outside)
    clock.t += 100
    store.load_sysprompt(sys_text, shape=TINY, ctx=CTX, model_id=0, quant_bits=2)
    assert outside.read_bytes() == before


def test_existing_loose_directory_is_tightened_to_0700(tmp_path, clock):
    loose = tmp_path / "kv"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)  # whatever the umask did
    store = SessionStore(loose, clock=clock)
    assert loose.stat().st_mode & 0o777 == 0o700
    assert store.notices == []


def test_loose_directory_that_cannot_be_tightened_is_reported(tmp_path, clock, monkeypatch):
    loose = tmp_path / "kv"
    loose.mkdir()
    os.chmod(loose, 0o777)

    def refuse(path, mode, **kw):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)  # root may chmod anything: refuse the way a foreign owner does
    store = SessionStore(loose, clock=clock)
    assert store.notices == [f"KV directory {loose} is open to other users (mode 0777) and could not be "
                             "restricted to 0700: Operation not permitted"]


# --- [S] files from earlier ds4 builds (kvc-format.md §13) ------------------------------

def write_s_session(store, text, T=4, created=1_700_000_000, seed=0):
    """What an earlier ds4-agent wrote: no title trailer, named SHA-1 of the text, byte 20 = 0,
    payload version 1, otherwise the bytes of a legacy [L] file."""
    path = store.directory / (text_sha1(text) + ".kv")
    state = random_state(TINY, T, CTX, seed=seed)
    write_kvc(path, KVCHeader(2, 6, 0, 0, T, 0, CTX, created, created, 0), text, state, TINY)
    path.write_bytes(s_layout(path.read_bytes()))
    return path, state


def test_s_session_is_listed_loaded_and_resaved_in_the_current_layout(store, clock):
    text = session_text("from an earlier ds4")
    s_path, state = write_s_session(store, text)
    s_bytes = s_path.read_bytes()
    listed = store.list_sessions()
    assert [(i.id, i.title, i.legacy) for i in listed] == [(s_path.name[:40], b"from an earlier ds4", True)]

    loaded = load(store, s_path.name[:8])
    assert loaded.legacy and loaded.title == b"from an earlier ds4" and loaded.created_at == 1_700_000_000
    assert loaded.header.layout == "[S]" and loaded.text == text
    assert_states_equal(state, loaded.payload)

    saved = save(store, text + b"more", title=loaded.title, created_at=loaded.created_at, loaded_from=loaded.path)
    assert saved.path.name == session_identity(b"from an earlier ds4", 1_700_000_000) + ".kv"
    data = saved.path.read_bytes()
    assert data[20] == 2 and data[6] & 0x08  # [L] with a title trailer
    assert saved.deleted == () and s_path.read_bytes() == s_bytes  # the [S] source is kept, untouched
    assert load(store, saved.id).header.layout == "[L]"


def test_s_files_are_never_deleted_as_prefix_ancestors(store, clock):
    """An [S] file may belong to an earlier ds4 sharing the directory: kept like any session."""
    text = session_text("shared")
    s_path, _ = write_s_session(store, text)
    saved = save(store, text + b" and more", title=b"shared")
    assert s_path.exists() and s_path not in saved.deleted


def test_a_bit_flipped_on_disk_is_refused_at_load(tmp_path):
    """ds4 checks no checksum: a flipped bit in the payload loads as a different KV state. ds4agent
    writes a CRC-32 trailer (ext bit 0x80, the file's last 12 bytes) and checks it before parsing."""
    from ds4agent.sessions.errors import KVCIntegrityError

    store = SessionStore(tmp_path)
    saved = save(store, session_text("flip"))
    data = bytearray(saved.path.read_bytes())
    assert data[6] & 0x80 and data[-12:-8] == b"DS4C"
    data[len(data) // 2] ^= 0x04
    saved.path.write_bytes(bytes(data))
    with pytest.raises(KVCIntegrityError, match="damaged after it was written"):
        load(store, saved.id)


@pytest.mark.parametrize("at", [24, 27, 31])  # created_at: header bytes no other check reads
def test_the_checksum_covers_the_header_but_its_hit_accounting(tmp_path, at):
    from ds4agent.sessions.errors import KVCIntegrityError

    path = SessionStore(tmp_path).save_sysprompt(b"<sys>", random_state(TINY, 3, CTX), shape=TINY, quant_bits=2)
    touch(path, now=12345)
    assert verify_kvc(path).error is None  # hits and last_used are not summed
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    err = verify_kvc(path).error
    assert isinstance(err, KVCIntegrityError)


def test_a_version_1_checksum_still_verifies(tmp_path):
    """Files written before the hit accounting left the checksum (trailer version 1: a CRC of the
    raw bytes) load as long as they were not touched."""
    import zlib

    store = SessionStore(tmp_path)
    saved = save(store, session_text("v1"))
    data = bytearray(saved.path.read_bytes())
    body = bytes(data[:-12])
    data[-12:] = struct.pack("<4sII", b"DS4C", 1, zlib.crc32(body))
    saved.path.write_bytes(bytes(data))
    assert verify_kvc(saved.path).error is None
    load(store, saved.id)


def test_titles_show_no_c1_controls_or_bidi_overrides():
    # 0x9B is CSI to a terminal (the start of an escape sequence); U+202E reverses what follows.
    title = "a\u009b31mred\u202egnp.exe\u2066x\u2069".encode()
    assert display_text(title) == "a\ufffd31mred\ufffdgnp.exe\ufffdx\ufffd"
    assert display_text("naïve — ok ✓".encode()) == "naïve — ok ✓"  # ordinary text untouched
