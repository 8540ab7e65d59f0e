"""The agent: the DSML tool loop, sessions, compaction and the events every UI consumes.

Public surface for UIs: `Agent` (facade.py), `AgentSettings` (settings.py), and the event classes
in `ds4agent.agent.events`. Importing this package is cheap: the engine, numpy and the tools are
imported only when an Agent is built.
"""

from ds4agent.agent.facade import RUNS_WHILE_BUSY, Agent, idle_required
from ds4agent.agent.settings import AgentSettings

__all__ = ["RUNS_WHILE_BUSY", "Agent", "AgentSettings", "idle_required"]
