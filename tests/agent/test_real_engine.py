"""Sessions with the real engine on the tiny test model: save, /new, /load, and the next turn
prefills only the new suffix and continues exactly as an uninterrupted run (same --seed)."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.protocol import template
from tests.support.agent_harness import AgentHarness, of
from tests.support.real_engine import real_agent, reference_ids


def _record_prefills(h: AgentHarness) -> list[int]:
    counts: list[int] = []
    session = h.worker.session
    real = session.sync

    def sync(tokens, **kw):
        n = real(tokens, **kw)
        counts.append(n)
        return n

    session.sync = sync
    return counts


def test_save_new_load_continues_exactly(tmp_path, tiny_model):
    from ds4agent.sessions.store import SessionStore

    kv = SessionStore(tmp_path / "kv")
    reference = reference_ids(real_agent(tmp_path / "a", tiny_model, kv))

    b = real_agent(tmp_path / "b", tiny_model, kv)
    assert of(b.events, ev.Ready)[0].sysprompt_cached  # the first run stored the system prefix KV
    b.turn("hello there")
    first = b.ids
    saved = of(b.command(b.agent.save), ev.SessionSaved)[0]
    assert saved.tokens == len(first) and b.live == tuple(first)
    b.command(b.agent.new)
    assert b.ids == b.worker.conv.system_ids
    # A turn in between draws from the sampler's RNG; the RNG is not part of a saved session
    # (kvc-format.md §9): --seed re-seeds it at every user turn, so the continuation after the
    # load still matches the uninterrupted run (agent-reference.md §2).
    b.turn("something unrelated")
    counts = _record_prefills(b)
    evs = b.command(lambda: b.agent.load(saved.short_id))
    assert of(evs, ev.SessionLoaded)[0].prefilled == 0
    assert b.live == tuple(first) and counts == []
    b.turn("and again")
    user2 = template.render(template.user_turn_pieces("and again", think_mode="think"))
    assert counts[0] == len(user2)  # only the new suffix was prefilled
    assert b.ids == reference  # same tokens as the uninterrupted run
    b.stop()


def test_new_after_a_cached_start_restores_the_system_prefix_without_prefill(tmp_path, tiny_model):
    """A start from the system-prompt cache holds no live snapshot handle of the prefix; /new must
    still go back to it for free (the turn snapshots keep it), not re-prefill ~2,160 tokens."""
    from ds4agent.sessions.store import SessionStore

    kv = SessionStore(tmp_path / "kv")
    real_agent(tmp_path / "a", tiny_model, kv).stop()  # writes the system-prompt cache
    b = real_agent(tmp_path / "b", tiny_model, kv)
    assert of(b.events, ev.Ready)[0].sysprompt_cached
    b.turn("hello there")
    counts = _record_prefills(b)
    b.command(b.agent.new)
    assert b.live == tuple(b.worker.conv.system_ids)
    assert counts and max(counts) == 0  # /new computed nothing
    b.stop()


def test_strip_then_load_rebuilds_the_same_tokens_and_continues_exactly(tmp_path, tiny_model):
    """/strip keeps the text and title and drops the KV payload (kvc-format.md §12.6); loading the
    stripped file prefills the re-tokenised text and says so. The text's bytes come back exactly;
    the tokens are its canonical tokenisation, which equals the live session's wherever the model
    sampled canonical pieces (a random model may sample `triglycer`+`master` where the tokenizer
    writes `trig`+`ly`+...: the loss ds4's format documents), and then the session goes on
    exactly as the unstripped one does (same --seed)."""
    from ds4agent.protocol.tokenizer import Tokenizer
    from ds4agent.sessions.kvc import read_envelope
    from ds4agent.sessions.store import SessionStore

    kv = SessionStore(tmp_path / "kv")
    reference = reference_ids(real_agent(tmp_path / "a", tiny_model, kv))

    b = real_agent(tmp_path / "b", tiny_model, kv)
    b.turn("hello there")
    first = b.ids
    saved = of(b.command(b.agent.save), ev.SessionSaved)[0]
    before = kv.resolve(saved.id)
    assert before.header.payload_bytes > 0
    evs = b.command(lambda: b.agent.strip(saved.short_id))
    assert of(evs, ev.Error) == []
    after = kv.resolve(saved.id)  # same identity: title and created_at are kept
    env = read_envelope(after.path)
    tok = Tokenizer.load()
    assert after.header.payload_bytes == 0 and after.file_size < before.file_size
    canonical = tok.rebuild_from_text(env.text)
    assert after.header.tokens == len(canonical)
    assert tok.decode_bytes(canonical) == tok.decode_bytes(first)
    assert after.header.created_at == before.header.created_at
    assert after.header.last_used >= before.header.last_used
    assert env.text == tok.decode_bytes(first) and env.title == b"hello there"

    b.command(b.agent.new)
    evs = b.command(lambda: b.agent.load(saved.short_id))
    notices = [n.text for n in of(evs, ev.Notice)]
    assert f"stripped session: rebuilding {len(canonical):,} tokens" in notices
    progress = of(evs, ev.PrefillProgress)
    assert progress and progress[-1].done == progress[-1].total
    loaded = of(evs, ev.SessionLoaded)[0]
    assert loaded.prefilled == len(canonical) - len(b.worker.conv.system_ids)
    assert b.ids == canonical and b.live == tuple(canonical)
    if canonical == first:  # exactly the unstripped session's tokens: it continues as the uninterrupted run
        b.turn("and again")
        assert b.ids == reference
    b.stop()
