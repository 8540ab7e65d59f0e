"""The subcommands: one module per `ds4agent COMMAND`, each with `main(settings) -> exit code`.

Each takes its typed settings (settings.py; cli.py parses the command line, builds them and maps
a name to its module here),
calls the rooms below, prints, and returns an exit code. With ui/, the only code that prints to
a terminal; the rooms below return values and raise typed errors, and these modules decide how
they are shown (one line on stderr, never a traceback).

    tokens.py           `ds4agent tokens`: token ids and texts of a text (protocol)
    dump_logits.py      `ds4agent dump-logits`: float32 logits after every token (engine)
    make_test_model.py  `ds4agent make-test-model`: a random-weight DS4 file (testmodels)
    kv.py               `ds4agent kv ls|show|verify|rm`: the session/KV directory (sessions)
    info.py             `ds4agent info`: a model's shape, types, sizes, memory plan (engine.memory)
    convert.py          `ds4agent convert`: the official safetensors -> an MLX directory (engine)
    pull.py             `ds4agent pull`: a model from the Hugging Face Hub (models)
    agent.py            `ds4agent` itself: the model, then the front end (ui/)
    mcp.py              `ds4agent mcp list`: the MCP servers, whether they start, their tools
    verify.py           `ds4agent verify`: a model against recorded greedy continuations
    settings.py         the subcommands' typed settings (cli.py builds them)
    boundary.py         run_file_command: the exit codes and messages of the file-writing commands
"""
