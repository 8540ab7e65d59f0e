"""Every `§` citation in the repository resolves to a heading of a document in docs/.

The code explains its byte layouts and rules by citing the design documents by section
(`kvc-format.md §9.4`, `model.md §4.5`). A citation names its document, or it is bare (`§7`): a bare
one cites the document named before it on its line, else the file's *home* document: the first one
the file names (a module's docstring names it), or the document itself for a file in docs/. A range (`§3-§9`, `§12.3-12.5`, `§11.6-7`) needs both ends. A section exists when the
document has a heading that starts with its number (`## 9. Tool results`, `### 9.1 Messages …`).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Where citations live: the package, the tests, the benches, the documents themselves, the README.
SCANNED = ("ds4agent", "tests", "bench", "docs")
SUFFIXES = {".py", ".md", ".tcss", ".toml"}

DOC_NAME = r"(?P<doc>(?:[\w.]*/)*(?P<stem>[a-z][a-z0-9-]*)(?:\.md)?)"
NUMBER = r"\d+(?:\.\d+)*"
# `kvc-format.md §9.4`, `[model.md](model.md) §3-4`, `§11.6-7`, `§3-§9`; the document is optional.
CITATION = re.compile(rf"(?:{DOC_NAME}\)?\s*)?§\s?(?P<start>{NUMBER})(?:\s?[-–]\s?§?(?P<end>{NUMBER}))?")
NAMED = re.compile(r"([a-z][a-z0-9-]*)\.md\b")  # a document named anywhere, cited or not
HEADING = re.compile(rf"^#+\s+(?P<number>{NUMBER})\.?(?:\s|$)")


def _sections(doc: Path) -> set[str]:
    found = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = HEADING.match(line)
        if m:
            found.add(m.group("number"))
    return found


SECTIONS = {p.stem: _sections(p) for p in sorted(DOCS.glob("*.md"))}


def _files() -> list[Path]:
    out = [ROOT / "README.md"]
    for top in SCANNED:
        out += [p for p in sorted((ROOT / top).rglob("*")) if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in out if p.exists() and p != Path(__file__).resolve()]


def _range_end(start: str, end: str) -> str:
    """`11.6-7` ends at 11.7: a shorter end keeps the start's leading numbers."""
    a, b = start.split("."), end.split(".")
    return ".".join(a[: max(0, len(a) - len(b))] + b)


def citations(text: str, home: str = "") -> list[tuple[int, str, str]]:
    """(line, document stem, section) for each cited section of `text`; the stem is "" where
    the file names no document (then a bare citation has nothing to resolve against). `home`:
    the document the text is (a document's bare citations cite itself)."""
    named = [m.group(1) for m in NAMED.finditer(text) if m.group(1) in SECTIONS]
    home = home or (named[0] if named else "")
    found: list[tuple[int, str | None, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        on_line = None  # `model.md §6.3, §1.1`: a bare citation after a named one cites the same
        for m in CITATION.finditer(line):
            stem = m.group("stem") if m.group("doc") and m.group("stem") in SECTIONS else on_line
            on_line = stem
            found.append((lineno, stem, m.group("start")))
            if m.group("end"):
                found.append((lineno, stem, _range_end(m.group("start"), m.group("end"))))
    return [(lineno, stem or home, section) for lineno, stem, section in found]


def test_docs_has_the_cited_documents():
    assert {"kvc-format", "model", "prompt-and-dsml", "architecture", "agent-reference"} <= set(SECTIONS)


def test_the_parser_reads_each_form():
    text = ("x (model.md §6.3, §1.1)\ny §3-§9 and §11.6-7\nz ../shared/spec/kvc-format.md §12.3-12.5\n"
            "[kvc-format.md](kvc-format.md) §9.4\n")
    assert citations(text) == [(1, "model", "6.3"), (1, "model", "1.1"), (2, "model", "3"), (2, "model", "9"),
                               (2, "model", "11.6"), (2, "model", "11.7"), (3, "kvc-format", "12.3"),
                               (3, "kvc-format", "12.5"), (4, "kvc-format", "9.4")]
    assert citations("see §4\n", home="model") == [(1, "model", "4")]


def test_every_citation_resolves_inside_the_repository():
    wrong = []
    for path in _files():
        text = path.read_text(encoding="utf-8")
        if "§" not in text:
            continue
        rel = path.relative_to(ROOT)
        if "shared/spec" in text:
            wrong.append(f"{rel}: cites the design notes outside the repository; cite docs/")
        wrong += [f"{rel}:{lineno}: §{section} cites no document (name one in the file)" if not stem else
                  f"{rel}:{lineno}: {stem}.md has no section {section}"
                  for lineno, stem, section in citations(text, path.stem if path.parent == DOCS else "")
                  if not stem or section not in SECTIONS[stem]]
    assert not wrong, "\n".join(wrong)
