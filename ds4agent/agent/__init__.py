"""The agent: the DSML tool loop and its policy, sessions, compaction and the events every UI consumes.

The only room that knows all the rooms below it (engine, protocol, sessions, tools, models): it
connects the engine's exported state to the session store, renders turns with the protocol, runs
the tools under the permission policy.

Public names (import them from here):
    Agent             the facade every UI drives: commands in, events out (facade.py); /steer's
                      guidance waits with the queued messages for the next tool boundary
    AgentSettings     the knobs the command line gives the agent (settings.py)
    RUNS_WHILE_BUSY, idle_required   the busy rule, stated once (facade.py)
  and the event classes in ds4agent.agent.events.

Modules:
    facade.py      Agent: the command queue in, the event queue out, the busy rule
    worker.py      Worker: the worker thread's state and the turn loop (rounds, tools, results)
    port.py        WorkerPort / AgentIO: the protocols the modules below are typed against
    identity.py    SessionIdentity: title, created_at, id, legacy path, fork parent, dirty, ...
    sessionops.py  system-prompt cache, /save, /load, /new, /fork, /list, the crash journal's use
    compaction.py  the compaction thresholds and procedure
    rewind.py      going back to an earlier user turn (conversation, code, both, fork)
    permissions_glue.py  the policy's questions as events
    mcp_glue.py    MCP servers: the project-file question, start / join / stop, their tools
    hooks.py       what the hooks (tools/hooks.py) mean to the loop: block a message or a call,
                   feedback after a call, send the model back to work when a turn ends
    custom_commands.py  `/NAME args` from .ds4agent/commands/NAME.md and the user's commands/
    skills.py      SKILL.md folders: their descriptions in the system text, the `skill` tool
    subagent.py    the `task` tool: a subagent forked from the live KV state, its records
    decode.py      TokenStream: the one decode loop (a round and a compaction summary)
    stream.py      one round's tokens -> events (over protocol.dsml); Coalescer
    edit_assist.py the forced [upto] (--edit-upto) and the preflight stop while the model writes an edit
    plan.py        plan mode: the note the model gets, the approval question, the mode switch
    todos.py       the model's task list, read back from the transcript and published as events
    notify_config.py  when and how the front ends ring the terminal (notify.json, --notify)
    verify.py      checking a model against recorded greedy continuations (`ds4agent verify`)
    transcript.py  the append-only transcript
    history.py     replaying saved turns for display
    events.py      the typed events
    prompt.py      SYSTEM_TEXT (built-in + AGENTS.md + --system)
    journal.py     the crash journal file
    settings.py, trace.py, wiring.py (building an Agent from the command line)

Importing this package is cheap: the engine, numpy and the tools are imported only when an Agent
is built.
"""

from ds4agent.agent.facade import RUNS_WHILE_BUSY, Agent, idle_required
from ds4agent.agent.settings import AgentSettings

__all__ = ["RUNS_WHILE_BUSY", "Agent", "AgentSettings", "idle_required"]
