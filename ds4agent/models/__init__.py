"""Getting and finding model weight files: the Hub names, where pulled files live, which model a
command runs, and whether it fits this machine.

A room below the command line and beside the engine: it knows files, sizes and bytes of RAM, never
tensors. At import time it uses only the standard library; `pull` (the one module that talks to
the network) imports huggingface_hub lazily. The engine, the agent, the commands and the CLI may
import it; it imports none of them, so every arrow into it points down.

    catalog.py  the flavours of ds4's weights on the Hub: names, files, sizes, RAM advice
    locate.py   the model directory and the default-model lookup order
    fit.py      the one memory check (pull warns with it, startup refuses with it)
    pull.py     resumable, verified download from the Hub (printed by commands/pull.py)
"""
