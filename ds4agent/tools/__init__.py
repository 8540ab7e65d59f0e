"""What the model can do in the workspace: bash jobs, file reading/writing/editing, search, listing.

Public API (see each module's docstring):
* base.py: ToolResult, ToolError, ToolContext, Tool, default_tools(), run_tool(),
  display payloads (BashDisplay, DiffDisplay/DiffLine, TextDisplay)
* permissions.py: PermissionPolicy(mode).check(tool, args, ctx) -> Decision; Answer; remember();
  denied_result()
* bash.py: running_jobs_update(ctx) for the re-announcement after compaction
* files.py: plan_change() (what a write/edit would do, for previews), atomic_write()
* shellscan.py: scan(command, cwd) (the programs a command runs, the writes that always ask)
* regular.py: internal to the file tools and search (regular files only, read in bounded pieces);
  search runs ripgrep (the `ripgrep` wheel's rg) as a killable child process

Importing this package imports nothing heavy (no engine, no UI).
"""
