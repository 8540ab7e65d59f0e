"""An agent over a real engine (a test model file, loaded on the worker thread as the app does:
MLX arrays belong to the thread that made them), and the uninterrupted two-turn run the
save/load tests compare a reloaded session against."""

from __future__ import annotations

from pathlib import Path

from ds4agent.engine import load_engine
from ds4agent.sessions.store import SessionStore
from tests.support.agent_harness import AgentHarness
from tests.support.rec_tool import RecTool

CTX = 2048
# The two user turns of the reference run; a test splits them around its save and load.
FIRST_TURN, SECOND_TURN = "hello there", "and again"


def real_agent(root: Path, model: Path | str, kv: SessionStore) -> AgentHarness:
    def loader(progress):
        return load_engine(model, ctx=CTX, progress=progress)

    return AgentHarness.build(root, engine=loader, tools=[RecTool("alpha", "A1\n")], store=kv, round_tokens=5,
                              seed=7, ctx=CTX, answer=lambda e: "n")


def reference_ids(h: AgentHarness) -> list[int]:
    """Both turns without interruption (same --seed, so a reloaded session must reach the same
    tokens); the agent is stopped after."""
    h.turn(FIRST_TURN)
    h.turn(SECOND_TURN)
    ids = list(h.ids)
    h.stop()
    return ids
