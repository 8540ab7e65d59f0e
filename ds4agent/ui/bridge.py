"""The one boundary where agent events become UI work: drain, coalesce, hand over in order.

The agent's worker may publish an event per decoded token; the UI takes whatever is queued at most
`DRAIN_HZ` times a second and merges runs that only append (text, thinking, one tool argument,
compaction summary) or only overwrite (status of one state, prefill progress). Order between different kinds
is kept, so a tool card never appears before the text that preceded it. Pure Python: the plain
mode uses it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ds4agent.agent import events as ev

DRAIN_HZ = 30
MAX_EVENTS_PER_DRAIN = 20_000   # bounds one drain's work if the worker runs far ahead


def weight(e: ev.Event) -> int:
    """Tokens a delta stands for: the agent may already have merged several (a `tokens` field when it
    says how many), else one per event."""
    return getattr(e, "tokens", 1) or 1


def coalesce(events: Iterable[ev.Event]) -> list[tuple[ev.Event, int]]:
    """Merge adjacent mergeable events; returns (event, how many tokens/raw events it stands for)."""
    out: list[tuple[ev.Event, int]] = []
    texts: list[str] = []   # pending text parts of out[-1] when it is an append-only kind

    def flush() -> None:
        if len(texts) > 1 and out:
            last, n = out[-1]
            merged: dict[str, object] = {"text": "".join(texts)}
            if hasattr(last, "tokens"):
                merged["tokens"] = n  # the merged delta says how many tokens it stands for
            out[-1] = (replace(last, **merged), n)
        texts.clear()

    for e in events:
        if out:
            last, n = out[-1]
            t = type(e)
            if t is type(last):
                if t in (ev.TextDelta, ev.ThinkingDelta, ev.CompactionDelta) or (
                    t is ev.ToolCallArgDelta and e.index == last.index and e.param == last.param  # type: ignore[attr-defined]
                ) or (
                    # a subagent's streamed reasoning or answer (one token each), per subagent
                    t is ev.SubagentDelta and e.id == last.id and e.kind == last.kind  # type: ignore[attr-defined]
                    and e.kind in ("thinking", "text")  # type: ignore[attr-defined]
                ):
                    texts.append(e.text)  # type: ignore[attr-defined]
                    out[-1] = (last, n + weight(e))
                    continue
                # Status events of one state overwrite each other; a change of state is kept, so
                # e.g. the decode speed of a `generating` Status is seen before the next state's.
                if t is ev.PrefillProgress or (t is ev.Status and e.state == last.state):  # type: ignore[attr-defined]
                    flush()
                    out[-1] = (e, n + 1)
                    continue
        flush()
        out.append((e, weight(e)))
        if isinstance(e, (ev.TextDelta, ev.ThinkingDelta, ev.CompactionDelta, ev.ToolCallArgDelta, ev.SubagentDelta)):
            texts.append(e.text)
    flush()
    return out
