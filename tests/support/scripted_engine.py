"""The scripted engine double lives in the package (ds4agent/agent/scripted.py: `--demo` runs on it
too); the tests import it from here."""

from ds4agent.agent.scripted import ScriptedEngine, ScriptedSession, reply, text_ids

__all__ = ["ScriptedEngine", "ScriptedSession", "reply", "text_ids"]
