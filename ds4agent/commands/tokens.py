"""`ds4agent tokens`: print the token ids and token texts of a text, one token per line (ds4 --dump-tokens).

Default: the rendered-chat rules (the seven protocol specials are recognised anywhere in the text, as when a
saved transcript is re-tokenised); `--plain-text`: untrusted text, plain BPE only. Each line is
`ID<TAB>TEXT`, TEXT being the token's bytes with newlines, tabs, backslashes and bytes that are not UTF-8
escaped (`\\n`, `\\t`, `\\\\`, `\\xNN`) so that one token stays on one line.
"""

from __future__ import annotations

import sys

from ds4agent.protocol.tokenizer import Tokenizer, TokenizerError, as_bytes

from .settings import TokensSettings

_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def show_bytes(data: bytes) -> str:
    """One-line printable form of token bytes (invalid UTF-8 as \\xNN, control characters escaped)."""
    out = []
    for ch in data.decode("utf-8", "surrogateescape"):
        cp = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= cp <= 0xDCFF:
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        else:
            out.append(ch)
    return "".join(out)


def main(settings: TokensSettings) -> int:
    if settings.file is not None:
        try:
            with open(settings.file, "rb") as f:
                data = f.read()
        except OSError as exc:
            print(f"ds4agent tokens: cannot read {settings.file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        data = as_bytes(settings.text)
    try:
        tok = Tokenizer.load()
    except TokenizerError as exc:
        print(f"ds4agent tokens: {exc}", file=sys.stderr)
        return 2
    ids = tok.encode_untrusted(data) if settings.plain_text else tok.encode_trusted(data)
    lines = [f"{i}\t{show_bytes(tok.token_bytes(i))}" for i in ids]
    out = sys.stdout
    if lines:
        out.write("\n".join(lines) + "\n")
    out.flush()
    print(f"{len(ids)} token{'' if len(ids) == 1 else 's'}", file=sys.stderr)
    return 0
