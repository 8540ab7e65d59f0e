"""What a shell command line runs and where it may write, read from its text (for the permission
policy; nothing is executed).

Public API:
    scan(command, cwd, should_stop=None) -> Scan | None
        None: the text cannot be analysed (command substitution, process substitution, unbalanced
        quotes, a program that runs other programs given as arguments, find -exec, git -c, ...).
        Scan.programs: the programs run, in order, without duplicates (empty: none, such as a bare
        redirection); Scan.risky_writes: the write targets that leave the working tree or enter
        a `.git/` directory, or whose place cannot be known before the command runs, each as
        "TARGET (why)".
    command_programs(command) -> tuple[str, ...] | None   scan()'s programs, None when unknown or none

The reading is conservative: anything it does not understand makes the command opaque or its
target risky, so the policy asks; a false "ask" costs a keypress, a false "allow" may cost the
user's files. The reading is linear in the command's length (no recursion, no backtracking
regex over unbounded text: a sed or awk program over 4 KiB is opaque) and stops, answering None,
when should_stop() turns true. The lexer follows POSIX sh (the tools run `/bin/sh -c`): quotes, backslashes,
comments, here-documents, io numbers (`2>`); bash's `&>`, `>&FILE` and `<<<` are understood too.

Known limits (they need the user's attention, not this module's): a program that interprets its
own language (python -c, perl -e, node -e, make) can write anywhere; allowing such a program for
the session allows that, as its session label says.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

# Programs that run other programs given as arguments: allowing them "for the session" would allow
# anything, so a command using one of them cannot be analysed.
RUNNERS = frozenset({
    "sh", "bash", "zsh", "dash", "fish", "ksh", "csh", "tcsh", "eval", "exec", "source", ".", "sudo",
    "doas", "su", "env", "xargs", "nohup", "timeout", "nice", "ionice", "command", "builtin", "time",
    "watch", "setsid", "stdbuf", "chroot", "unshare", "nsenter", "busybox", "parallel", "ssh", "trap",
    "flock", "script", "strace", "ltrace", "gdb", "taskset", "chrt", "runuser", "sg", "systemd-run",
    "alias",
})
# Environment variables that choose which program runs, or make a program run another one
# (GIT_PAGER, GIT_SSH_COMMAND, LD_PRELOAD, PATH...): setting one makes the command opaque.
_RUNNING_VARIABLES = frozenset({
    "PATH", "IFS", "ENV", "BASH_ENV", "SHELL", "PAGER", "MANPAGER", "EDITOR", "VISUAL", "PROMPT_COMMAND",
    "PYTHONSTARTUP", "PYTHONPATH", "PERL5OPT", "PERL5LIB", "RUBYOPT", "NODE_OPTIONS", "BROWSER",
})
_RUNNING_VARIABLE_PREFIXES = ("GIT_", "LD_", "DYLD_", "BASH_FUNC_")
_DECLARING = frozenset({"export", "declare", "typeset", "readonly", "local"})
# Shell words that start a compound command: the program is the word after them.
_PREFIX_WORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{"})
# Words that end a compound command or open a header that runs no program by itself.
_SKIP_SEGMENT = frozenset({"fi", "done", "esac", "}", "for", "case", "select", "in", "function"})

_OPERATORS = sorted([";;&", "<<-", "<<<", "&>>", ";;", ";&", "&&", "||", "|&", ">>", ">&", "<&", "<<", "<>",
                     ">|", "&>", ";", "&", "|", "(", ")", "<", ">"], key=len, reverse=True)
_SEPARATORS = frozenset({";", "&", "|", "&&", "||", "|&", "(", ")", "\n", ";;", ";&", ";;&"})
_REDIRECTS = frozenset({"<", ">", ">>", ">|", "<>", ">&", "<&", "&>", "&>>", "<<", "<<-", "<<<"})
_OUTPUT_REDIRECTS = frozenset({">", ">>", ">|", "<>", ">&", "&>", "&>>"})

# Writing to these is harmless (and `> /dev/null` is everywhere).
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/1",
                               "/dev/fd/2"})

# Programs whose every operand may be written (or removed, or moved away).
# ln and link are here because a link to a file outside the tree makes a later write to the link,
# inside the tree by its name, a write outside.
_WRITES_OPERANDS = frozenset({
    "tee", "mv", "rm", "rmdir", "unlink", "touch", "truncate", "mkdir", "mkfifo", "mknod", "chmod",
    "chown", "chgrp", "shred", "tar", "unzip", "zip", "curl", "wget", "split", "csplit", "ln", "link",
})
# Programs that write their last operand (or the -t/--target-directory one).
_WRITES_LAST = frozenset({"cp", "install", "rsync", "scp"})
_SED = frozenset({"sed", "gsed"})
_AWK = frozenset({"awk", "gawk", "mawk", "nawk"})
_FIND_RUNS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_FIND_WRITES = frozenset({"-delete", "-fprint", "-fprint0", "-fprintf", "-fls"})
# git options and subcommands that run a command named on the line (or in a setting they write).
_GIT_RUNNING_OPTIONS = ("-c", "--config-env", "--exec-path")
_GIT_CONFIG_READS = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list", "-l",
                               "--get-color", "--get-colorbool"})
# A sed `w`/`W` command (or s///w flag) writing to an absolute, home or parent path or into .git.
_SED_WRITE = re.compile(r"(?:^|[;}\s/])[wW]\s*(?:/|~|\.\.|\S*\.git(?:/|\s|$))")
# GNU sed's `e` command and s///e flag run a shell command. Matched loosely: a false match only asks.
_SED_EXEC = re.compile(r"(?:^|[;}\s/\d$])e(?:\s|$|;|})")
# An awk output redirection and its target: print > "file", printf(...) >> out.
_AWK_REDIRECT = re.compile(r">>?\s*(\"[^\"]*\"|[^\s;})]+)")


_BRACE = re.compile(r"\{([^{}]*,[^{}]*)\}")


class Opaque(Exception):
    """The command line cannot be analysed."""


MAX_PROGRAM_TEXT = 4096  # a longer sed/awk program is not read (its regexes could take quadratic time)
_CHECK_EVERY = 4096  # characters or commands between two should_stop() polls


class Stopped(Exception):
    """should_stop() turned true while reading."""


@dataclass
class Word:
    text: str = ""
    quoted: bool = False  # some part was quoted or escaped
    expands: bool = False  # holds a $parameter: its value is known only when it runs
    glob: bool = False  # an unquoted * ? or [
    tilde: bool = False  # starts with an unquoted ~
    brace: bool = False  # an unquoted { (bash expands {a,b})
    quote_at: int | None = None  # where in `text` the first quoted or escaped character is
    # While lexing: pieces joined into `text` by finish() (growing a str attribute piece by piece
    # copies it every time: quadratic on a long word).
    parts: list[str] = field(default_factory=list)
    length: int = 0

    def add(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)

    def finish(self) -> None:
        if self.parts:
            self.text += "".join(self.parts)
            self.parts = []

    def mark_quoted(self) -> None:
        self.quoted = True
        if self.quote_at is None:
            self.quote_at = self.length


@dataclass(frozen=True)
class Op:
    text: str


@dataclass
class Simple:
    """One simple command: its words (assignments and keywords included) and its redirections."""

    words: list[Word]
    redirects: list[tuple[str, Word]]


@dataclass(frozen=True)
class Scan:
    programs: tuple[str, ...]
    risky_writes: tuple[str, ...]


# --------------------------------------------------------------------------------------------------
# Lexer


def _tokens(command: str, should_stop: Callable[[], bool]) -> list[Word | Op]:
    """The shell words and operators of a command line, in order.

    One function of 100+ lines on purpose: it is a single character-by-character state machine
    (quotes, escapes, `$(...)`, here-documents) whose states share the current word; split into
    helpers, every helper would have to pass all of that state back and forth."""
    out: list[Word | Op] = []
    word: Word | None = None
    heredocs: list[tuple[Word, bool]] = []  # (delimiter word, strip tabs) waiting for the next newline
    pending_delim: bool | None = None  # the next word is a here-document delimiter (value: strip tabs)
    i, n = 0, len(command)

    def end_word() -> None:
        nonlocal word, pending_delim
        if word is not None:
            word.finish()
            out.append(word)
            if pending_delim is not None:
                heredocs.append((word, pending_delim))
                pending_delim = None
            word = None

    def cur() -> Word:
        nonlocal word
        if word is None:
            word = Word()
        return word

    next_check = _CHECK_EVERY
    while i < n:
        if i >= next_check:
            next_check = i + _CHECK_EVERY
            if should_stop():
                raise Stopped
        c = command[i]
        if c in " \t\r":
            end_word()
            i += 1
        elif c == "\n":
            end_word()
            out.append(Op("\n"))
            i += 1
            for delim, strip_tabs in heredocs:
                i = _skip_heredoc(command, i, delim, strip_tabs)
            heredocs.clear()
        elif c == "#" and word is None:
            while i < n and command[i] != "\n":
                i += 1
        elif c == "\\":
            if i + 1 < n and command[i + 1] == "\n":
                i += 2  # line continuation
                continue
            w = cur()
            w.mark_quoted()
            if i + 1 < n:
                w.add(command[i + 1])
            i += 2
        elif c == "'":
            end = command.find("'", i + 1)
            if end < 0:
                raise Opaque("unbalanced single quote")
            w = cur()
            w.mark_quoted()
            w.add(command[i + 1 : end])
            i = end + 1
        elif c == '"':
            w = cur()
            w.mark_quoted()
            i += 1
            while True:
                if i >= n:
                    raise Opaque("unbalanced double quote")
                d = command[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and command[i + 1] in '$`"\\\n':
                    w.add(command[i + 1])
                    i += 2
                    continue
                if d == "`" or (d == "$" and command[i + 1 : i + 2] == "("):
                    raise Opaque("command substitution")
                if d == "$":
                    w.expands = True
                w.add(d)
                i += 1
        elif c == "`":
            raise Opaque("command substitution")
        elif c == "$":
            if command[i + 1 : i + 2] == "(":
                raise Opaque("command substitution")
            w = cur()
            w.expands = True
            w.add(c)
            i += 1
        elif c in "<>" and command[i + 1 : i + 2] == "(":
            raise Opaque("process substitution")
        elif c in ";&|()<>":
            op = next(o for o in _OPERATORS if command.startswith(o, i))
            if word is not None:
                word.finish()
            if (op[0] in "<>" and word is not None and word.text.isdigit() and not word.quoted):
                word = None  # an io number (2>file): part of the redirection, not a word
            end_word()
            out.append(Op(op))
            if op in ("<<", "<<-"):
                pending_delim = op == "<<-"
            i += len(op)
        else:
            w = cur()
            if c == "~" and not w.length and not w.quoted:
                w.tilde = True
            if c in "*?[":
                w.glob = True
            if c == "{":
                w.brace = True
            w.add(c)
            i += 1
    end_word()
    if pending_delim is not None:
        raise Opaque("here-document without a delimiter")
    return out


def _skip_heredoc(command: str, i: int, delim: Word, strip_tabs: bool) -> int:
    """Skip a here-document's body (from index i, the start of its first line) through its
    delimiter line. An unquoted delimiter means the body is expanded: a command substitution in
    it runs, so it makes the command opaque."""
    n = len(command)
    while i < n:
        end = command.find("\n", i)
        end = n if end < 0 else end
        line = command[i:end]
        if (line.lstrip("\t") if strip_tabs else line) == delim.text:
            return end + 1
        if not delim.quoted and ("`" in line or "$(" in line):
            raise Opaque("command substitution in a here-document")
        i = end + 1
    return n


def _simple_commands(tokens: list[Word | Op]) -> list[Simple]:
    cmds: list[Simple] = []
    cur = Simple([], [])
    k = 0
    while k < len(tokens):
        tok = tokens[k]
        if isinstance(tok, Op) and tok.text in _SEPARATORS:
            if cur.words or cur.redirects:
                cmds.append(cur)
            cur = Simple([], [])
        elif isinstance(tok, Op):  # a redirection: its target is the next word
            target = tokens[k + 1] if k + 1 < len(tokens) else None
            if not isinstance(target, Word):
                raise Opaque("redirection without a target")
            cur.redirects.append((tok.text, target))
            k += 1
        else:
            cur.words.append(tok)
        k += 1
    if cur.words or cur.redirects:
        cmds.append(cur)
    return cmds


def _program_words(cmd: Simple) -> list[Word]:
    """The words from the program on (keywords and leading assignments dropped); [] when the
    segment runs no program (a `for`/`case` header, `done`, a bare assignment)."""
    words = cmd.words
    k = 0
    while k < len(words):
        w = words[k]
        if not w.quoted and w.text in _PREFIX_WORDS:
            k += 1
            continue
        if not w.quoted and w.text in _SKIP_SEGMENT:
            return []
        if _is_assignment(w):
            k += 1  # an environment assignment before the program (checked in _scan)
            continue
        return words[k:]
    return []


def _is_assignment(w: Word) -> bool:
    """NAME=value with NAME and = unquoted (`"A"=1` is a command named A=1, as sh reads it)."""
    name, eq, _ = w.text.partition("=")
    return bool(eq) and name.isidentifier() and (w.quote_at is None or w.quote_at > len(name))


def _sets_running_variable(w: Word) -> bool:
    if not _is_assignment(w):
        return False
    name = w.text.partition("=")[0]
    return name in _RUNNING_VARIABLES or name.startswith(_RUNNING_VARIABLE_PREFIXES)


# --------------------------------------------------------------------------------------------------
# Analysis


def scan(command: str, cwd: str | os.PathLike[str], should_stop: Callable[[], bool] | None = None) -> Scan | None:
    try:
        return _scan(command, os.path.realpath(cwd), should_stop or _never)
    except (Opaque, Stopped, RecursionError):
        return None


def _never() -> bool:
    return False


def command_programs(command: str) -> tuple[str, ...] | None:
    """The programs a command line runs (None: cannot be known, or it runs none)."""
    s = scan(command, os.getcwd())
    return s.programs if s is not None and s.programs else None


def _scan(command: str, root: str, should_stop: Callable[[], bool]) -> Scan:
    cmds = _simple_commands(_tokens(command, should_stop))
    programs: dict[str, None] = {}
    risky: list[str] = []
    # `cd` moves where relative targets land; None: somewhere unknown. A HOME assignment anywhere
    # makes `~` unknown as well.
    where: str | None = root
    home_known = not re.search(r"(?:^|[\s;&|(])(?:export\s+)?HOME=", command)

    def check(word: Word) -> None:
        reason = _risk(word, where, root, home_known)
        if reason:
            risky.append(f"{word.text} ({reason})")

    for count, cmd in enumerate(cmds):
        if count % _CHECK_EVERY == _CHECK_EVERY - 1 and should_stop():
            raise Stopped
        words = _program_words(cmd)
        declares = bool(words) and words[0].text in _DECLARING
        for w in cmd.words if declares or not words else cmd.words[: len(cmd.words) - len(words)]:
            if _sets_running_variable(w):
                raise Opaque(f"{w.text.partition('=')[0]} chooses or runs programs")
        for op, target in cmd.redirects:
            if op not in _OUTPUT_REDIRECTS:
                continue
            if op == ">&" and (target.text.isdigit() or target.text == "-") and not target.quoted:
                continue  # a descriptor duplicated or closed, not a file
            check(target)
        if not words:
            continue
        prog_word, args = words[0], words[1:]
        prog = prog_word.text
        if prog_word.expands or prog_word.glob or prog in RUNNERS or os.path.basename(prog) in RUNNERS:
            raise Opaque(f"{prog} runs a program named by its arguments or not known before it runs")
        programs.setdefault(prog)
        base = os.path.basename(prog)
        if base in ("cd", "pushd", "popd"):
            where = _cd(args, where, home_known) if base != "popd" else None
            continue
        for target in _write_operands(base, args):
            check(target)
        if base in _SED:
            _check_sed(args, check, risky)
        elif base in _AWK:
            _check_awk(args, check, risky)
        elif base == "find":
            flags = {a.text for a in args}
            if flags & _FIND_RUNS:
                raise Opaque("find -exec runs a command")
            if flags & _FIND_WRITES:
                for a in args:
                    if not a.text.startswith("-"):
                        check(a)
        elif base == "dd":
            for a in args:
                if a.text.startswith("of="):
                    check(_value(a, a.text[3:]))
        elif base == "git":
            _check_git(args, check, risky)
    return Scan(tuple(programs), tuple(dict.fromkeys(risky)))


def _value(word: Word, text: str) -> Word:
    # bash expands ~ after = in any word (of=~/x), so a value starting with ~ counts as home.
    return Word(text, word.quoted, word.expands, word.glob, text.startswith("~"), word.brace)


def _option_values(word: Word) -> list[Word]:
    """Paths an option may carry: --target-directory=DIR, -tDIR (checking a short cluster's tail
    as a path is harmless: `-rf` yields `f`, inside the tree)."""
    t = word.text
    if t.startswith("--"):
        return [_value(word, t.partition("=")[2])] if "=" in t else []
    if t.startswith("-") and len(t) > 2:
        return [_value(word, t[2:])]
    return []


def _write_operands(base: str, args: list[Word]) -> list[Word]:
    if base in _WRITES_OPERANDS:
        out: list[Word] = []
        for a in args:
            out.extend(_option_values(a) if a.text.startswith("-") else [a])
        return out
    if base in _WRITES_LAST:
        out = []
        operands = [a for a in args if not a.text.startswith("-")]
        for a in args:
            out.extend(_option_values(a))
        # A target directory given as an option (-t DIR, -rtDIR, --target-directory=DIR), or
        # install -d (every operand is created): check every operand rather than guess which.
        # cp -s/-l make links: as with ln, a link to an outside file is a way out.
        every = any(a.text.startswith(("--target-directory", "--link", "--symbolic-link"))
                    or a.text in ("-d", "--directory")
                    or (a.text.startswith("-") and not a.text.startswith("--") and set(a.text) & set("tsl"))
                    for a in args)
        if every:
            return out + operands
        return out + operands[-1:]
    return []


def _check_sed(args: list[Word], check, risky: list[str]) -> None:
    in_place = any(a.text.startswith("--in-place") or (a.text.startswith("-") and not a.text.startswith("--")
                                                       and "i" in a.text[1:]) for a in args)
    scripts: list[Word] = []
    operands: list[Word] = []
    k = 0
    while k < len(args):
        a = args[k]
        if a.text in ("-e", "--expression") and k + 1 < len(args):
            scripts.append(args[k + 1])
            k += 2
            continue
        if a.text.startswith("--expression="):
            scripts.append(_value(a, a.text.partition("=")[2]))
        elif not a.text.startswith("-"):
            operands.append(a)
        k += 1
    if not scripts and operands:
        scripts.append(operands.pop(0))
    for script in scripts:
        if len(script.text) > MAX_PROGRAM_TEXT:
            raise Opaque("a sed script too long to read")
        if _SED_EXEC.search(script.text):
            raise Opaque("a sed script that may run a command (e)")
        if _SED_WRITE.search(script.text) or script.expands:
            risky.append(f"{script.text} (a sed script that may write outside the working directory or into .git/)")
    if in_place:
        for a in operands:
            check(a)


def _check_awk(args: list[Word], check, risky: list[str]) -> None:
    for a in args:
        if len(a.text) > MAX_PROGRAM_TEXT:
            raise Opaque("an awk program too long to read")
        if "system" in a.text or "|" in a.text:
            raise Opaque("an awk program that runs commands")
        for m in _AWK_REDIRECT.finditer(a.text):
            target = m.group(1)
            if target.isdigit():
                continue  # a comparison with a number ($3 > 100)
            if target.startswith('"'):
                check(Word(target.strip('"'), quoted=True))
            else:  # a variable's value, or a comparison: cannot tell which
                risky.append(f"{m.group()} (an awk output target known only when it runs)")


def _check_git(args: list[Word], check, risky: list[str]) -> None:
    k = 0
    while k < len(args):  # options before the subcommand
        t = args[k].text
        if not t.startswith("-"):
            break
        if t.startswith(_GIT_RUNNING_OPTIONS):
            raise Opaque("git -c can make git run any command")
        if t in ("-C", "--git-dir", "--work-tree") and k + 1 < len(args):
            check(args[k + 1])
            k += 2
            continue
        if t.startswith(("--git-dir=", "--work-tree=")):
            check(_value(args[k], t.partition("=")[2]))
        k += 1
    rest = args[k:]
    if not rest:
        return
    sub, sub_args = rest[0].text, rest[1:]
    flags = {a.text for a in sub_args}
    if (sub == "submodule" and "foreach" in flags) or (sub == "bisect" and "run" in flags) \
            or sub == "filter-branch" or (sub in ("rebase", "difftool", "mergetool")
                                          and any(f in ("-x", "--extcmd") or f.startswith(("--exec", "--extcmd=", "-x"))
                                                  for f in flags)):
        raise Opaque(f"git {sub} runs a command given on the line")
    if sub == "config" and not flags & _GIT_CONFIG_READS:
        # A setting can name a command git runs later (core.pager, core.fsmonitor, alias.x=!cmd).
        risky.append("git config (changes git settings, which can name commands git runs)")
    for a in sub_args:  # clone/worktree/archive/format-patch can write where their operands say
        for target in [a, *_option_values(a)]:
            check(target)


def _cd(args: list[Word], where: str | None, home_known: bool) -> str | None:
    operands = [a for a in args if not a.text.startswith("-") or a.text == "-"]
    if not operands:
        return os.path.expanduser("~") if home_known else None
    a = operands[0]
    if a.text == "-" or a.expands or a.glob or (a.tilde and not home_known):
        return None
    text = os.path.expanduser(a.text) if a.tilde else a.text
    if not os.path.isabs(text) and (where is None or os.environ.get("CDPATH")):
        return None  # CDPATH may send a relative cd anywhere
    return os.path.realpath(os.path.join(where or "/", text))


def _risk(word: Word, where: str | None, root: str, home_known: bool) -> str:
    """Why writing `word` needs the user every time ("" when it stays inside the tree)."""
    if word.expands:
        return "known only when it runs"
    if word.text in _HARMLESS_TARGETS:
        return ""
    alternatives = _brace_alternatives(word.text) if word.brace else [word.text]
    if alternatives is None:
        return "too many brace alternatives to check"
    reasons = [_path_risk(text, word, where, root, home_known) for text in alternatives]
    return next((r for r in reasons if r), "")


def _path_risk(text: str, word: Word, where: str | None, root: str, home_known: bool) -> str:
    if word.tilde and text.startswith("~"):
        if not home_known:
            return "HOME is changed by the command"
        text = os.path.expanduser(text)
    if not os.path.isabs(text) and where is None:
        return "after a cd to a place known only when it runs"
    # Not normalised before realpath: link/.. is the link's target's parent, not the tree's.
    full = os.path.join(where or "/", text)
    paths = [full]
    if word.glob:
        if any(fnmatch.fnmatchcase(".git", part) for part in _parts_below(os.path.normpath(full), root)):
            return "may be inside .git/"
        paths += glob.glob(full)
    for p in paths:
        real = os.path.realpath(p)
        lexical = os.path.normpath(p)
        if not _inside(real, root) or not _inside(lexical, root):
            return "outside the working directory"
        if ".git" in _parts_below(real, root) or ".git" in _parts_below(lexical, root):
            return "inside .git/"
        try:
            st = os.stat(real)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            # A hard link's other names may be anywhere on the file system.
            return "a file with other hard links, which may be outside the working directory"
    return ""


def _brace_alternatives(text: str, limit: int = 64) -> list[str] | None:
    """bash's brace expansion, enough to see every place `{a,../b}` may name; None when there are
    more than `limit` places (or more than 16 groups): too many to check, the write then asks."""
    if text.count("{") > 16:
        return None
    pending, out = [text], []
    while pending:  # a work list, not recursion
        t = pending.pop()
        m = _BRACE.search(t)
        if not m:
            out.append(t)
            if len(out) > limit:
                return None
            continue
        pending.extend(reversed([t[: m.start()] + alt + t[m.end():] for alt in m.group(1).split(",")]))
        if len(pending) > limit:
            return None
    return out


def _parts_below(path: str, root: str) -> list[str]:
    return os.path.relpath(path, root).split(os.sep) if _inside(path, root) else []


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False
