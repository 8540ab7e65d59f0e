"""The house's rules, read from the source with `ast` (nothing is imported, so lazy imports inside
functions count like any other): the arrows between rooms of docs/architecture.md, no import
cycle between modules, no private name crossing a module, the UI toolkits and printing confined to
ui/ and commands/, and modules and functions of a size a reader can hold."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ds4agent"

# Room -> the rooms (or single modules, written room.module) it may import. fsutil is the ground
# floor every room may use. The table is architecture.md's "Arrows" drawing, written out.
ALLOWED: dict[str, set[str]] = {
    # The command line's top: the subcommands (the agent itself is commands/agent.py); its parser
    # reads the model catalog for `pull`'s choices and the slash-command table for --help, and
    # what it parsed becomes the agent's typed run (agent.settings).
    "cli": {"commands", "ui", "models", "agent.settings"},
    "commands": {"ui", "agent", "tools", "engine", "sessions", "models", "protocol", "testmodels"},
    "ui": {"agent"},
    "agent": {"tools", "sessions", "protocol", "models", "engine"},
    "tools": set(),
    "sessions": set(),
    "protocol": set(),
    "models": set(),
    "engine": {"models.fit"},
    "testmodels": {"engine", "protocol"},
    "fsutil": set(),
    "statelayout": set(),
    "textsafe": set(),
    "utf8": set(),
    "invocation": set(),
}
GROUND = {"fsutil", "statelayout", "textsafe", "utf8", "invocation"}
UI_TOOLKITS = ("textual", "prompt_toolkit", "rich")
MAY_PRINT = {"ui", "commands", "cli"}
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


@dataclass
class Module:
    name: str  # dotted, without the leading "ds4agent."
    path: Path
    tree: ast.Module
    lines: list[str]
    imports: list[tuple[str, int]] = field(default_factory=list)  # (dotted target, line)
    private_imports: list[tuple[str, str, int]] = field(default_factory=list)  # (module, name, line)

    @property
    def room(self) -> str:
        return self.name.split(".")[0]


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        if not parts:
            continue
        text = path.read_text(encoding="utf-8")
        module = Module(".".join(parts), path, ast.parse(text, str(path)), text.splitlines())
        module.is_package = is_package  # type: ignore[attr-defined]
        found[module.name] = module
    for module in found.values():
        _read_imports(module, found)
    return found


def _read_imports(module: Module, found: dict[str, Module]) -> None:
    package = module.name if module.is_package else module.name.rpartition(".")[0]  # type: ignore[attr-defined]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ds4agent."):
                    module.imports.append((alias.name.removeprefix("ds4agent."), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "ds4agent" or node.module.startswith("ds4agent.")):
                target = node.module.removeprefix("ds4agent").lstrip(".")
            else:
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}" if target else alias.name
                if full in found:
                    module.imports.append((full, node.lineno))
                else:
                    module.imports.append((target, node.lineno))
                    if alias.name.startswith("_"):
                        module.private_imports.append((target, alias.name, node.lineno))


MODULES = _modules()


def _allowed(source: Module, target: str) -> bool:
    room = target.split(".")[0]
    if room == source.room or room in GROUND or not target:
        return True
    for arrow in ALLOWED[source.room]:
        if target == arrow or target.startswith(arrow + ".") or room == arrow:
            return True
    return False


def test_every_room_is_in_the_table():
    assert {m.room for m in MODULES.values()} <= set(ALLOWED)


def test_imports_follow_the_arrows():
    wrong = [f"{m.name}:{line} imports {target}" for m in MODULES.values() for target, line in m.imports
             if not _allowed(m, target)]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules():
    # Each module's imports resolved to modules of the package (an import of a package counts as an
    # import of its __init__); a cycle of any length is reported once, as its strongly connected set.
    graph = {name: {t for t, _ in m.imports if t in MODULES and t != name} for name, m in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm, iterative enough for a few hundred modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def _private_definitions() -> dict[str, set[str]]:
    """Per module, the private names it defines: module-level, in classes, and `self._x = ...`."""
    defined: dict[str, set[str]] = {}
    for name, module in MODULES.items():
        names: set[str] = set()
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
        defined[name] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return defined


def test_no_private_name_crosses_a_module():
    wrong = [f"{m.name}:{line} imports {name} from {target}" for m in MODULES.values()
             for target, name, line in m.private_imports]
    defined = _private_definitions()
    for name, module in MODULES.items():
        own = defined[name]
        elsewhere = set().union(*(d for other, d in defined.items() if other != name))
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in own and node.attr in elsewhere:
                wrong.append(f"{name}:{node.lineno} uses .{node.attr}, defined in another module")
    assert not wrong, "\n".join(wrong)


def test_ui_toolkits_and_printing_stay_in_ui_and_commands():
    wrong = []
    for module in MODULES.values():
        if module.room in MAY_PRINT:
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                names = []
            wrong += [f"{module.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in UI_TOOLKITS]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                wrong.append(f"{module.name}:{node.lineno} prints")
    assert not wrong, "\n".join(wrong)


def test_modules_stay_readable():
    wrong = [f"{m.name}: {len(m.lines)} lines" for m in MODULES.values() if len(m.lines) > MAX_MODULE_LINES]
    assert not wrong, "\n".join(wrong)


_SAYS_LONG = re.compile(r"\blong\b|\b\d+\+? lines\b", re.IGNORECASE)


def _says_why_long(module: Module, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A long function says why it stays whole: in its docstring, or in a comment on the lines just
    above its `def` (decorators included) or at the top of its body, that mentions it is long."""
    doc = ast.get_docstring(node) or ""
    if _SAYS_LONG.search(doc):
        return True
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    window = module.lines[max(0, first - 4): node.body[0].lineno + 2]
    return any("#" in line and _SAYS_LONG.search(line.split("#", 1)[1]) for line in window)


def test_long_functions_say_why():
    wrong = []
    for module in MODULES.values():
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES and not _says_why_long(module, node):
                    wrong.append(f"{module.name}.{node.name}: {length} lines")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("room", sorted(r for r in ALLOWED if (PACKAGE / r).is_dir()))
def test_each_room_says_what_it_owns(room):
    doc = ast.get_docstring(MODULES[room].tree)
    assert doc and len(doc.splitlines()) >= 2
