"""The worker's boundary, as two small protocols: what the session commands may touch.

    AgentIO      the facade's side the worker talks to: events out, questions, the interrupt flag
                 and the messages queued while busy (facade.Agent implements it)
    WorkerPort   what the worker was built with, what startup made, the conversation (`conv`,
                 conversation.py: its methods are the only way to change it) and the few
                 operations that sessionops, compaction, rewind and permissions_glue use
                 (worker.Worker implements it)

The modules over the worker are typed against WorkerPort, never against the Worker class: they
cannot reach its private state, and the worker imports them without a circle. Everything named
here is public on the Worker; nothing is typed Any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ds4agent.agent import events as ev

if TYPE_CHECKING:  # types only: importing this module stays free of the engine and the tools
    from ds4agent.agent.conversation import Conversation
    from ds4agent.agent.journal import Journal
    from ds4agent.agent.settings import AgentSettings
    from ds4agent.agent.trace import TraceLog
    from ds4agent.engine import DutyCycle, Engine, Sampler, Session, SnapshotStore
    from ds4agent.protocol.tokenizer import Tokenizer
    from ds4agent.sessions.store import SessionStore
    from ds4agent.tools import Tool, ToolContext
    from ds4agent.tools.mcp import McpConfig, McpServers
    from ds4agent.tools.permissions import PermissionPolicy


class AgentIO(Protocol):
    def emit(self, event: ev.Event) -> None: ...

    def ask(self, event: ev.PermissionRequest | ev.Question) -> tuple[str, str]:
        """Publish a question and wait for (key, message); worker thread only."""
        ...

    def new_id(self, prefix: str) -> str: ...

    def should_stop(self) -> bool:
        """The user's interrupt is pending."""
        ...

    def clear_interrupt(self) -> None: ...

    def has_queued(self) -> bool: ...

    def take_queued(self) -> str:
        """All messages typed while busy, joined; empties the queue."""
        ...

    def submit(self, text: str) -> bool:
        """Send a message as the user would (queued while busy: the next turn); a Stop hook's."""
        ...

    def stopping(self) -> bool:
        """The agent is shutting down."""
        ...


class WorkerPort(Protocol):
    # what the worker was built with
    settings: AgentSettings
    io: AgentIO
    store: SessionStore | None
    policy: PermissionPolicy
    tool_ctx: ToolContext
    trace: TraceLog
    mcp_config: McpConfig | None  # the MCP servers to start (None: none)
    # what startup made
    mcp: McpServers | None  # the running MCP servers
    engine: Engine
    session: Session
    tok: Tokenizer
    sampler: Sampler
    duty: DutyCycle  # rests between prefill chunks and decoded tokens (/power)
    snapshots: SnapshotStore | None
    journal: Journal | None
    # the conversation: transcript, identity, system prefix, turn times, status figures, ...
    conv: Conversation

    @property
    def tools(self) -> list[Tool]:
        """The callable tools: ds4agent's own, the running MCP servers', then `skill` when there are skills
        (the system prompt's order)."""
        ...

    def sync(self, *, interruptible: bool = True) -> bool:
        """Bring the live KV up to the transcript; False when interrupted."""
        ...

    def set_state(self, state: ev.State, *, progress: float | None = None, detail: str = "") -> None: ...

    def emit_status(self, progress: float | None = None) -> None: ...
