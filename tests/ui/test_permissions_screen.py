"""/permissions without an argument explains every mode, the rule of every mode and the sandbox,
in one screen (plain mode here; the app shows the same text)."""

from __future__ import annotations

import io

from ds4agent.tools import sandbox
from ds4agent.ui import commands
from ds4agent.ui.plain import run_lines
from tests.ui.conftest import make_real_agent


def test_plain_permissions_explains_the_modes_and_the_sandbox(tmp_path):
    agent, _ = make_real_agent(tmp_path, [], permission="auto")
    stdout = io.StringIO()
    run_lines(agent, io.StringIO("/permissions\n"), stdout, poll=0.005)
    out = stdout.getvalue()
    assert "permission mode: auto (change it with /permissions ask|auto|read-only)" in out
    assert "› auto" in out and "  ask" in out and "  read-only" in out
    assert "never an interpreter" in out
    assert "a write outside the working tree or into .git/ asks first, auto included" in out
    assert "sandbox: " in out


def test_the_sandbox_line_says_what_this_machine_has(monkeypatch):
    text = commands.permissions_text("ask")
    if sandbox.availability().available:
        assert "can write only inside the working tree" in text
    monkeypatch.setenv(sandbox.SWITCH, "off")
    sandbox.availability.cache_clear()
    try:
        text = commands.permissions_text("ask")
        assert "sandbox: none here (switched off by" in text and "every bash command asks" in text
        assert text.splitlines()[1].startswith("› ask")
    finally:
        monkeypatch.delenv(sandbox.SWITCH)
        sandbox.availability.cache_clear()
