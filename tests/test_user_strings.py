"""What users read cites nothing they cannot open: no design document outside the repository
("kvc-format.md 9.6") appears in a string the program shows (docstrings and comments may cite them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ds4agent

ROOT = Path(ds4agent.__file__).parent
# AGENTS.md: the project file the agent reads; SKILL.md: the file of a user's skill folder
IN_REPO = {"AGENTS.md", "README.md", "SKILL.md"}


def _shown_strings(path: Path):
    tree = ast.parse(path.read_text("utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_shown_string_cites_a_design_document():
    cited = [(str(p.relative_to(ROOT)), line, name) for p in ROOT.rglob("*.py") for line, text in _shown_strings(p)
             for name in re.findall(r"[\w-]+\.md\b", text) if name not in IN_REPO]
    assert cited == []


def test_tokens_counts_in_the_singular(capsys):
    from ds4agent import cli

    assert cli.main(["tokens", "--plain-text", "--text", "a"]) == 0
    assert capsys.readouterr().err.strip() == "1 token"
    assert cli.main(["tokens", "--plain-text", "--text", "a a a"]) == 0
    assert capsys.readouterr().err.strip().endswith(" tokens")
