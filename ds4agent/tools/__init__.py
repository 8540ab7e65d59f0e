"""What the model can do in the workspace: bash jobs, file reading/writing/editing, search, listing.

Public names (import them from here):
    run_tool(name, args, ctx, tools=None)  run one call; never raises (failures become "Tool error: ...")
    default_tools()                        the fixed registry order (the system prompt's bytes)
    Tool                                   the protocol every tool implements
    ToolContext                            per-agent state: cwd, interrupt poll, bash jobs, seen lines
    Observation, ToolError                  an observation; a readable failure
    BashDisplay, DiffDisplay, DiffLine, TextDisplay   display payloads for UIs (no UI types)
    RESULT_CAP_BYTES                       the size cap of one observation
    running_jobs_update(ctx)               the re-announcement of running jobs after compaction

Public modules with their own API:
    permissions.py  PermissionPolicy(mode).check(tool, args, ctx) -> Decision; Answer; PermissionQuestion;
                    denied_result()
    attach.py       expand(text, ctx) / strip(text): `@path` attachments
    files.py        plan_change() (what a write/edit would do, for previews), approve() (the
                    policy's record of what it judged, which the write/edit run is held to);
                    check_old() and upto_ready_at() (the agent's help while an edit streams)
    oldtext.py      select_old(): the span an edit's old selects (exact once, or HEAD[upto]TAIL,
                    within lines read); upto_ready(); UPTO
    shellscan.py    scan(command, cwd): the programs a command runs, the writes that always ask
    sandbox.py      the OS boundary around every bash job: availability(), Grants (what the user
                    allowed beyond it, ToolContext.sandbox), refusals read from a job's output
    todo.py         the model's task list: TodoTool, TodoItem, TodoDisplay, items_from_result()
    mcp/            tools from the user's MCP servers: load_config, McpServers, mcp_tools (its
                    own package; importing it does not import the SDK)
    hooks.py        the user's and the project's hooks files (load_hooks) and running one hook
                    inside the job boundary (run_hook); what a hook's verdict means is the agent's

Internal modules: registry.py (the table), context.py, results.py, args.py (argument coercion),
textlines.py (lines and line endings of file bytes; args.unencodable: text UTF-8 cannot hold),
jobs.py (background processes), bash.py, listing.py, beneath.py (opening and replacing files
beneath their resolved path, no link followed), regular.py (regular files only, read in bounded
pieces), search.py (ripgrep, the `ripgrep` wheel's rg, as a killable child process).

Importing this package imports nothing heavy (no engine, no UI).
"""

from ds4agent.tools.bash import running_jobs_update
from ds4agent.tools.context import ToolContext
from ds4agent.tools.registry import Tool, default_tools, run_tool
from ds4agent.tools.results import (
    RESULT_CAP_BYTES,
    BashDisplay,
    DiffDisplay,
    DiffLine,
    Observation,
    TextDisplay,
    ToolError,
)

__all__ = [
    "RESULT_CAP_BYTES",
    "BashDisplay",
    "DiffDisplay",
    "DiffLine",
    "TextDisplay",
    "Tool",
    "ToolContext",
    "ToolError",
    "Observation",
    "default_tools",
    "run_tool",
    "running_jobs_update",
]
