"""Room boundaries: sessions imports nothing of the engine and no UI toolkit (architecture.md)."""

import subprocess
import sys


def test_sessions_modules_import_no_engine_or_ui():
    code = (
        "import sys\n"
        "import ds4agent.sessions.kvc, ds4agent.sessions.payload, ds4agent.sessions.store\n"
        "import ds4agent.sessions.errors\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('ds4agent.engine', 'ds4agent.agent', "
        "'ds4agent.ui', 'textual', 'prompt_toolkit', 'mlx')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
