"""The terminal front ends: display and input only (architecture.md: ui -> agent, never the engine).

Three thin consumers of the same agent events:
    app.py          the Textual app (main(run) for `ds4agent`); widgets/ and screens/ hold its parts
    plain.py        the line interface (`--plain`, or stdout not a terminal), prompt_toolkit
    headless.py     `ds4agent -p PROMPT` (and `--json`): one task, the answer on stdout

What they share (pure logic, no Textual / prompt_toolkit imports):
    dispatch.py     EventTable: the one table event type -> handler; each front end gives its handlers
    commands.py     COMMANDS: the one table of slash commands (usage, help, agent call); prepare,
                    call_agent, help_text, completions
    bridge.py       the boundary where agent events become UI work (drain, coalesce)
    fmt.py          status line, notes and list lines; toolview.py: tool cards; codeview.py: their
                    code highlighted
    history.py      input history; mentions.py: @path completion
    messages.py     the Textual messages posted at the event boundary (TUI only)
"""
