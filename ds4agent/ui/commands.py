"""Slash commands: one table (name, usage, help, argument, agent call) shared by the TUI and plain.

    COMMANDS                 the table, in /help order; each entry says what it asks of the agent
    prepare(line, busy=...)  parse and check a typed line (CommandError with the readable refusal)
    call_agent(cmd, agent)   run a parsed command's agent call
    completions, help_text, help_sections, rewind_args, history_count, think_mode

A front end runs a command as `prepare`, then either its own handler for that name (what only it
can do: a screen, the clipboard, its way of saying /help) or `call_agent`. The busy rule is the
agent's (ds4agent.agent.RUNS_WHILE_BUSY): this module only shows it, with the agent's wording.
Pure logic: no Textual or prompt_toolkit here.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ds4agent.agent import RUNS_WHILE_BUSY, idle_required
from ds4agent.agent.settings import think_mode_named as think_mode_named  # re-exported for --think-level

# What a command takes after its name; parse() refuses anything else, so a mistyped argument is
# said back instead of being ignored (`/new extra` must not start a new session).
NO_ARG = ""        # nothing
TEXT = "text"      # any text (a title)
WORD = "word"      # at most one word (a prefix, a mode)
COUNT = "count"    # at most one whole number


class CommandAgent(Protocol):
    """What the slash commands ask of the agent (ds4agent.agent.Agent; a test's stand-in)."""

    def save(self, title: str | None = None) -> None: ...
    def list_sessions(self) -> None: ...
    def load(self, prefix: str) -> None: ...
    def delete(self, prefix: str) -> None: ...
    def strip(self, prefix: str) -> None: ...
    def history(self, n: int = 3) -> None: ...
    def new(self) -> None: ...
    def compact(self) -> None: ...
    def rewind_points(self) -> None: ...
    def rewind(self, number: int, mode: str = "both") -> None: ...
    def fork(self, title: str = "") -> None: ...
    def set_think_mode(self, mode: str) -> None: ...
    def set_permission_mode(self, mode: str) -> None: ...
    def toggle_plan(self) -> None: ...
    def set_power(self, percent: int | None = None) -> None: ...
    def steer(self, text: str) -> bool: ...
    def run_command(self, name: str, args: str = "") -> bool: ...
    def quit(self) -> None: ...


@dataclass(frozen=True)
class ParsedCommand:
    name: str        # canonical name (aliases resolved: exit -> quit, switch -> load)
    arg: str         # the rest of the line, stripped
    typed: str       # the command as typed, for messages


# What a command asks of the agent; what the call returns is not read (the agent answers with events).
AgentCall = Callable[[CommandAgent, ParsedCommand], object]


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str
    help: str
    takes: str = NO_ARG
    # What the command asks of the agent; None for a front end's own command (/help, /copy) and
    # for aliases (they run their target's). A front end may put its own handler first.
    agent_call: AgentCall | None = None

    @property
    def runs_while_busy(self) -> bool:
        return ALIASES.get(self.name, self.name) in RUNS_WHILE_BUSY


def _rewind(agent: CommandAgent, cmd: ParsedCommand) -> None:
    number, mode = rewind_args(cmd.arg)
    if number is None:
        agent.rewind_points()
    else:
        agent.rewind(number, mode)


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("help", "/help", "commands and keys"),
    CommandSpec("save", "/save [title]", "save the session, optionally under a new title (deferred "
                "to the end of the turn while busy)", takes=TEXT,
                agent_call=lambda a, c: a.save(c.arg or None)),
    CommandSpec("load", "/load [prefix]", "load a saved session (no prefix: session picker)", takes=WORD,
                agent_call=lambda a, c: a.load(c.arg)),
    CommandSpec("switch", "/switch <prefix>", "same as /load", takes=WORD),
    CommandSpec("del", "/del <prefix>", "delete a saved session (asks first; never the live one with "
                "unsaved turns)", takes=WORD, agent_call=lambda a, c: a.delete(c.arg)),
    CommandSpec("strip", "/strip <prefix>", "drop a saved session's KV state, keep its text (a load "
                "prefills it)", takes=WORD, agent_call=lambda a, c: a.strip(c.arg)),
    CommandSpec("list", "/list", "list saved sessions, newest first",
                agent_call=lambda a, c: a.list_sessions()),
    CommandSpec("history", "/history [N]", "replay the last N user turns (default 3)", takes=COUNT,
                agent_call=lambda a, c: a.history(history_count(c.arg))),
    CommandSpec("new", "/new", "start a new session", agent_call=lambda a, c: a.new()),
    CommandSpec("compact", "/compact", "summarise the conversation to free context",
                agent_call=lambda a, c: a.compact()),
    # Mode names in the meaning, not the usage: the usage column stays narrow (80 columns).
    CommandSpec("rewind", "/rewind [N [mode]]", "go back to before user turn N (no N: list the turns); "
                "mode: both (the default), chat, code or fork", takes=TEXT, agent_call=_rewind),
    CommandSpec("fork", "/fork [title]", "save the conversation as a new session; later saves go there",
                takes=TEXT, agent_call=lambda a, c: a.fork(c.arg)),
    # The agent checks the mode and confirms with a notice and a Status event (or an error).
    CommandSpec("think", "/think [N]", "reasoning on; N: level 0 off, 1 on, 2 max", takes=WORD,
                agent_call=lambda a, c: a.set_think_mode(think_mode(c))),
    CommandSpec("nothink", "/nothink", "reasoning off", agent_call=lambda a, c: a.set_think_mode(think_mode(c))),
    CommandSpec("permissions", "/permissions [mode]", "show or set the permission mode: ask, auto, "
                "read-only or plan", takes=WORD, agent_call=lambda a, c: a.set_permission_mode(c.arg)),
    CommandSpec("plan", "/plan", "plan mode on / off (Shift+Tab): the model reads and proposes a plan; "
                "nothing changes until you approve it", agent_call=lambda a, c: a.toggle_plan()),
    # The agent checks the range (1..100) and confirms with a notice and a Status event.
    CommandSpec("power", "/power [N]", "let the device compute at most N% of the time, 1-100 (no N: "
                "show it): keeps a laptop cool, same output",
                takes=COUNT, agent_call=lambda a, c: a.set_power(int(c.arg) if c.arg else None)),
    CommandSpec("steer", "/steer <text>", "guide the answer in progress: the model reads it after the "
                "current tool call, nothing is cancelled", takes=TEXT, agent_call=lambda a, c: a.steer(c.arg)),
    CommandSpec("copy", "/copy", "copy the last answer to the clipboard"),
    CommandSpec("quit", "/quit", "leave (asks to save unsaved turns)", agent_call=lambda a, c: a.quit()),
    CommandSpec("exit", "/exit", "same as /quit"),
)

BY_NAME = {c.name: c for c in COMMANDS}

# The custom commands of the project and the user (agent/custom_commands.py), as table entries:
# filled by use_custom_commands when a front end gets its agent; a built-in name is never taken.
CUSTOM: dict[str, CommandSpec] = {}


def use_custom_commands(agent: object) -> list[str]:
    """Load the agent's custom commands into the table (/help, Tab, parsing); returns the notes
    about command files that cannot be used, for the front end to show."""
    find = getattr(agent, "custom_commands", None)
    CUSTOM.clear()
    if find is None:
        return []
    found, notes = find(frozenset(BY_NAME))
    for c in found:
        CUSTOM[c.name] = CommandSpec(c.name, c.usage, c.help, takes=TEXT,
                                     agent_call=lambda a, cmd: a.run_command(cmd.name, cmd.arg))
    return list(notes)


def all_commands() -> tuple[CommandSpec, ...]:
    """The built-in commands, then the custom ones."""
    return COMMANDS + tuple(CUSTOM.values())

KEYS_HELP: tuple[tuple[str, str], ...] = (
    ("Enter", "send (queue while the model works)"),
    ("Shift+Enter, Ctrl+J", "new line"),
    ("Esc", "interrupt now; a queued message goes next"),
    ("Ctrl+C", "interrupt; on an empty idle prompt twice: quit"),
    ("Ctrl+D", "quit (asks to save unsaved turns)"),
    ("Ctrl+X", "pull the last queued message back into the editor"),
    ("Up / Down", "input history (at the first / last line)"),
    ("PageUp / PageDown", "scroll the conversation; End follows the tail again"),
    ("Ctrl+T", "expand / collapse thinking"),
    ("Shift+Tab", "plan mode on / off (also /plan)"),
    ("Ctrl+G", "expand / collapse the task list"),
    ("Ctrl+O", "expand / collapse the last tool card (or click a card)"),
    ("Ctrl+L", "session picker"),
    ("Esc Esc", "on an empty idle prompt: rewind to an earlier turn"),
    ("F1", "this help (also /help)"),
)

# Plain mode is a line editor: no screens, no cards, no thinking blocks to fold. Its keys are only
# those its key bindings handle (plain.run_interactive), so /help there lists nothing that does not work.
PLAIN_KEYS_HELP: tuple[tuple[str, str], ...] = (
    ("Enter", "send (queue while the model works)"),
    ("Ctrl+J", "new line"),
    ("Esc", "interrupt now (while the model works)"),
    ("Ctrl+C", "interrupt; on an empty idle prompt twice: quit"),
    ("Ctrl+D", "quit on an empty line (asks to save unsaved turns)"),
    ("Ctrl+X", "pull the last queued message back into the editor"),
    ("Up / Down", "input history"),
    ("Tab", "complete a /command or an @path"),
    ("Shift+Tab", "plan mode on / off (also /plan)"),
)

# The files that add to the agent (read from the working tree's root; each also from the user
# config directory, without the leading `.ds4agent/`): what /help and --help say about them.
FILES_HELP: tuple[tuple[str, str], ...] = (
    (".ds4agent/commands/<name>.md", "a custom /<name> command: the file is the prompt, $ARGUMENTS the "
     "rest of the line"),
    (".ds4agent/skills/<name>/SKILL.md", "a skill: the model sees its description and reads it with the "
     "skill tool when needed"),
    (".ds4agent/hooks.json", "hooks: commands run before and after tools, on each message and when a "
     "turn ends (exit 2 blocks); a project's asks once"),
    ("AGENTS.md", "project instructions, added to the system text"),
)

# A second Ctrl+C on an empty idle prompt within this many seconds quits (both front ends).
QUIT_WINDOW_S = 2.0
QUIT_HINT = "press Ctrl+C again or Ctrl+D to exit"
# A second Esc on an empty idle prompt within this many seconds opens the rewind list (TUI).
ESC_ESC_WINDOW_S = 0.8


# After a failed start: what still works, said once on screen and in every refusal.
FAILED_START_HINT = "the agent could not start (the reason is above): leave with /quit, Ctrl+D or Ctrl+C twice"
RUNS_AFTER_FAILED_START = frozenset({"help", "quit"})


def not_sent_after_failed_start() -> str:
    return f"not sent: {FAILED_START_HINT}"


class CommandError(Exception):
    """A slash command the user typed cannot run; the message is one readable line."""


class UnknownCommand(CommandError):
    """A name that is not in the table; the front end puts the typed line back in the input."""


ALIASES = {"exit": "quit", "switch": "load"}


def is_command(text: str) -> bool:
    """A line that runs a slash command; `//…` is text for the model (a way to send a leading slash)."""
    line = text.strip()
    return line.startswith("/") and not line.startswith("//")


def parse(text: str) -> ParsedCommand:
    """Parse `/name rest`; raise CommandError(`unknown command: /x`) for names not in the table."""
    line = text.strip()
    head, _, rest = line.partition(" ")
    name = head[1:].lower()
    if name in CUSTOM:
        return ParsedCommand(name, rest.strip(), head)
    if name not in BY_NAME:
        # A typo keeps about the length ("/lsit"), a shortening is a prefix ("/hist"); a word of
        # another length is another word, not a typo ("/model" is not "/del").
        close = [n for n in BY_NAME if name and n.startswith(name)] or difflib.get_close_matches(
            name, [n for n in BY_NAME if abs(len(n) - len(name)) <= 1], n=1)
        hint = f"did you mean /{close[0]}? " if close else ""
        raise UnknownCommand(f"unknown command: {head} ({hint}/help lists the commands)")
    arg = rest.strip()
    _check_arg(BY_NAME[name], head, arg)
    return ParsedCommand(ALIASES.get(name, name), arg, head)


def _check_arg(spec: CommandSpec, typed: str, arg: str) -> None:
    if not arg or spec.takes == TEXT:
        return
    usage = spec.usage.replace(f"/{spec.name}", typed, 1)
    if spec.takes == NO_ARG:
        raise CommandError(f"{typed} takes no arguments (got: {arg})")
    if len(arg.split()) > 1:
        raise CommandError(f"{typed} takes one argument (got: {arg}); usage: {usage}")
    if spec.takes == COUNT:
        try:
            int(arg)
        except ValueError:
            raise CommandError(f"{typed} needs a whole number (got: {arg}); usage: {usage}") from None


def check_allowed(cmd: ParsedCommand, busy: bool) -> None:
    """The agent's busy rule, said before the agent is asked (it would refuse all the same)."""
    # A custom command is a message: while busy it is queued like typed text.
    if busy and cmd.name not in RUNS_WHILE_BUSY and cmd.name not in CUSTOM:
        raise CommandError(idle_required(cmd.typed))


def check_runs_after_failed_start(cmd: ParsedCommand) -> None:
    """Once the agent could not start only /help and /quit have something to run on."""
    if cmd.name not in RUNS_AFTER_FAILED_START:
        raise CommandError(f"{cmd.typed} cannot run: {FAILED_START_HINT}")


def prepare(line: str, *, busy: bool, failed_start: bool = False) -> ParsedCommand:
    """A typed line as a command that may run now; CommandError (the readable refusal) else."""
    cmd = parse(line)
    check_allowed(cmd, busy)
    if failed_start:
        check_runs_after_failed_start(cmd)
    return cmd


def call_agent(cmd: ParsedCommand, agent: CommandAgent) -> None:
    """Run a command's agent call (CommandError for a malformed argument, e.g. /rewind x)."""
    spec = BY_NAME.get(cmd.name) or CUSTOM.get(cmd.name)
    call = spec.agent_call if spec is not None else None
    if call is None:
        raise CommandError(f"{cmd.typed} has nothing to ask of the agent")
    call(agent, cmd)


def permissions_text(mode: str) -> str:
    """/permissions without an argument: the modes, the current one marked, and the sandbox."""
    from ds4agent.agent.permissions_glue import explain  # the sandbox probe: only when asked

    return "\n".join(explain(mode))


def completions(text: str) -> list[CommandSpec]:
    """Commands whose name starts with what was typed after `/` (only while the line is one word)."""
    if not text.startswith("/") or " " in text or "\n" in text:
        return []
    prefix = text[1:].lower()
    return [c for c in all_commands() if c.name.startswith(prefix)]


def think_mode(cmd: ParsedCommand) -> str:
    """The reasoning mode /think [mode] or /nothink asks for (the agent checks and confirms it)."""
    return "nothink" if cmd.name == "nothink" else (cmd.arg or "think")


def history_count(arg: str, default: int = 3) -> int:
    """/history N: default 3, clamped to 1..200 (parse() has refused anything but a number)."""
    return max(1, min(200, int(arg))) if arg else default


REWIND_MODES = ("both", "chat", "code", "fork")


def rewind_args(arg: str) -> tuple[int | None, str]:
    """/rewind [N [MODE]]: (None, "both") lists the turns; MODE defaults to both (code and
    conversation). CommandError for anything else."""
    parts = arg.split()
    if not parts:
        return None, "both"
    usage = "usage: /rewind [N [both|chat|code|fork]]"
    if len(parts) > 2 or not parts[0].isdigit() or int(parts[0]) < 1:
        raise CommandError(usage)
    mode = parts[1].lower() if len(parts) == 2 else "both"
    if mode not in REWIND_MODES:
        raise CommandError(usage)
    return int(parts[0]), mode


def help_sections(plain: bool = False) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """/help's content: (heading, ((what, meaning), ...)) for the commands and for the keys;
    plain: plain mode's keys (every command works in both front ends)."""
    sections: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
        ("commands", tuple((c.usage, c.help) for c in COMMANDS)),)
    if CUSTOM:
        sections += (("custom commands", tuple((c.usage, c.help) for c in CUSTOM.values())),)
    return sections + (("keys", PLAIN_KEYS_HELP if plain else KEYS_HELP), ("files", FILES_HELP))


def help_text(width: int | None = None, *, plain: bool = False) -> str:
    """/help as text. With a width, a long meaning wraps under its own column (not back to the
    line's start), so the two columns stay readable in a narrow terminal."""
    lines: list[str] = []
    for heading, rows in help_sections(plain):
        left = max(len(what) for what, _ in rows)
        lines.append(f"{heading}:")
        room = (width - left - 4) if width else 0
        for what, meaning in rows:
            parts = textwrap.wrap(meaning, room) if room >= 20 else [meaning]
            lines.append(f"  {what:<{left}}  {parts[0]}")
            lines += [" " * (left + 4) + part for part in parts[1:]]
    return "\n".join(lines)
