"""write/edit bodies are highlighted as code of the file's language; signs and numbers keep the diff colours."""

from ds4agent.ui import codeview, toolview
from ds4agent.ui.widgets.conversation import _LINE_STYLE, body_content


def _styles_over(content, start, end):
    return {s.style for s in content.spans if s.start <= start and s.end >= end}


def test_diff_lines_of_a_python_file_carry_highlight_styles():
    lines = toolview.pending_body("edit", {"old": "def f(x):\n", "new": "def f(x: int):\n    return 'a'\n"})
    out = codeview.code_body(lines, "pkg/mod.py", _LINE_STYLE)
    assert [c.plain for c in out] == ["-def f(x):", "+def f(x: int):", "+    return 'a'"]
    assert _styles_over(out[0], 0, 1) == {"$text-error"} and _styles_over(out[1], 0, 1) == {"$text-success"}
    keyword = {"$text-accent"}  # the theme's style of a keyword
    assert keyword <= _styles_over(out[0], 1, 4) and keyword <= _styles_over(out[2], 5, 11)
    # The string literal 'a' (columns 12-14, quotes included) is styled as a string, piece by piece.
    assert all(_styles_over(out[2], i, i + 1) & {"$text-success"} for i in range(12, 15))
    assert not _styles_over(out[2], 11, 12) & {"$text-success"}  # the space before it is not


def test_numbered_diff_rows_keep_number_and_sign_outside_the_code():
    rows = [(toolview.HUNK, "@@ -1 +1 @@"), (toolview.DEL, "- 12  fn main() {}"), (toolview.ADD, "+ 12  fn main() { x }")]
    out = codeview.code_body(rows, "src/main.rs", _LINE_STYLE)
    assert [c.plain for c in out] == [r[1] for r in rows]
    assert _styles_over(out[1], 0, 6) == {"$text-error"}
    assert {"$text-accent"} <= _styles_over(out[1], 6, 8)  # `fn`


def test_unknown_languages_and_cards_without_a_path_stay_plain():
    lines = [(toolview.ADD, "+some text")]
    assert codeview.code_body(lines, "notes.unknownext", _LINE_STYLE) is None
    assert codeview.code_body(lines, None, _LINE_STYLE) is None
    plain = body_content(lines)
    assert [s.style for s in plain.spans if s.start >= 2] == ["$text-success"]
    assert len(body_content(lines, "a.py").spans) > len(plain.spans)
