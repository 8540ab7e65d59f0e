"""SessionIdentity's journal meta round trip, and the one decode loop (TokenStream)."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx

from ds4agent.agent.decode import TokenStream
from ds4agent.agent.identity import SessionIdentity, meta_title, undo_log_for


def test_identity_survives_the_journal_meta_exactly(tmp_path):
    ckpt = undo_log_for("ab12", tmp_path)
    ident = SessionIdentity(title=b"caf\xe9 \xff", created_at=1700000000, session_id="f" * 40,
                            legacy_path="/kv/old.kv", forked_from="e" * 40, dirty=False, activity=True,
                            undo=ckpt)
    meta = ident.to_meta()
    assert meta["title_hex"] == "636166e920ff" and meta["checkpoints"] == "ab12"
    back = SessionIdentity.from_meta(meta, tmp_path)
    # A journal is only resumed when it has unsaved turns: dirty and active whatever it says.
    assert (back.title, back.created_at, back.session_id, back.legacy_path, back.forked_from) == \
        (b"caf\xe9 \xff", 1700000000, "f" * 40, "/kv/old.kv", "e" * 40)
    assert back.dirty and back.activity and back.unsaved_work
    assert back.undo is not None and back.undo.key == "ab12" and back.undo.root == tmp_path


def test_identity_meta_of_a_new_conversation_and_of_odd_journals(tmp_path):
    assert SessionIdentity().to_meta() == {"title_hex": None, "created_at": None, "session_id": "",
                                           "legacy_path": None, "dirty": False, "forked_from": "",
                                           "checkpoints": ""}
    back = SessionIdentity.from_meta({"title": "older journal", "checkpoints": "../../etc"}, tmp_path)
    assert back.title == b"older journal" and back.undo is None  # never a path to follow
    assert meta_title({"title_hex": "zz"}) is None


class _Session:
    """The engine's decode seam over fake logits (the step count); records the tokens that were
    accepted into the session (stepped)."""

    def __init__(self) -> None:
        self.stepped: list[int] = []
        self.engine = SimpleNamespace(ctx=1000)

    def __len__(self) -> int:
        return len(self.stepped)

    @property
    def next_logits(self) -> object:
        return mx.array(len(self.stepped))

    def dispatch(self, token: object) -> object:
        return len(self.stepped)

    def accept(self, pending: object, token: int) -> None:
        assert pending == len(self.stepped)
        self.stepped.append(token)

    def settle(self) -> None:
        pass


class _Sampler:
    key = None

    def __init__(self) -> None:
        self.calls: list[tuple[object, bool]] = []

    def draw(self, logits: object, *, greedy: bool = False) -> object:
        self.calls.append((int(logits.item()), greedy))  # type: ignore[attr-defined]
        return mx.array(100 + len(self.calls), dtype=mx.int32)


def test_token_stream_steps_only_the_tokens_the_caller_goes_past():
    session, sampler = _Session(), _Sampler()
    flags = iter([True, False, True])
    stream = TokenStream(session, sampler, limit=10, greedy=lambda: next(flags))
    got = []
    for token in stream:
        got.append(token)
        if len(got) == 3:
            break  # like an EOS: never kept
    assert got == [101, 102, 103] and session.stepped == [101, 102]
    assert sampler.calls == [(0, True), (1, False), (2, True)]  # each token sampled on the last step's logits
    assert not stream.interrupted


def test_token_stream_limit_and_interrupt():
    session = _Session()
    # The last token of the cap is handed out without a step: the session holds the others.
    assert list(TokenStream(session, _Sampler(), limit=4, greedy=lambda: False)) == [101, 102, 103, 104]
    assert session.stepped == [101, 102, 103]
    stops = iter([False, False, True])
    session = _Session()
    stream = TokenStream(session, _Sampler(), limit=10, greedy=lambda: True, should_stop=lambda: next(stops))
    assert list(stream) == [101, 102] and stream.interrupted and session.stepped == [101, 102]
