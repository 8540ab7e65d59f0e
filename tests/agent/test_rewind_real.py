"""/rewind on the real engine (tiny test model): the state after a conversation rewind is the
state the session had at that point, bit for bit, so a greedy re-send gives the same answer, and
no token is prefilled while the snapshot is held."""

from __future__ import annotations

import numpy as np

from ds4agent.agent import events as ev
from ds4agent.engine import load_engine
from tests.support.agent_harness import AgentHarness, of
from tests.support.rec_tool import RecTool

CTX = 2048


def _agent(root, model, **kw):
    def loader(progress):
        return load_engine(model, ctx=CTX, progress=progress)

    opts = dict(engine=loader, tools=[RecTool("alpha", "A1\n")], round_tokens=6, temperature=0.0,
                ctx=CTX, answer=lambda e: "n")
    opts.update(kw)
    return AgentHarness.build(root, **opts)


def _payload_arrays(payload):
    out = [np.asarray(payload.tokens), np.asarray(payload.logits)]
    for lay in payload.layers:
        out += [np.asarray(a) for a in (lay.raw, lay.comp, lay.attn_kv, lay.attn_score, lay.index_comp,
                                          lay.index_kv, lay.index_score) if a is not None]
    return out


def _texts(events):
    # Joined: how the deltas are cut depends on timing (the UI coalescer), the text does not.
    return "".join(e.text for e in events if isinstance(e, (ev.TextDelta, ev.ThinkingDelta)))


def test_rewind_restores_the_exact_state_and_a_greedy_resend_repeats_the_answer(tmp_path, tiny_model):
    h = _agent(tmp_path, tiny_model)
    h.turn("hello there")
    boundary = list(h.ids)  # turn 2 starts here (after the EOS that closed turn 1)
    first = _texts(h.turn("and again"))
    after_two = list(h.ids)
    h.turn("a third thing")
    # The state just before turn 2, computed independently from scratch.
    ref = h.worker.engine.new_session()
    ref.sync(boundary)
    expected = ref.export_state()
    ev_done = of(h.command(lambda: h.agent.rewind(2, "chat")), ev.Rewound)[0]
    assert ev_done.prefilled == 0 and ev_done.prompt == "and again"
    assert h.ids == boundary
    got = h.worker.session.export_state()
    for a, b in zip(_payload_arrays(got), _payload_arrays(expected), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    again = _texts(h.turn("and again"))
    assert again and again == first and h.ids == after_two
    h.stop()


def test_snapshots_stay_within_the_budget_and_a_dropped_one_is_reprefilled(tmp_path, tiny_model):
    # A budget of about three snapshots of this model: the middle ones are dropped.
    h = _agent(tmp_path, tiny_model)
    h.turn("one")
    one = h.worker.snapshots.nbytes()
    h.stop()
    h = _agent(tmp_path / "b", tiny_model, snapshot_budget=int(one * 2.5))
    starts = []
    for text in ("one", "two", "three", "four", "five"):
        starts.append(len(h.ids))
        h.turn(text)
    store = h.worker.snapshots
    assert store.dropped > 0 and store.nbytes() <= int(one * 2.5) + one
    assert starts[1] not in store.token_counts
    done = of(h.command(lambda: h.agent.rewind(2, "chat")), ev.Rewound)[0]
    nearest = max(n for n in store.token_counts if n <= starts[1])
    assert done.prefilled == starts[1] - nearest > 0
    assert h.live == tuple(h.ids[:starts[1]])
    h.stop()


def test_rewind_after_load_and_after_crash_resume(tmp_path, tiny_model):
    from ds4agent.sessions.store import SessionStore

    kv = SessionStore(tmp_path / "kv")
    h = _agent(tmp_path / "a", tiny_model, store=kv)
    h.turn("hello there")
    boundary = list(h.ids)
    h.turn("and again")
    saved = of(h.command(h.agent.save), ev.SessionSaved)[0]
    h.stop()

    b = _agent(tmp_path / "b", tiny_model, store=kv)
    b.command(lambda: b.agent.load(saved.short_id))
    pts = of(b.command(b.agent.rewind_points), ev.RewindList)[0].points
    assert [p.preview for p in pts] == ["hello there", "and again"] and pts[0].time == 0.0
    done = of(b.command(lambda: b.agent.rewind(2, "chat")), ev.Rewound)[0]
    # No snapshot of that point in this process: it is re-prefilled from the system prefix's
    # (kept at start), and the result is the same state.
    assert done.prefilled == len(boundary) - len(b.worker.conv.system_ids) > 0
    ref = b.worker.engine.new_session()
    ref.sync(boundary)
    assert np.array_equal(b.worker.session.logits, ref.logits)
    b.stop()

    # Crash resume: the journal of an unsaved run, then a rewind in the resumed session.
    c = _agent(tmp_path / "c", tiny_model, store=kv, journal_dir=tmp_path / "journal")
    c.turn("hello there")
    c.turn("unsaved turn")
    c.agent.shutdown()  # no save question: the journal is kept
    d = _agent(tmp_path / "d", tiny_model, store=kv, journal_dir=tmp_path / "journal",
               cwd=tmp_path / "c" / "work", answer=lambda e: "y" if isinstance(e, ev.Question) and e.kind == "resume" else "n")
    d.settle()
    assert of(d.events, ev.SessionLoaded)[0].resumed
    done = of(d.command(lambda: d.agent.rewind(2, "chat")), ev.Rewound)[0]
    assert done.prompt == "unsaved turn" and d.ids == boundary
    d.stop()
