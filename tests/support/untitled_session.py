"""A session file as builds before the title trailer wrote it (kvc-format.md §12.5): no title,
named SHA-1 of its text, for the tests of how such a file loads and is saved again."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4agent.protocol.tokenizer import Tokenizer
from ds4agent.sessions.kvc import REASON_SESSION, KVCHeader, text_sha1, write_kvc
from tests.support.agent_harness import AgentHarness
from tests.support.scripted_engine import reply

CREATED_AT = 1_700_000_000


def untitled_session(tmp_path: Path, tools: list, monkeypatch: pytest.MonkeyPatch,
                     question: str) -> tuple[AgentHarness, Path]:
    """An agent that ran one turn (`question`, answered "A1"; "A2" answers the next) and that
    session written, untitled, into its KV directory (created and last used at CREATED_AT). The
    agent holds nothing unsaved, so loading the file asks no question."""
    # Untitled files come from builds that gave no date line: this session's first turn has none.
    monkeypatch.setattr("ds4agent.protocol.template.session_date_line", lambda now: "")
    h = AgentHarness.build(tmp_path, [reply("A1", think="t"), reply("A2", think="t")], tools=tools)
    h.turn(question)
    eng, payload = h.worker.engine, h.worker.session.export_state()
    text = Tokenizer.load().decode_bytes(h.ids)
    path = tmp_path / "kv" / f"{text_sha1(text)}.kv"
    write_kvc(path, KVCHeader(quant_bits=eng.quant_bits, reason=REASON_SESSION, ext_flags=0, model_id=0,
                              tokens=len(h.ids), hits=0, ctx_size=eng.ctx, created_at=CREATED_AT,
                              last_used=CREATED_AT, payload_bytes=0),
              text, payload, eng.payload_shape())
    h.worker.conv.identity.dirty = False
    return h, path
