"""The TUI on a real Agent whose (scripted) model starts subagents: what the tmux test of the
subagent card runs, as `python -m tests.ui.subagent_app ROOT`.

First message: the model calls `task`, and the subagent writes slowly (a pause per token) so a
person can watch its card run and stop it with Ctrl+C. Second message: a quick subagent that
reads a file and reports.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ds4agent.agent import Agent, AgentSettings
from ds4agent.sessions.store import SessionStore
from ds4agent.ui.app import Ds4App
from tests.support.rec_tool import RecTool
from tests.support.scripted_engine import ScriptedEngine, reply

TOKEN_PAUSE_S = 0.05  # per subagent token: its card is seen running


def main(root: Path) -> int:
    (root / "work").mkdir(parents=True, exist_ok=True)
    engine = ScriptedEngine([
        reply("", think="delegate", calls=[("task", {"goal": "survey the parser module"})]),
        reply("working " * 600, think="slow"),
        reply("", think="again", calls=[("task", {"goal": "find where parse is defined"})]),
        reply("", think="look", calls=[("read", {"path": "a.py"})]),
        reply("parse is defined in a.py line 3.", think="found"),
        reply("It is in a.py.", think="t"),
    ])

    def slow_subagent(session, pos):
        if session is not engine.sessions[0]:
            time.sleep(TOKEN_PAUSE_S)

    engine.on_step = slow_subagent
    settings = AgentSettings(ctx=16384, cwd=root / "work", permission="auto", subagents=True, seed=1,
                             journal_dir=root / "journal", undo_dir=root / "checkpoints",
                             config_dir=root / "conf")
    agent = Agent(engine, SessionStore(root / "kv"), [RecTool("read", "1 import os\n2\n3 def parse(): ...\n")],
                  settings)
    Ds4App(agent=agent, cwd=str(root / "work"), ctx=16384, permission="auto").run()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
