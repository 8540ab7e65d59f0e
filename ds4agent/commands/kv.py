"""`ds4agent kv ls|show|verify|rm`: inspect the KV directory without loading a model.

Plain text only (no colour, no terminal control), so the output is the same in a pipe. Errors are
one line on stderr and exit status 1; `verify` exits 1 when any file is invalid.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from ds4agent.agent.events import format_age
from ds4agent.commands.settings import KvSettings
from ds4agent.sessions.entries import UnreadableSession, default_kv_dir
from ds4agent.sessions.errors import KVCError, KVCStoreError
from ds4agent.sessions.kvc import (
    EXT_CHECKSUM,
    EXT_KTM,
    EXT_RESERVED,
    EXT_RESPONSES_VISIBLE,
    EXT_THINKING_VISIBLE,
    EXT_TITLE,
    REASON_SESSION,
    VerifyResult,
    classify_name,
    read_header,
    verify_kvc,
)
from ds4agent.sessions.payload import FLASH_SHAPE
from ds4agent.sessions.store import SessionStore
from ds4agent.sessions.titles import derive_title, display_text
from ds4agent.ui.fmt import cells, clip, fit, format_size

PREVIEW_BYTES = 400
TITLE_MIN = 12  # `kv ls` narrows a long file name before it cuts a title shorter than this


def _when(ts: int) -> str:
    if ts == 0:
        return "0"
    try:
        return f"{ts} ({datetime.fromtimestamp(ts, UTC):%Y-%m-%d %H:%M:%S} UTC)"
    except (OverflowError, OSError, ValueError):
        return str(ts)


def _ext_names(ext: int) -> str:
    names = [n for bit, n in ((EXT_KTM, "ktm"), (EXT_RESPONSES_VISIBLE, "responses-visible"),
                              (EXT_THINKING_VISIBLE, "thinking-visible"), (EXT_TITLE, "title"),
                              (EXT_CHECKSUM, "checksum")) if ext & bit]
    if ext & EXT_RESERVED & ~EXT_CHECKSUM:
        names.append(f"reserved 0x{ext & EXT_RESERVED & ~EXT_CHECKSUM:02x}")
    return f"0x{ext:02x}" + (f" ({', '.join(names)})" if names else "")


# The model file name shown for a session, at most this long (a pulled file's name is long).
MODEL_LABEL = 20


def _saved_with(directory: Path) -> dict[str, str]:
    """Short session id -> the model file it was saved with (the session index), where known."""
    from ds4agent.models.fingerprint import model_name
    from ds4agent.sessions.index import SessionIndex

    found = {}
    for sid, entry in SessionIndex(directory).read().items():
        name = model_name(entry.fingerprint) if entry.fingerprint else Path(entry.model).name
        if name:
            found[sid[:8]] = name if len(name) <= MODEL_LABEL else name[:MODEL_LABEL - 1] + "…"
    return found


def _escape(data: bytes) -> str:
    """Text for one line: printable characters as they are, the rest (newlines, controls, invalid
    UTF-8 as U+FFFD) escaped, so a preview never spans lines or moves the cursor."""
    text = data.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _name(path: object) -> str:
    """A file name or path for one output line. Names come from the directory, not from us: bytes
    that are not UTF-8 arrive as surrogates (which a strict UTF-8 stdout, e.g. macOS's, refuses
    to encode) and a name may hold a newline or an escape sequence. Those are shown as \\xNN or
    \\n-style escapes; printable characters (non-ASCII included) are kept."""
    out = []
    for c in str(path):
        if "\udc80" <= c <= "\udcff":
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        elif c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1])
    return "".join(out)


def _kv_files(directory: Path) -> list[Path]:
    """Every entry named `*.kv` (temp files end in `.tmp`, so they are not listed). Entries that
    are not regular files (a FIFO, a dangling link, a directory) are kept: verify reports them as
    invalid instead of silently checking fewer files than the directory shows."""
    return [directory / name for name in sorted(os.listdir(directory)) if name.endswith(".kv")]


MODEL_NAMES = {0: "flash", 1: "pro"}  # KVC header byte 7 (kvc-format.md §2)


def _model_name(model_id: int | None) -> str:
    if model_id is None:
        return "?"
    return MODEL_NAMES.get(model_id, f"id {model_id}")


def terminal_columns() -> int:
    """The width `kv ls` fits: $COLUMNS, else the terminal's; 0 (no limit) in a pipe, where a
    script reading the listing gets whole titles."""
    return shutil.get_terminal_size(fallback=(0, 0)).columns


def fit_name_column(lines: list[tuple[str, str]], width: int, columns: int) -> list[tuple[str, str]]:
    """Rows whose first column (after the two-space indent, `width` wide) is narrowed so that the
    other columns and a short title fit `columns`: a cache file's long name would otherwise push
    every session's title off an 80-column screen. A long name keeps its start, which tells the
    kind of cache it is, and ends in "…" (`kv verify` lists whole names)."""
    if columns <= 0 or not lines:
        return lines
    others = max(cells(line) for line, _ in lines) - 2 - width
    narrow = max(8, min(width, columns - 2 - others - (2 + TITLE_MIN if any(t for _, t in lines) else 0)))
    if narrow >= width:
        return lines
    out = []
    for line, title in lines:
        name, rest = line[2:2 + width].rstrip(), line[2 + width:]
        if len(name) > narrow:
            name = name[:narrow - 1] + "…"
        out.append((f"  {name:<{narrow}}{rest}", title))
    return out


def fit_row(line: str, title: str, columns: int) -> str:
    """A listing row in `columns` cells (0: no limit): the title, the last and only free-text
    column, is cut with "…" to the room the other columns leave. A row whose other columns alone
    are too wide (a cache file's long name in a very narrow terminal) is cut with "…" too."""
    row = f"{line}  {title}" if title else line
    if columns <= 0 or cells(row) <= columns:
        return row
    room = columns - cells(line) - 2
    if title and room >= 1:
        return f"{line}  {fit(title, room)}"
    return clip(line, columns)


def cmd_ls(store: SessionStore, out: TextIO, model_id: int | None = None) -> int:
    """The /list columns (id, age, tokens, size, stripped mark, title) plus the file's kind and
    model, for every model's files, or with `model_id` only that model's (an unreadable session is
    always listed: its model is unknown, and the user may want to rm it)."""
    now = time.time()
    # (id or name, kind, model id (None: unknown), used at, tokens, size, stripped, title)
    rows: list[tuple[str, str, int | None, int, str, int, bool, str]] = []

    def used_at(h) -> int:
        return h.last_used or h.created_at

    sessions, unreadable = store.scan_sessions()
    # The header's model id says only "a Flash-architecture model": the tiny test model's sessions
    # have it too. The index knows the file a session was saved with; that name is shown instead.
    saved_with = _saved_with(store.directory)
    for info in sessions:
        h = info.entry.header
        rows.append((info.entry.short_id, h.reason_name, h.model_id, used_at(h), str(h.tokens),
                     info.entry.file_size, h.payload_bytes == 0, info.display_title))
    for broken in unreadable:  # listed with the reason, not hidden: the user can still rm it
        rows.append((broken.short_id, "unreadable", None, broken.last_used, "?", broken.file_size, False,
                     broken.display_title))
    for entry in store.entries():  # server checkpoints
        h = entry.header
        if h.reason != REASON_SESSION:
            rows.append((entry.short_id, h.reason_name, h.model_id, used_at(h), str(h.tokens), entry.file_size,
                         False, ""))
    named = _kv_files(store.directory)
    for path in named:
        # is_file first: opening a FIFO named like a cache would block the listing forever
        if classify_name(path.name)[0] in ("sysprompt-hex", "sysprompt") and path.is_file():
            try:
                h = read_header(path)
                rows.append((path.name, h.reason_name, h.model_id, used_at(h), str(h.tokens),
                             path.stat().st_size, False, ""))
            except (OSError, KVCError):
                continue
    # Files that are neither sessions nor caches are not listed (§8.1); say that some were skipped,
    # so a damaged file is not simply missing from the list without a hint.
    skipped = len(named) - len(rows)
    other_models = 0
    if model_id is not None:
        shown = [r for r in rows if r[2] is None or r[2] == model_id]
        other_models, rows = len(rows) - len(shown), shown
    rows.sort(key=lambda r: -r[3])
    which = "" if model_id is None else f" for model {_model_name(model_id)}"
    print(f"KV files in {_name(store.directory)}{which}:", file=out)
    if not rows:
        print("  (none)", file=out)
    width = max((len(r[0]) for r in rows), default=8)  # cache file names are longer than short ids
    labels = [saved_with.get(r[0]) or _model_name(r[2]) for r in rows]
    label_width = max((len(label) for label in labels), default=5)
    columns = terminal_columns()
    lines = []
    for (ident, kind, _, used, tokens, size, stripped, title), label in zip(rows, labels, strict=True):
        line = (f"  {ident:<{width}} {kind:<13} {label:<{label_width}} {format_age(now - used):>9} "
                f"{tokens:>8} tokens {format_size(size):>11} {'stripped' if stripped else '':<8}")
        lines.append((line.rstrip(), title))
    for line, title in fit_name_column(lines, width, columns):
        print(fit_row(line, title, columns), file=out)
    if other_models:
        print(f"  ({other_models} file(s) of other models not listed: `ds4agent kv ls --all`)", file=out)
    if skipped > 0:
        print(f"  ({skipped} other .kv file(s) not listed: not valid KV files; see `ds4agent kv verify`)",
              file=out)
    return 0


def _resolve_target(store: SessionStore, target: str) -> Path:
    """A path (as given, or inside the store), else a hex id prefix.

    A prefix resolves against scan-valid files first (§12.5). `show` is the tool for finding out
    why a file is invalid, so when no valid file matches, a single 40-hex `.kv` file whose name
    starts with the prefix is shown anyway (with its chain error) rather than "no match"."""
    if not target:
        raise KVCStoreError("give a file path or a session id prefix")
    path = Path(target)
    if path.exists() or path.is_symlink():  # a file given by path needs no KV directory
        return path
    if not store.directory.is_dir():
        raise KVCStoreError(f"{target}: no such file, and no KV directory at {store.directory}")
    if (store.directory / target).exists():
        return store.directory / target
    try:
        return store.resolve(target, sessions_only=False).path
    except KVCStoreError:
        p = target.lower()
        named = [store.directory / n for n in os.listdir(store.directory)
                 if classify_name(n)[0] == "hex40" and n.lower().startswith(p)]
        if len(named) == 1:
            return named[0]
        raise


def cmd_show(store: SessionStore, target: str, out: TextIO) -> int:
    path = _resolve_target(store, target)
    result = verify_kvc(path)
    env = result.envelope
    print(f"file:           {_name(path)}", file=out)
    try:
        print(f"size:           {path.stat().st_size} bytes", file=out)
    except OSError:
        pass
    if env is None:
        print(f"status:         INVALID: {result.error}", file=out)
        return 1
    h = env.header
    print(f"kind:           {result.kind}", file=out)
    layout = " (earlier ds4 build; a re-save writes [L] under a new name)" if h.layout == "[S]" else ""
    print(f"layout:         {h.layout}{layout}", file=out)
    print(f"reason:         {h.reason} ({h.reason_name})", file=out)
    print(f"quant bits:     {h.quant_bits}", file=out)
    print(f"model id:       {h.model_id}{' (DeepSeek V4 Flash)' if h.model_id == 0 else ''}", file=out)
    print(f"ext flags:      {_ext_names(h.ext_flags)}", file=out)
    print(f"key kind:       {h.key_kind}", file=out)
    print(f"tokens:         {h.tokens}", file=out)
    print(f"hits:           {h.hits}", file=out)
    print(f"ctx size:       {h.ctx_size}", file=out)
    print(f"reserved:       {h.reserved.hex(' ')}", file=out)
    print(f"created at:     {_when(h.created_at)}", file=out)
    print(f"last used:      {_when(h.last_used)}", file=out)
    print(f"text:           {env.text_bytes} bytes", file=out)
    print(f"payload:        {h.payload_bytes} bytes{' (stripped session)' if h.payload_bytes == 0 else ''}",
          file=out)
    trailers = []
    if env.ktm_entries is not None:
        trailers.append(f"KTM tool map ({env.ktm_entries} entries)")
    if env.title is not None:
        trailers.append(f"title ({len(env.title)} bytes)")
    print(f"trailers:       {', '.join(trailers) or 'none'}", file=out)
    if env.title is not None:
        print(f"title:          {display_text(env.title)}", file=out)
    elif h.reason == REASON_SESSION:
        print(f"title:          {display_text(derive_title(env.text))} (derived: legacy session)", file=out)
    preview = env.text[:PREVIEW_BYTES]  # env.text itself is capped (kvc.TEXT_SCAN_BYTES)
    more = f" ... ({env.text_bytes - len(preview)} more bytes)" if env.text_bytes > len(preview) else ""
    print(f"text preview:   {_escape(preview)}{more}", file=out)
    info = result.payload
    if info is not None:
        p = info.header
        print("payload header: "
              f"ctx {p.ctx}, chunk {p.chunk}, raw capacity {p.raw_capacity}, window {p.window}, "
              f"compressed capacity {p.comp_capacity}, tokens {p.n_tokens}, layers {p.n_layers}, "
              f"D {p.head_dim}, Di {p.indexer_dim}, vocab {p.vocab}, raw rows {p.raw_rows}", file=out)
        flash = p.layout_key == FLASH_SHAPE.layout_key
        print("layers:         layer ratio  compressed  indexer", file=out)
        for layer in range(p.n_layers):
            ratio = str(FLASH_SHAPE.ratios[layer]) if flash else "?"
            print(f"                {layer:>5} {ratio:>5} {int(info.n_comp[layer]):>11} "
                  f"{int(info.n_index_comp[layer]):>8}", file=out)
        if not info.layers_checked:
            print("                (per-layer ratios are not stored in the file and this is not the Flash "
                  "layout: layer arrays were size-checked only)", file=out)
    print(f"status:         {'ok' if result.ok else f'INVALID: {result.error}'}", file=out)
    return 0 if result.ok else 1


def _verify_line(result: VerifyResult) -> str:
    name = _name(result.path.name)
    if not result.ok:
        return f"INVALID  {name}  {result.error}"
    assert result.envelope is not None  # a valid file always has its envelope
    h = result.envelope.header
    note = ""
    if result.payload is not None and not result.payload.layers_checked:
        note = "  (non-Flash layout: layer arrays size-checked only)"
    return f"ok       {name}  {h.reason_name}, {h.tokens} tokens{note}"


def cmd_verify(store: SessionStore, out: TextIO) -> int:
    files = _kv_files(store.directory)
    bad = 0
    for path in files:
        result = verify_kvc(path)
        bad += not result.ok
        print(_verify_line(result), file=out)
    print(f"{len(files)} file(s) checked, {bad} invalid", file=out)
    return 1 if bad else 0


def cmd_rm(store: SessionStore, prefix: str, out: TextIO) -> int:
    found = store.find_session(prefix)  # an unreadable session file can be removed too
    if isinstance(found, UnreadableSession):
        what = f"unreadable session {found.short_id} ({found.reason})"
    else:
        described = store.describe(found)
        what = f"session {found.short_id} ({found.header.tokens} tokens) {described.display_title}"
    path = store.delete(found.id)
    from ds4agent.sessions.index import remove_session_extras

    remove_session_extras(store.directory, found.id)  # its index entry and undo log
    print(f"deleted {what}: {_name(path)}", file=out)
    return 0


def main(settings: KvSettings, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    directory = default_kv_dir(settings.kv_dir)
    try:
        store = SessionStore(directory, create=False)
        action = settings.action
        if action == "show":  # `kv show FILE` needs no KV directory
            return cmd_show(store, settings.target or "", out)
        if not directory.is_dir():
            if action in ("ls", "verify") and not directory.exists():
                # A fresh install: the directory appears at the first start of the agent.
                print(f"no sessions yet (no KV directory at {_name(directory)})", file=out)
                return 0
            raise KVCError(f"no KV directory at {directory}")
        if action == "ls":
            return cmd_ls(store, out, settings.model_id)
        if action == "verify":
            return cmd_verify(store, out)
        if action == "rm":
            return cmd_rm(store, settings.prefix or "", out)
        raise KVCError(f"unknown kv action: {action}")
    except KVCError as err:
        print(f"ds4agent kv: {_name(err.with_path())}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `ds4agent kv verify | head`: the CLI ends quietly with 141 (not 0: that would hide
        # invalid files from `set -o pipefail` scripts); not an I/O error of the KV directory.
        raise
    except OSError as err:
        print(f"ds4agent kv: {_name(directory)}: {err.strerror or err}", file=sys.stderr)
        return 1
