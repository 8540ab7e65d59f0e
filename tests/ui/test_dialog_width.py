"""Questions fit 80 columns: every choice is on screen whole (the MCP approval's last choice was
cut to "[d] never for this fi", an edit's session choice to "…for this sessio")."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.ui.screens.permission import PermissionScreen
from ds4agent.ui.screens.question import QuestionScreen
from tests.ui.conftest import make_fake_app, wait_until
from tests.ui.screen_text import screen_text

MCP_OPTIONS = (("y", "yes, for this file"), ("n", "not now"), ("d", "never for this file"))


async def test_the_mcp_approval_shows_every_choice_at_80_columns():
    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        agent.emit(ev.Question("q-1", "mcp", "This project's .mcp.json starts MCP servers (`demo`: python "
                               "server.py). Start them?", MCP_OPTIONS))
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen), what="the question")
        await pilot.pause()
        text = screen_text(app)
        for key, label in MCP_OPTIONS:
            assert f"[{key}] {label}" in text


async def test_short_choices_stay_on_one_row():
    app, agent = make_fake_app()
    async with app.run_test(size=(120, 30)) as pilot:
        agent.emit(ev.Question("q-1", "mcp", "Start them?", MCP_OPTIONS))
        await wait_until(pilot, lambda: isinstance(app.screen, QuestionScreen), what="the question")
        await pilot.pause()
        rows = [ln for ln in screen_text(app).splitlines() if "[y] yes, for this file" in ln]
        assert len(rows) == 1 and "[d] never for this file" in rows[0]


async def test_a_file_question_shows_its_session_choice_whole_at_80_columns():
    from ds4agent.tools.context import ToolContext
    from ds4agent.tools.permissions import PermissionPolicy

    app, agent = make_fake_app()
    async with app.run_test(size=(80, 24)) as pilot:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            q = PermissionPolicy().check("write", {"path": "notes.txt", "content": "b\n"},
                                         ToolContext(cwd=Path(d))).question
        opts = (("y", "allow once"), ("s", q.session_label), ("n", "deny"))
        agent.emit(ev.PermissionRequest("p-1", "write", q.title, q.preview, opts, preview_kind="diff"))
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), what="the question")
        await pilot.pause()
        assert f"[s] {q.session_label}" in screen_text(app)
