import subprocess
import sys


def test_tools_import_no_ui_and_no_engine():
    code = (
        "import sys\n"
        "import ds4agent.tools, ds4agent.tools.bash, ds4agent.tools.files, ds4agent.tools.search\n"
        "import ds4agent.tools.listing, ds4agent.tools.permissions\n"
        "ds4agent.tools.default_tools()\n"
        "bad = [m for m in ('textual', 'prompt_toolkit', 'mlx', 'numpy', 'ds4agent.engine', 'ds4agent.agent')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
