"""A very large paste: the app warns before sending a message that would fill the context (Enter
again sends it), and an interrupt is said in the status line at the key press."""

from __future__ import annotations

from ds4agent.ui import fmt
from ds4agent.ui.widgets.conversation import Note
from tests.ui.conftest import make_fake_app, send, wait_until
from tests.ui.fake_agent import status


def _submits(agent) -> list[str]:
    return [c[1] for c in agent.calls if c[0] == "submit"]


async def test_a_message_past_the_compaction_threshold_is_warned_about_then_sent():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.emit(status("idle"))  # 1.2k of 16.4k used, compaction at 85%
        await wait_until(pilot, lambda: app.status_model.state == "idle", what="idle")
        paste = "\n".join(f"log line {i}: something happened here" for i in range(1500))  # ~58 KB
        app.input.restore(paste)
        assert app.input.text.startswith("[... 1500 pasted lines")  # folded, as a paste is
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("Press Enter again" in n.text for n in app.conversation.query(Note)),
                         what="the warning")
        note = next(n.text for n in app.conversation.query(Note) if "Press Enter again" in n.text)
        assert note.startswith("this message is about 1") and "more than the whole context" in note
        assert _submits(agent) == []
        assert app.input.expanded_text() == paste  # back in the editor, folded
        await pilot.press("enter")
        await wait_until(pilot, lambda: _submits(agent) == [paste], what="sent on the second Enter")


async def test_a_message_that_fits_is_sent_at_once():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.emit(status("idle"))
        await wait_until(pilot, lambda: app.status_model.state == "idle", what="idle")
        await send(pilot, app, "x" * 3000)  # about 1k tokens: room enough
        await wait_until(pilot, lambda: _submits(agent) == ["x" * 3000], what="sent")


def test_the_warning_names_what_happens():
    s = fmt.StatusState(state="idle", ctx_used=1000, ctx_total=10_000, compact_at=0.85)
    assert fmt.big_message_warning("a" * 3 * 7000, s) == ""
    assert "past the compaction threshold" in fmt.big_message_warning("a" * 3 * 8000, s)
    assert "it will not fit" in fmt.big_message_warning("a" * 3 * 9500, s)


async def test_an_interrupt_is_said_at_once():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.busy = True
        agent.emit(status("prefill"))
        await wait_until(pilot, lambda: app.status_model.state == "prefill", what="prefill")
        await pilot.press("ctrl+c")
        assert ("interrupt",) in agent.calls
        await wait_until(pilot, lambda: app.status_bar.plain.startswith("interrupting…"), what="interrupting")
        agent.busy = False
        agent.emit(status("idle"))
        await wait_until(pilot, lambda: app.status_bar.plain.startswith("idle"), what="idle again")
        assert not app.status_model.interrupting


def test_an_interrupt_before_any_answer_says_the_message_was_taken_back():
    from ds4agent.ui import fmt

    assert fmt.turn_end_note("interrupted", generated=0) == (fmt.INTERRUPTED_UNREAD, "warning")
    assert "taken back out of the conversation" in fmt.INTERRUPTED_UNREAD
    assert fmt.turn_end_note("interrupted", generated=12) == ("interrupted", "warning")
