"""What the model can do in the workspace: bash jobs, file reading/writing/editing, search, listing.

Public API (see each module's docstring):
* base.py: ToolResult, ToolError, ToolContext, Tool, default_tools(), run_tool(),
  display payloads (BashDisplay, DiffDisplay/DiffLine, TextDisplay)
* permissions.py: PermissionPolicy(mode).check(tool, args, ctx) -> Decision; Answer; remember();
  denied_result()
* bash.py: running_jobs_update(ctx) for the re-announcement after compaction
* files.py: plan_change() (what a write/edit would do, for previews), approve() (the policy's
  record of what it judged, which the write/edit run is held to)
* beneath.py: opening and replacing files beneath their resolved path, no link followed
* shellscan.py: scan(command, cwd) (the programs a command runs, the writes that always ask)
* regular.py, regex_worker.py: internal to the file tools and search (regular files only; a
  regex run in a killable child process)

Importing this package imports nothing heavy (no engine, no UI).
"""
