"""The import rule: the core never imports textual or prompt_toolkit (architecture.md)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import ds4agent

CORE = ("protocol", "engine", "testmodels", "sessions", "tools", "agent", "models")


def test_core_modules_import_no_ui_toolkit():
    names = []
    for room in CORE:
        pkg = __import__(f"ds4agent.{room}", fromlist=["_"])
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    assert "ds4agent.agent.worker" in names and "ds4agent.tools.registry" in names
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "failed = []\n"
        "for n in names:\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except ImportError as e:\n"
        "        failed.append((n, str(e)))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'prompt_toolkit'))\n"
        "print(repr((failed, bad)))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(ds4agent.__file__).parent.parent))
    assert res.returncode == 0, res.stderr
    failed, bad = eval(res.stdout.strip().splitlines()[-1])
    agent_failures = [f for f in failed if f[0].startswith("ds4agent.agent")]
    assert agent_failures == []
    assert bad == []
