"""The full-screen app over the real Agent on the scripted engine, as a program a tmux test runs:

    python -m tests.ui.scripted_app SCENARIO ROOT

SCENARIO names what the scripted model does (SCENARIOS below); ROOT holds the work tree, the
session store and the journal. No model file, no network: the screens are what is tested.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ds4agent.agent.notify_config import NotifyConfig
from ds4agent.tools import default_tools
from ds4agent.ui.app import Ds4App
from ds4agent.ui.history import InputHistory
from ds4agent.ui.notify import Notifier
from tests.support.agent_harness import AgentHarness
from tests.support.scripted_engine import reply

PLAN = ("Plan:\n1. Read src/parser.py and find where sizes are parsed.\n"
        "2. Accept the k/M/G suffixes in parse_size.\n3. Add tests for each suffix and run them.")
TASKS = "\n".join(["[x] read the parser", "[x] find the size parsing", "[>] accept the k/M/G suffixes"]
                  + [f"[ ] follow-up task number {n} with a fairly long description to clip" for n in range(1, 8)])

SCENARIOS = {
    # Plan mode from the start: the answer is a plan, approved with y, then carried out.
    "plan": (dict(permission="plan"), [reply(PLAN, think="Look first."), reply("Done: suffixes accepted.", think="")]),
    # Ask mode; Shift+Tab switches to plan mode before anything is sent.
    "toggle": (dict(permission="ask"), [reply(PLAN, think="t")]),
    # A ten-task list, then an answer.
    "todo": (dict(permission="auto"), [reply("", think="t", calls=[("todo", {"items": TASKS})]),
                                       reply("Working through the list.", think="")]),
}


def main(scenario: str, root: str) -> int:
    settings, script = SCENARIOS[scenario]
    h = AgentHarness.build(Path(root), script, tools=default_tools(), start=False, **settings)
    app = Ds4App(agent=h.agent, cwd=str(h.root / "work"), history=InputHistory(persist=False),
                 permission=settings["permission"], notifier=Notifier(NotifyConfig(), os.environ))
    app.run()
    return int(app.return_code or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
