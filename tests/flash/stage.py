"""A stand-in system-prompt KV for agent runs at the Flash shape.

The agent's system prefix is ~2,160 tokens; prefilling it at the real shape takes minutes on this
project's 2-core CPU with the fast kernels (over an hour on the exact reference path), so agent
tests at that shape start from the system-prompt cache (`sysprompt-<hex>.kv`), exactly as a
user's second start does. The cache is written here for the exact text the agent will render
(the agent's own renderer, settings and tools), holding a deterministic stand-in state of the
right Flash layout: everything after it (user turns, decoding, /save, /load, crash resume) is
computed by the real engine at full shape.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def seed_sysprompt_cache(argv: list[str], cwd: Path, kv_dir: Path) -> int:
    """Write the cache the agent started as `ds4agent ARGV` in `cwd` looks up; returns its tokens."""
    from ds4agent.agent import sessionops
    from ds4agent.agent.conversation import Conversation
    from ds4agent.agent.skills import load_skills
    from ds4agent.agent.subagent import TaskTool
    from ds4agent.cli import parse
    from ds4agent.engine.config import flash_config
    from ds4agent.protocol.tokenizer import Tokenizer
    from ds4agent.sessions.payload import LayerPayload, PayloadShape, PayloadState
    from ds4agent.sessions.store import SessionStore
    from ds4agent.tools import default_tools

    old = os.getcwd()
    os.chdir(cwd)
    try:
        settings = parse(argv).settings
    finally:
        os.chdir(old)
    # The tools block the worker renders (Worker.tools): the built-in tools, the skills' tool
    # when the project or the user has skills, and the subagents' `task` tool when they are on.
    worker = SimpleNamespace(settings=settings, tok=Tokenizer.load(), io=SimpleNamespace(emit=lambda e: None),
                             conv=Conversation(settings.effective_think_mode()))
    skills = load_skills(settings.cwd, settings.user_config_dir())
    task = [TaskTool(worker, None)] if settings.subagents else []  # type: ignore[arg-type]
    worker.tools = default_tools(settings.edit_upto) + list(skills.tools()) + task
    ids = sessionops.render_system(worker)
    c = flash_config()
    T = len(ids)
    rng = np.random.default_rng(0)

    def rows(n: int, d: int) -> np.ndarray:
        return (0.1 * rng.standard_normal((n, d))).astype(np.float32)

    layers = []
    for li in range(c.n_layers):
        r, coff = c.ratios[li], c.coff(li)
        lay = LayerPayload(raw=rows(min(T, c.window), c.head_dim))
        if r:
            lay.comp = rows(T // r, c.head_dim)
            lay.attn_kv = np.zeros((coff * r, coff * c.head_dim), np.float32)
            lay.attn_score = np.full((coff * r, coff * c.head_dim), -1e30, np.float32)
        if r == 4:
            lay.index_comp = rows(T // 4, c.indexer_dim)
            lay.index_kv = np.zeros((8, 2 * c.indexer_dim), np.float32)
            lay.index_score = np.full((8, 2 * c.indexer_dim), -1e30, np.float32)
        layers.append(lay)
    payload = PayloadState(ctx=settings.ctx, tokens=np.asarray(ids, dtype=np.uint32),
                           logits=np.zeros(c.vocab, np.float32), layers=layers)
    shape = PayloadShape(n_layers=c.n_layers, head_dim=c.head_dim, indexer_dim=c.indexer_dim,
                         vocab=c.vocab, window=c.window, ratios=tuple(c.ratios))
    SessionStore(kv_dir).save_sysprompt(worker.tok.decode_bytes(ids), payload, shape=shape, quant_bits=2)
    return T
