"""The terminal front ends: display and input only (architecture.md: ui -> agent, never the engine).

    app.py          the Textual app (main(args) for `ds4agent`); widgets/ and screens/ hold its parts
    plain.py        the line interface (`--plain`, or stdout not a terminal), prompt_toolkit
    bridge.py       the one boundary where agent events become UI work (drain, coalesce)
    fmt.py, toolview.py, commands.py, history.py, mentions.py
                    pure logic both front ends share (status line, tool cards, slash commands,
                    input history, @path completion); no Textual / prompt_toolkit imports
"""
