"""`ds4agent --demo`: the whole agent in a minute, without a model.

A scripted engine (scripted.py) plays the model; everything else is real: the tool loop, the
permission questions, the sandbox, the project `.mcp.json` approval and an MCP server (a local
stand-in, demo_server.py). Whatever the user sends, the "model" answers with the tour:

    read greet.py -> edit it (asks) -> run it with bash (asks) -> write a file outside the project
    (always asks: answer n to see a refusal) -> call the MCP server's `tip` tool -> a summary

Everything lives in a directory of its own (DemoPlace), never in the user's: the project, the
session files, the MCP approval, the journal and the code checkpoints. The project is written
afresh at every start; the saved sessions stay, so `ds4agent --demo --resume ID` works.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4agent.agent.scripted import ScriptedEngine, reply
from ds4agent.fsutil import atomic_write
from ds4agent.protocol.tokenizer import ASSISTANT, END_THINK, USER, Tokenizer

GREET = '''def greet(name):
    return "Hello, " + name


if __name__ == "__main__":
    print(greet("world"))
'''
GREET_OLD = '    return "Hello, " + name\n'
GREET_NEW = '    return f"Hello, {name}!"\n'
README = "A two-file project for the ds4agent demo. Nothing here is yours: edit it freely.\n"
OUTSIDE = "outside.txt"  # written next to the project, outside its tree: always asks
MCP_SERVER = "demo"
MCP_TOOL = "demo__tip"  # the server's `tip` tool as the agent names it (server__tool)


@dataclass(frozen=True)
class DemoPlace:
    """Where the demo keeps everything: `root/project` is its working directory."""

    root: Path

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def kv_dir(self) -> Path:
        return self.root / "kvcache"

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"


def default_place() -> DemoPlace:
    """One directory per user in the temporary directory (`$DS4AGENT_DEMO_DIR` overrides it)."""
    given = os.environ.get("DS4AGENT_DEMO_DIR")
    if given:
        return DemoPlace(Path(given).expanduser().resolve())
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return DemoPlace(Path(tempfile.gettempdir()).resolve() / f"ds4agent-demo-{uid}")


def prepare(place: DemoPlace) -> None:
    """Write the demo project afresh (the tour edits it) and its `.mcp.json`, which starts the
    stand-in server with this very Python."""
    project = place.project
    project.mkdir(parents=True, exist_ok=True)
    (place.root / OUTSIDE).unlink(missing_ok=True)
    atomic_write(project / "greet.py", GREET.encode())
    atomic_write(project / "README.md", README.encode())
    # Run by its file, not `-m`: a server gets a clean environment (no PYTHONPATH), and the file
    # needs nothing of ds4agent, only the MCP SDK this Python has.
    server = str(Path(__file__).resolve().with_name("demo_server.py"))
    servers = {"mcpServers": {MCP_SERVER: {"command": sys.executable, "args": [server]}}}
    atomic_write(project / ".mcp.json", (json.dumps(servers, indent=2) + "\n").encode())


class DemoEngine(ScriptedEngine):
    """The scripted engine with the tour as its script: the step is the number of tool-result
    turns since the user's last message, so every message starts the tour again."""

    def __init__(self, place: DemoPlace, *, ctx: int = 100_000) -> None:
        super().__init__(ctx=ctx)
        self.place = place
        self.tok = Tokenizer.load()

    def describe(self) -> str:
        return "demo (a scripted engine, no model)"

    def next_response(self, tokens: tuple[int, ...]) -> Sequence[int]:
        step, last_result = self._position(tokens)
        think: str | None = "" if tokens[-1] != END_THINK else None  # nothink: no reasoning at all
        return tour_step(step, last_result, self.place, think)

    def _position(self, tokens: tuple[int, ...]) -> tuple[int, str]:
        """(tool-result turns since the user's message, the text of the last one)."""
        step = 0
        last = ""
        end = len(tokens)
        for start in range(len(tokens) - 1, -1, -1):
            if tokens[start] != USER:
                continue
            unit = self.tok.decode(t for t in tokens[start + 1:end] if t != ASSISTANT)
            if not unit.startswith("<tool_result>"):
                break
            if step == 0:
                last = unit
            step += 1
            end = start
        return step, last


def _say(think: str | None, reasoning: str, text: str,
         calls: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> list[int]:
    return reply(text, think=None if think is None else reasoning, calls=calls)


def tour_step(step: int, last_result: str, place: DemoPlace, think: str | None) -> list[int]:
    """The "model's" answer at this point of the tour (think None: nothink mode)."""
    if step == 0:
        return _say(think, "A newcomer: show every part of the agent, starting with a read.",
                    "This is the **ds4agent demo**: a scripted engine plays the model, so these words "
                    "are canned, but every tool call below really runs, in a scratch project "
                    f"({place.project}). First, reading a file:",
                    [("read", {"path": "greet.py"})])
    if step == 1:
        return _say(think, "The greeting lacks punctuation; fix it with an edit.",
                    "The greeting has no punctuation. An edit changes files, so you are asked first: "
                    "`y` allows it once, `s` for the rest of the session, `n` refuses.",
                    [("edit", {"path": "greet.py", "old": GREET_OLD, "new": GREET_NEW})])
    if step == 2:
        return _say(think, "Run the script to check the edit.",
                    "Now a shell command. Commands ask too; where the OS allows it they run in a "
                    "sandbox that can write only inside the project.",
                    [("bash", {"command": "python3 greet.py"})])
    if step == 3:
        return _say(think, "Show what happens to a write outside the project.",
                    "Next, a write **outside** the project. That always asks, in every permission "
                    "mode; answer `n` to see how a refusal reaches the model.",
                    [("write", {"path": f"../{OUTSIDE}", "content": "written by the ds4agent demo\n"})])
    if step == 4:
        if (place.root / OUTSIDE).exists():
            said = f"You allowed the write: {place.root / OUTSIDE} exists now."
        else:
            said = "The write was refused, and the model got the refusal as the tool's result."
        return _say(think, "Last part: a tool of an MCP server.",
                    f"{said} Last, a tool from an MCP server: this project's `.mcp.json` starts a small "
                    "local stand-in server, once you approve it at the start.",
                    [(MCP_TOOL, {"topic": "sessions"})])
    mcp_ok = step == 5 and "not running" not in last_result and "Tool error" not in last_result
    mcp = ("The MCP server answered with a tip." if mcp_ok else
           "The MCP server did not answer (it was not approved or did not start), and the error "
           "went to the model like any tool error.")
    return _say(think, "Sum up.",
                f"{mcp}\n\nThat was the tour: reading, editing, a shell command, a refused write and "
                "an MCP call, each with its permission question. Try `/help`, `/permissions`, `/save` "
                "and `/rewind`; Ctrl+O opens a tool card. Send any message to run the tour again. For "
                "real answers, start `ds4agent` with a model (see the README's Quick start).")
