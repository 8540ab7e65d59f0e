"""The one UTF-8-safe byte cut (ds4agent/utf8.py): never inside a character, at most 3 bytes short."""

from ds4agent import utf8


def test_a_short_input_is_returned_whole():
    assert utf8.cut(b"abc", 3) == b"abc"
    assert utf8.cut(b"", 0) == b""


def test_the_cut_moves_back_off_continuation_bytes():
    euro = "€".encode()  # e2 82 ac
    assert utf8.cut(b"ab" + euro, 2) == b"ab"
    assert utf8.cut(b"ab" + euro, 3) == b"ab"  # the first byte cut off is 0x82
    assert utf8.cut(b"ab" + euro, 4) == b"ab"
    assert utf8.cut(b"ab" + euro + b"c", 5) == b"ab" + euro
    emoji = "😀".encode()  # four bytes: the cut moves back 3 at most
    assert utf8.cut(b"x" + emoji + b"y", 4) == b"x"


def test_never_more_than_three_bytes_back():
    # Not UTF-8: a run of continuation bytes is cut at most 3 bytes before the limit.
    assert utf8.cut(b"a" + b"\x80" * 10, 8) == b"a" + b"\x80" * 4
