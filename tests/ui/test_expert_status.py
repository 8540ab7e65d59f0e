"""The Ready event's routed-expert backend line (Engine.expert_backend) in the ready note and the
status line."""

from __future__ import annotations

from ds4agent.agent import events as ev
from ds4agent.ui import fmt


def test_the_ready_line_and_the_status_line_carry_it():
    ready = ev.Ready("m", 4096, False, device="CPU", experts="mxfp4 via MLX gather_qmm")
    assert fmt.ready_line(ready.model, ready.ctx, ready.experts) == \
        "ready · m · context 4.1k tokens · experts: mxfp4 via MLX gather_qmm"
    s = fmt.StatusState(device=ready.device, experts=ready.experts)
    assert fmt.status_line(s).endswith("CPU · experts: mxfp4 via MLX gather_qmm")
    assert fmt.status_line(s, width=60).endswith("CPU")  # a narrow line keeps the device, drops the rest
