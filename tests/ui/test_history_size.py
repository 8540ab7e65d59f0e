"""A huge paste is recalled in this run but never written to the history file."""

import json

from ds4agent.ui.history import MAX_SAVED_CHARS, InputHistory


def test_a_360_kb_paste_is_not_stored_whole(tmp_path):
    path = tmp_path / "history.json"
    h = InputHistory(path)
    paste = "x" * 360_000
    h.add("small")
    h.add(paste)
    h.add("after")
    assert json.loads(path.read_text()) == ["small", "after"]
    assert path.stat().st_size < 100
    assert h.previous("") == "after" and h.previous("") == paste  # recall still has it this run
    assert InputHistory(path).entries == ["small", "after"]


def test_an_entry_at_the_limit_is_kept(tmp_path):
    h = InputHistory(tmp_path / "history.json")
    h.add("y" * MAX_SAVED_CHARS)
    assert InputHistory(tmp_path / "history.json").entries == ["y" * MAX_SAVED_CHARS]
