"""The input editor: a multi-line TextArea where Enter sends and Shift+Enter / Ctrl+J add a line.

Several TextArea defaults are rebound on purpose: Ctrl+X (cut) pulls the last queued message back,
Ctrl+C (copy) interrupts / clears / quits, Ctrl+D deletes only when there is text (on an empty
prompt it quits), PageUp/PageDown scroll the conversation, and Up/Down walk the history when the
cursor is on the first/last line. Pasted text arrives as one Paste event, so pasted newlines never
send (bracketed paste).
"""

from __future__ import annotations

import textwrap

from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widgets import Static, TextArea

from ds4agent.ui import commands, mentions
from ds4agent.ui.history import InputHistory

PLACEHOLDER = "Ask ds4agent… (/ for commands, @ for files)"
# A paste longer than this is shown folded as one marker (the reference's editor does the same);
# the marker is expanded back to the pasted text when the message is sent.
FOLD_LINES = 10
FOLD_CHARS = 2000


def fold_label(text: str, n: int) -> str:
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    body = f"{lines} pasted lines" if lines > 1 else f"{len(text)} pasted chars"
    return f"[... {body} ...]" if n == 1 else f"[... {body} #{n} ...]"


def next_choice(current: str, options: list[str]) -> str:
    """What Tab puts in: the first option, or the one after `current`, so repeated Tab cycles."""
    if current in options and len(options) > 1:
        return options[(options.index(current) + 1) % len(options)]
    return options[0]


class PromptInput(TextArea):
    BINDINGS = [
        Binding("ctrl+x", "app.pull_queued", "pull back queued", show=False),
        Binding("ctrl+c", "app.ctrl_c", "interrupt / clear", show=False),
        Binding("ctrl+d", "ctrl_d", "quit", show=False),
        Binding("pageup", "app.scroll_conversation(-1)", show=False),
        Binding("pagedown", "app.scroll_conversation(1)", show=False),
        Binding("end", "end_key", show=False),
        Binding("up", "history_up", show=False),
        Binding("down", "history_down", show=False),
        Binding("tab", "complete", show=False),
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, history: InputHistory, *, cwd: str = ".", id: str | None = None) -> None:
        super().__init__("", id=id, placeholder=PLACEHOLDER, soft_wrap=True, tab_behavior="focus",
                         show_line_numbers=False, compact=True, highlight_cursor_line=False)
        # Nothing blinks (ui.md); this also keeps snapshots deterministic.
        self.cursor_blink = False
        self.input_history = history
        self.cwd = cwd
        self.pastes: list[tuple[str, str]] = []   # (marker in the editor, pasted text)
        self._completion_index = -1

    async def _on_key(self, event: events.Key) -> None:
        self.app.last_typing = self.app.clock()  # type: ignore[attr-defined]  # the Ds4App's (screens.TypeaheadGuard)
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.send()
            return
        if event.key in ("shift+enter", "ctrl+j", "newline", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        # Textual runs a widget's (non-priority) key bindings only when the key has bubbled up to
        # the App, after the editor has already inserted the characters that followed it in the
        # same terminal read: a fast "xyz⌫/s" became "xyz/s". Running the editor's own bindings
        # here, in arrival order, keeps editing keys in sequence with the text around them.
        # (`_bindings` is the node's merged binding map: these class BINDINGS plus TextArea's.)
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if not binding.priority:
                event.stop()
                event.prevent_default()
                await self.run_action(binding.action)
                return
        # other keys: TextArea's own _on_key runs after this one (Textual dispatches to every class
        # in the MRO unless prevent_default() was called)

    async def _on_paste(self, event: events.Paste) -> None:
        # Terminals paste line breaks as CR (tmux, many others) or CRLF: the message keeps them
        # as the newlines they were, in the transcript, the model's prompt and the history.
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        event.stop()
        event.prevent_default()  # TextArea's own _on_paste would insert the raw text
        if text.count("\n") >= FOLD_LINES or len(text) > FOLD_CHARS:
            label = fold_label(text, len(self.pastes) + 1)
            self.pastes.append((label, text))
            self.insert(label)
        else:  # as TextArea would: the pasted text replaces the selection
            start, end = self.selection
            self.move_cursor(self.replace(text, start, end).end_location)

    def expanded_text(self) -> str:
        """The editor's text with every folded paste marker replaced by what was pasted."""
        text = self.text
        for label, pasted in self.pastes:
            text = text.replace(label, pasted, 1)
        return text

    def send(self) -> None:
        text = self.expanded_text()
        if not text.strip():
            return
        self.pastes = []
        self.input_history.add(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def restore(self, text: str) -> None:
        """Put a message that was not sent back, a long one folded as a paste marker again."""
        if text.count("\n") >= FOLD_LINES or len(text) > FOLD_CHARS:
            label = fold_label(text, 1)
            self.set_text(label)
            self.pastes = [(label, text)]
        else:
            self.set_text(text)

    def set_text(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    # -- rebound keys ------------------------------------------------------------------------
    def action_ctrl_d(self) -> None:
        if self.text:
            self.action_delete_right()
        else:
            self.app.action_quit_request()  # type: ignore[attr-defined]

    def action_end_key(self) -> None:
        self.action_cursor_line_end()
        self.app.action_follow_tail()  # type: ignore[attr-defined]

    def action_history_up(self) -> None:
        if self.app.query_one(CommandHints).move(-1):
            return
        if self.cursor_location[0] == 0:
            entry = self.input_history.previous(self.text)
            if entry is not None:
                self.set_text(entry)
                return
        self.action_cursor_up()

    def action_history_down(self) -> None:
        if self.app.query_one(CommandHints).move(1):
            return
        if self.cursor_location[0] >= self.document.line_count - 1:
            entry = self.input_history.next()
            if entry is not None:
                self.set_text(entry)
                return
        self.action_cursor_down()

    def text_before_cursor(self) -> str:
        return self.get_text_range((0, 0), self.cursor_location)

    def action_complete(self) -> None:
        before = self.text_before_cursor()
        partial = mentions.mention_at_cursor(before)
        if partial is not None:
            self._complete_mention(before, partial)
            return
        matches = commands.completions(self.text)
        if not matches:
            return
        hints = self.app.query_one(CommandHints)
        chosen = hints.highlighted() if hints.selected > 0 else None  # moved to with Up/Down
        choice = chosen or next_choice(self.text[1:], [c.name for c in matches])
        self.set_text("/" + choice + ("" if len(matches) > 1 else " "))

    def _complete_mention(self, before: str, partial: str) -> None:
        found = mentions.candidates(self.cwd, partial)
        if not found:
            return
        choice = next_choice(partial, found)
        start = (self.cursor_location[0], self.cursor_location[1] - len(partial))
        self.replace(choice, start, self.cursor_location)


class CommandHints(Static):
    """Completion list shown above the input while the line is `/word`.

    The command menu has a highlighted entry that Up/Down move (Tab puts it in) and shows a window
    of the entries around it: at 80×24 the whole list does not fit, and no entry may be out of
    reach or cut off. (A window of whole entries, not a scrolled view: an entry whose description
    wraps is never shown half.)"""

    MAX_LINES = 16  # with the hint line; the CSS's max-height for #hints says the same

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False
        self.names: list[str] = []
        self.entries: list[list[Content]] = []  # the command menu: each entry's (wrapped) lines
        self.selected = 0
        self.top = 0  # the first entry in the window

    def show_for(self, text: str, before_cursor: str | None = None, cwd: str = ".") -> None:
        partial = mentions.mention_at_cursor(text if before_cursor is None else before_cursor)
        self.entries = []
        if partial is not None:
            found = mentions.candidates(cwd, partial)
            self.names = found
            self.display = bool(found)
            if found:
                lines = [Content.styled("@" + f, "$accent") for f in found]
                lines.append(Content.styled("tab: complete", "$text-muted"))
                self.update(Content("\n").join(lines))
            return
        matches = commands.completions(text)
        names = [c.name for c in matches]
        if names != self.names:
            self.selected = self.top = 0
        self.names = names
        self.display = bool(matches)
        if matches:
            width = max(len(c.usage) for c in matches)
            # A long description wraps under its own column, not back under the command names
            # (80 columns): the lines are wrapped here, to the room the column has.
            room = max(20, (self.size.width or self.app.size.width - 2) - width - 3)
            for c in matches:
                parts = textwrap.wrap(c.help, room) or [""]
                entry = [Content.from_markup("[b $accent]$u[/]  [$text-muted]$h[/]", u=c.usage.ljust(width),
                                             h=parts[0])]
                entry += [Content.styled(" " * (width + 2) + part, "$text-muted") for part in parts[1:]]
                self.entries.append(entry)
            self.draw_menu()

    def menu_lines(self) -> int:
        """Lines the menu's entries may take: the CSS's maximum, less on a short screen so the
        conversation keeps a few lines (header, border, input and status take five)."""
        return max(3, min(self.MAX_LINES, self.app.size.height - 9)) - 1

    def window(self) -> range:
        """The entries shown: whole entries only, the highlighted one always among them."""
        budget = self.menu_lines()
        self.top = min(self.top, self.selected)
        while self.top < self.selected and sum(len(e) for e in self.entries[self.top:self.selected + 1]) > budget:
            self.top += 1
        end, used = self.top, 0
        while end < len(self.entries) and (end == self.top or used + len(self.entries[end]) <= budget):
            used += len(self.entries[end])
            end += 1
        return range(self.top, end)

    def draw_menu(self) -> None:
        shown = self.window()
        lines: list[Content] = []
        for i in shown:
            entry = self.entries[i]
            if i == self.selected:
                entry = [line.stylize("reverse") for line in entry]
            lines += entry
        keys = "↑↓ choose · tab: complete" if len(self.entries) > 1 else "tab: complete"
        if len(shown) < len(self.entries):
            keys += f"  ({shown.start + 1}–{shown.stop} of {len(self.entries)})"
        lines.append(Content.styled(keys, "$text-muted"))
        self.update(Content("\n").join(lines))

    def move(self, delta: int) -> bool:
        """Move the command menu's highlight (no wrap); False when no menu of several is shown,
        so Up/Down keep walking the input history."""
        if not self.display or len(self.entries) < 2:
            return False
        self.selected = max(0, min(len(self.entries) - 1, self.selected + delta))
        self.draw_menu()
        return True

    def highlighted(self) -> str | None:
        return self.names[self.selected] if self.entries and self.selected < len(self.names) else None
