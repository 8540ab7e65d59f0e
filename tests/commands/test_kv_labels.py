"""`kv ls`: a session is labelled with the model file it was saved with (the tiny test model's
sessions are not "flash"), and sizes use the unit that shows them (a stripped session is bytes, not 0.0 MiB)."""

import io

import pytest

from ds4agent.cli import parse
from ds4agent.commands import kv
from ds4agent.sessions.index import SessionIndex
from ds4agent.sessions.store import SessionStore
from tests.sessions.helpers import TINY, random_state, session_text


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")


def _ls(directory) -> list[str]:
    out = io.StringIO()
    assert kv.main(parse(["kv", "--kv-dir", str(directory), "ls"]), out=out) == 0
    return out.getvalue().splitlines()


def test_a_session_is_labelled_with_its_model_file_and_a_stripped_one_in_kib(tmp_path):
    store = SessionStore(tmp_path)
    tiny = store.save_session(session_text("on the tiny model"), random_state(TINY, 9, 64), shape=TINY,
                              quant_bits=2, now=1_760_000_000)
    # A stripped session: text only, no state (what /strip writes).
    other = store.save_session(session_text("no record"), None, shape=None, quant_bits=2, model_id=0,
                               n_tokens=5, ctx=64, now=1_760_000_050)
    SessionIndex(tmp_path).record(tiny.id, cwd=tmp_path, model="/m/tiny.gguf", fingerprint="tiny.gguf:28729984:ab")
    rows = {line.split()[0]: line for line in _ls(tmp_path)[1:]}
    assert rows[tiny.id[:8]].split()[2] == "tiny.gguf"
    assert rows[other.id[:8]].split()[2] == "flash"  # nothing recorded: the header's model id
    stripped = rows[other.id[:8]]
    assert "stripped" in stripped and " 152 B " in stripped and "MiB" not in stripped


def test_sizes_use_the_unit_that_shows_them():
    from ds4agent.ui.fmt import format_size

    assert format_size(152) == "152 B"
    assert format_size(4 * 1024 + 512) == "4.5 KiB"
    assert format_size(3 * 1024 * 1024 + 512 * 1024) == "3.5 MiB"
    assert format_size(81 * (1 << 30)) == "81.0 GiB"
