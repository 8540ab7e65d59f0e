"""The import arrows around the models room: nothing below the command line imports the CLI (the
engine used to reach up into cli.py for model-path resolution), and the models room imports none
of the rooms that use it. Checked on the source, so function-level (lazy) imports count too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ds4agent

ROOT = Path(ds4agent.__file__).parent


def _imports(path: Path) -> set[str]:
    """Absolute names of every ds4agent module `path` imports, at any depth of the file."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
    return {n for n in names if n.startswith("ds4agent")}


def _room(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def test_no_room_below_the_command_line_imports_cli():
    offenders = [(str(p.relative_to(ROOT)), n) for room in ("engine", "sessions", "tools", "agent", "models")
                 for p in _room(room) for n in _imports(p) if n == "ds4agent.cli"]
    assert offenders == []


def test_models_room_imports_no_room_that_uses_it():
    upward = ("ds4agent.engine", "ds4agent.agent", "ds4agent.ui", "ds4agent.cli", "ds4agent.sessions",
              "ds4agent.tools")
    offenders = [(str(p.relative_to(ROOT)), n) for p in _room("models") for n in _imports(p)
                 if n.startswith(upward)]
    assert offenders == []


def test_model_lookup_is_light():
    # The CLI resolves the model on every start: that must not pull in MLX, the Hub client or a UI.
    code = ("import sys, ds4agent.models.locate, ds4agent.models.fit, ds4agent.cli\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'huggingface_hub', 'textual', "
            "'prompt_toolkit'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
