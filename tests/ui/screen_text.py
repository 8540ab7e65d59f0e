"""The visible screen as plain text lines (for assertions on what a person would read)."""

from __future__ import annotations


def screen_lines(app) -> list[str]:
    strips = app.screen._compositor.render_strips()
    return ["".join(seg.text for seg in strip).rstrip() for strip in strips]


def screen_text(app) -> str:
    return "\n".join(screen_lines(app))
