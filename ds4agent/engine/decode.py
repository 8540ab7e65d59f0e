"""The one decode primitive: `generate`, a generator of token ids over a Session.

    for token in generate(session, sampler, max_tokens=cap, greedy=lambda: parser.in_syntax):
        ...  # parse, emit events; `break` to stop (interrupt, stop token, closing tag)

How a token moves (mlx-lm's generate_step pattern, with the sample as a graph of its own):

    sample t[n] from the logits after t[n-1]      (a small graph: sampler.draw)
    dispatch the step of t[n]  (mx.async_eval)    (the forward pass, t[n] still on the device)
    GPU kernel set: sample t[n+1] from the lazy logits of that step and dispatch t[n+1]'s
                    step too, before t[n] is read (building a step reads nothing back there)
    read t[n]                                     (the one host read of the token: it waits for
                                                   the step of t[n-1] and the sample only)
    yield t[n]        <- the device computes while the consumer works on t[n]
    accept the step of t[n]; ask greedy() for t[n+1]; ...

So graph building runs while the device computes the token before, the consumer's work runs
while the device computes, and the device never waits for Python to build a graph. The sampling
mode of t[n+1] is decided from t[n]: the mode t[n+1] was built with is a guess (greedy() before
the consumer has seen t[n]); once the consumer has seen t[n] greedy() is asked again, and on a
miss the guessed sample and step are dropped (the RNG key put back) and t[n+1] is sampled and
dispatched anew. DSML syntax spans many tokens, so a miss is rare, and the rule holds exactly.
Where building a step reads ids back (the CPU kernel set's expert kernels, a pipeline), the
step of t[n+1] is built after the consumer is done with t[n] instead (Engine.chains_steps).

The step of a handed-out token is speculative until the consumer asks for the next token. While
the consumer holds t[n], the session holds exactly the tokens before t[n]; it only advances when
the consumer resumes the generator. Stopping (break, close(), an exception in the consumer, the
token cap, a full context) drops the in-flight step, so the session ends exactly as it stood
when the last token was handed out: the step loop's state without that token. The caller
appends the handed-out tokens it keeps to its transcript; the next `sync` runs the rest.

The RNG advances once per sampled (non-greedy) token handed out, never for a dropped step: a
speculative draw that is not handed out is undone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import mlx.core as mx

from .duty import DutyCycle
from .errors import EngineError
from .hostread import to_int
from .sampler import check_token


def generate(session: Any, sampler: Any, *, max_tokens: int,
             greedy: Callable[[], bool] | None = None,
             forced: Callable[[], int | None] | None = None,
             duty: DutyCycle | None = None) -> Generator[int, None, None]:
    """Token ids sampled after the session's live state, at most `max_tokens` (and no more than
    the context can take: the last one is handed out without a step). `greedy()` is asked before
    each token is sampled (None: the sampler's own mode for every token). `forced()` is asked
    once per token, after the consumer has seen the token before it: an id it returns is the
    next token instead of a sample (stepped and handed out like one; the RNG does not advance),
    None lets the sampler draw. It may consume what it returns (a queue): a token built ahead is
    always a sample, and a forced id found afterwards replaces it like a missed mode guess.
    `duty` rests between tokens (duty.py): after the consumer is done with a token and before the
    next step is dispatched, so the device runs out of work while it rests; the tokens and the
    RNG are the same as without it.

    The session must hold at least one token (its logits are where decoding starts) and must not
    be driven by anything else until the generator ends."""
    if max_tokens <= 0:
        return
    logits = session.next_logits
    if logits is None:
        raise EngineError("nothing to decode from: the session holds no tokens")
    ctx = session.engine.ctx
    chain = getattr(session.engine, "chains_steps", False)

    def mode() -> bool:
        return bool(greedy()) if greedy is not None else False

    def next_forced() -> int | None:
        f = forced() if forced is not None else None
        return None if f is None else check_token(int(f))

    def start(logits_: Any, greedy_now: bool, last: bool, after: Any = None,
              force: int | None = None) -> tuple[Any, Any]:
        """Sample a token from lazy logits (or take the forced id) and dispatch its step (None
        when it is the last)."""
        tok_ = mx.array(force, dtype=mx.int32) if force is not None else sampler.draw(logits_, greedy=greedy_now)
        # The key is evaluated with its token: it must not grow into a graph token by token.
        mx.async_eval(tok_, sampler.key)
        # An error code (negative id, sampler.py) must never index the embedding on the
        # device; the step it feeds is dropped when the code is read.
        if last:
            return tok_, None
        safe = mx.maximum(tok_, 0)
        return tok_, session.dispatch(safe) if after is None else session.dispatch(safe, after=after)

    if duty is not None:
        duty.begin()
    n = 1
    token, pending = start(logits, mode(), n >= max_tokens or len(session) + 1 > ctx, force=next_forced())
    spec = None  # (key before the draw, its mode, token, step): token n+1 built ahead
    try:
        while True:
            if chain and pending is not None:
                # Build token n+1's sample and step now, before token n is read and handed out,
                # so graph building runs while the device computes token n's step and the
                # consumer's work on token n runs while the device computes this one. Its mode
                # is a guess (decided before the consumer has seen token n); checked below.
                key_before, guess = sampler.key, mode()
                nxt = start(pending.logits, guess,
                            n + 1 >= max_tokens or len(session) + 2 > ctx, after=pending)
                spec = (key_before, guess, *nxt)
            tok = check_token(to_int(token))
            yield tok
            if pending is None:
                return
            if duty is not None:
                duty.pause()
            session.accept(pending, tok)
            n += 1
            force = next_forced()  # both decided from token n, which the consumer has now seen
            now = mode()
            if spec is not None and force is None and spec[1] == now:
                token, pending = spec[2], spec[3]
            else:
                if spec is not None:
                    sampler.key = spec[0]  # undo the guessed draw: the RNG only moves for tokens handed out
                token, pending = start(session.next_logits, now,
                                       n >= max_tokens or len(session) + 1 > ctx, force=force)
            spec = None
    finally:
        if spec is not None:
            sampler.key = spec[0]  # a dropped speculative token never moves the RNG
        # Nothing lazy or in flight may outlive the generator: the session and the sampler may
        # next be used from another thread (session.py's module doc).
        session.settle()
        mx.eval(sampler.key)
