"""A scripted Engine/Session with the real engine's API (contracts: engine/session.py): the tests'
double of the engine, and the engine of `ds4agent --demo` (demo.py), which walks a newcomer
through the tool loop without a model.

It runs no model. Each time the live state is synced to a transcript that ends with a generation
prompt (`<｜Assistant｜><think>` or `<｜Assistant｜></think>`), the session starts the next scripted
response, and its logits make that response's tokens the only choice, one after the other (a
one-hot logit row: greedy and temperature sampling with min-p both pick it). After the response
it offers EOS. Responses are given as text (tokenised by the real tokenizer with the rendered-chat
rules, so `</think>` and `｜DSML｜` become their special ids, like a model's output) or as ids.

Everything is instant; `engine.prefills` records how many tokens each `sync` call prefilled, so
tests can assert that a turn prefilled only the new suffix.

    eng = ScriptedEngine(["reasoning</think>Hello!"])
    eng.add(reply(think="...", calls=[("read", {"path": "a.py"})]))    # a DSML call, canonical form
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ds4agent.engine import ContextOverflowError, Interrupted, StateError
from ds4agent.protocol.tokenizer import ASSISTANT, END_THINK, EOS, THINK, VOCAB_SIZE, Tokenizer
from ds4agent.sessions.payload import LayerPayload, PayloadShape, PayloadState

Response = Sequence[int] | Callable[[tuple[int, ...]], Sequence[int]]

# A tiny, valid payload layout (one dense layer): saving/loading through the real store works.
_IDS = None  # mx.arange(VOCAB_SIZE), made on first use (next_logits)
SCRIPTED_SHAPE = PayloadShape(n_layers=1, head_dim=4, indexer_dim=4, vocab=VOCAB_SIZE, window=4, ratios=(0,))


def text_ids(text: str) -> list[int]:
    """A model output given as text: the seven special strings become their ids (rendered-chat rules)."""
    return Tokenizer.load().encode_trusted(text)


def reply(
    text: str = "",
    *,
    think: str | None = "",
    calls: Sequence[tuple[str, Mapping[str, Any]]] = (),
    eos: bool = True,
) -> list[int]:
    """A canonical model output after the generation prompt: [think </think>] text [DSML block] [EOS].

    think=None means nothink mode (no reasoning and no </think>). With calls and eos=True the EOS
    is left out (the model stops at the block's close; the agent appends EOS itself).
    """
    from ds4agent.protocol import template

    mode = "nothink" if think is None else "think"
    return template.render(template.assistant_output_pieces(
        reasoning=think, text=text, calls=calls, think_mode=mode, eos=eos and not calls))


def _ends_with_prompt(t) -> bool:
    return len(t) >= 2 and t[-2] == ASSISTANT and t[-1] in (THINK, END_THINK)


@dataclass
class _Cursor:
    tokens: list[int]
    pos: int = 0
    off_script: bool = False


class ScriptedSession:
    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self._tokens: list[int] = []  # a list: step() appends in O(1)
        self._logits = np.full(VOCAB_SIZE, -1e9, dtype=np.float32)
        self._hot = -1
        self.logits: np.ndarray | None = None
        self._cursor: _Cursor | None = None
        self.steps = 0  # tokens decoded by step()

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    @tokens.setter
    def tokens(self, value) -> None:
        self._tokens = list(value)

    # ------------------------------------------------------------------ logits
    def _offer(self, token: int) -> np.ndarray:
        """Make `token` the only choice (reuses one array: O(1) per token)."""
        if self._hot >= 0:
            self._logits[self._hot] = -1e9
        self._logits[token] = 0.0
        self._hot = token
        self.logits = self._logits
        return self._logits

    def _next_scripted(self) -> int:
        c = self._cursor
        if c is None or c.off_script or c.pos >= len(c.tokens):
            return EOS
        return c.tokens[c.pos]

    # ------------------------------------------------------------------ the Session API
    def sync(self, tokens: Sequence[int], *, progress=None, should_stop=None, duty=None) -> int:
        tokens = tuple(tokens)
        if len(tokens) > self.engine.ctx:
            raise ContextOverflowError(len(tokens), self.engine.ctx)
        live = self._tokens
        keep = 0
        limit = min(len(tokens), len(live))
        while keep < limit and tokens[keep] == live[keep]:
            keep += 1
        total = len(tokens) - keep
        if keep < len(live):
            del live[keep:]  # rewind (the real engine restores a snapshot or re-prefills)
        done = 0
        chunk = self.engine.chunk
        if duty is not None:
            duty.begin()
        while done < total:
            if should_stop is not None and should_stop():
                self.engine.prefills.append(done)
                raise Interrupted(done=done, total=total)
            n = min(chunk, total - done)
            done += n
            self._tokens = list(tokens[: keep + done])
            if progress is not None:
                progress(done, total)
            if duty is not None:
                duty.pause()  # as the engine rests after every chunk
        self.engine.prefills.append(total)
        if total or self.logits is None or _ends_with_prompt(self._tokens):
            # A generation prompt starts the next scripted response even when nothing was
            # prefilled (a retry from the same state, as after a failed compaction).
            self._after_sync()
        return total

    def _after_sync(self) -> None:
        t = self._tokens
        if _ends_with_prompt(t):
            self._cursor = _Cursor(list(self.engine.next_response(tuple(t))))
            self.engine.responses_started += 1
        else:
            self._cursor = None
        self._offer(self._next_scripted())

    def step(self, token: int) -> np.ndarray:
        if len(self._tokens) + 1 > self.engine.ctx:
            raise ContextOverflowError(len(self._tokens) + 1, self.engine.ctx)
        self._tokens.append(token)
        self.steps += 1
        c = self._cursor
        if c is not None:
            if not c.off_script:
                if c.pos < len(c.tokens) and c.tokens[c.pos] == token:
                    c.pos += 1
                else:
                    c.off_script = True
            # Off script too: a hook may answer tokens the agent wrote itself (continue_with).
            if self.engine.on_step is not None:
                self.engine.on_step(self, c.pos)
        return self._offer(self._next_scripted())

    def continue_with(self, tokens: Sequence[int]) -> None:
        """From the next token on, the response is `tokens` (a test's on_step hook answers
        tokens the agent wrote itself, as a model would go on after them)."""
        self._cursor = _Cursor(list(tokens))

    # ------------------------------------------------------------------ the decode seam
    # engine/decode.py drives these; a "dispatched" step runs only when accepted (it is instant),
    # so on_step fires when a token is accepted, as it fired when the step loop stepped it.
    @property
    def next_logits(self):
        """The offered one-hot row as a lazy MLX graph: built in microseconds, computed only by a
        sampler that reads it (a 129,280-float copy per token would dominate a long turn)."""
        if self.logits is None:
            return None
        import mlx.core as mx

        global _IDS
        if _IDS is None:
            _IDS = mx.arange(VOCAB_SIZE, dtype=mx.int32)
            mx.eval(_IDS)  # evaluated: usable from every thread
        return mx.where(_IDS == self._hot, 0.0, -1e9)

    def __len__(self) -> int:
        return len(self._tokens)

    def dispatch(self, token) -> object:
        if len(self._tokens) + 1 > self.engine.ctx:
            raise ContextOverflowError(len(self._tokens) + 1, self.engine.ctx)
        return (len(self._tokens), self.steps)  # O(1): a transcript may hold 100k tokens

    def accept(self, pending: object, token: int) -> None:
        if pending != (len(self._tokens), self.steps):
            raise AssertionError("the scripted session changed while a decode step was in flight")
        self.step(token)

    def settle(self) -> None:
        pass

    def snapshot(self) -> object:
        c = self._cursor
        return (self.tokens, self._hot, None if c is None else (list(c.tokens), c.pos, c.off_script))

    def rewind(self, snap: Any) -> None:
        tokens, hot, cur = snap
        self.tokens = tokens
        self._cursor = None if cur is None else _Cursor(cur[0], cur[1], cur[2])
        self._offer(hot if hot >= 0 else EOS)

    def export_state(self) -> PayloadState:
        shape = SCRIPTED_SHAPE
        t = len(self.tokens)
        logits = (self.logits if self.logits is not None else self._offer(EOS)).copy()
        raw = np.zeros((min(t, shape.window), shape.head_dim), dtype=np.float32)
        return PayloadState(
            ctx=self.engine.ctx,
            tokens=np.asarray(self.tokens, dtype=np.uint32),
            logits=logits,
            layers=[LayerPayload(raw=raw)],
        )

    def import_state(self, payload: Any) -> None:
        tokens = tuple(int(x) for x in np.asarray(payload.tokens).tolist())
        if len(tokens) > self.engine.ctx:
            raise StateError(f"state of {len(tokens)} tokens does not fit the context of {self.engine.ctx}")
        logits = np.asarray(payload.logits, dtype=np.float32)
        if logits.shape != (VOCAB_SIZE,):
            raise StateError(f"logits have shape {logits.shape}, expected ({VOCAB_SIZE},)")
        self.tokens = tokens
        hot = int(np.argmax(logits))
        self._cursor = None
        self._offer(hot)


class ScriptedEngine:
    """The Engine double. `script`: responses in order (ids, text, or callables of the live tokens)."""

    model_id = 0
    quant_bits = 4

    def __init__(self, script: Iterable[Response | str] = (), *, ctx: int = 16384, chunk: int = 256) -> None:
        self.ctx = ctx
        self.chunk = chunk
        self.config = SimpleNamespace(name="scripted", vocab_size=VOCAB_SIZE)
        self.script: deque[Response] = deque()
        self.prefills: list[int] = []
        self.responses_started = 0
        self.sessions: list[ScriptedSession] = []
        # on_step(session, pos): called after each decoded token (pos = scripted tokens matched so far);
        # tests use it to interrupt or queue a message at an exact point of a response.
        self.on_step: Callable[[ScriptedSession, int], None] | None = None
        self.add(*script)

    def add(self, *responses: Response | str) -> None:
        for r in responses:
            self.script.append(text_ids(r) if isinstance(r, str) else r)

    def next_response(self, tokens: tuple[int, ...]) -> Sequence[int]:
        if not self.script:
            return [EOS]
        r = self.script.popleft()
        return r(tokens) if callable(r) else r

    def payload_shape(self) -> PayloadShape:
        return SCRIPTED_SHAPE

    def new_session(self) -> ScriptedSession:
        s = ScriptedSession(self)
        self.sessions.append(s)
        return s

    def describe(self) -> str:
        return "scripted test engine"
