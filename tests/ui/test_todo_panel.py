"""The task list's lines: the summary, the window of tasks around the current one, the width."""

from __future__ import annotations

from ds4agent.tools.todo import TodoItem
from ds4agent.ui import todo_panel
from ds4agent.ui.fmt import cells


def _items(done, n):
    return tuple(TodoItem(f"task {i}", "done" if i < done else "in_progress" if i == done else "pending")
                 for i in range(n))


def test_summary_names_the_current_task():
    assert todo_panel.summary(()) == "Tasks: none"
    assert todo_panel.summary(_items(1, 3)) == "Tasks 1/3 done · now: task 1"
    assert todo_panel.summary(_items(3, 3)) == "Tasks 3/3 done · all done"
    assert todo_panel.summary((TodoItem("a", "pending"),)) == "Tasks 0/1 done"


def test_a_long_list_shows_a_window_from_just_before_the_current_task():
    rows = todo_panel.lines(_items(6, 12), 40)
    assert rows == [("header", "Tasks 6/12 done · now: task 6"), ("more", "  … 5 done above"),
                    ("done", "  ✔ task 5"), ("active", "  ▶ task 6"), ("pending", "  ○ task 7"),
                    ("pending", "  ○ task 8"), ("pending", "  ○ task 9"), ("more", "  … 2 more")]
    assert todo_panel.lines(_items(6, 12), 40, collapsed=True) == [("header", "Tasks 6/12 done · now: task 6")]
    # At the end of the list the window stays full.
    assert [t for _, t in todo_panel.lines(_items(11, 12), 40)][-1] == "  ○ task 11".replace("○", "▶")


def test_rows_fit_the_width_in_cells():
    items = (TodoItem("宽" * 60, "in_progress"), TodoItem("x" * 200, "pending"))
    for _, text in todo_panel.lines(items, 30):
        assert cells(text) <= 30
