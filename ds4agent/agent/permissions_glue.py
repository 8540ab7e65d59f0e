"""The bridge between the tools' PermissionPolicy (pure policy) and the UI (questions as events).

The policy decides allow / deny / ask; on ask the worker publishes a PermissionRequest and waits
for `Agent.answer_permission(id, key)`: "y" allow once, "s" allow for this session (when the
policy offers a session scope), "n" deny (an optional message goes to the model). An interrupt
while waiting answers "n". Nothing times out into a "no" or a "yes".
"""

from __future__ import annotations

from collections.abc import Mapping

from ds4agent.agent import events as ev
from ds4agent.agent.port import WorkerPort
from ds4agent.tools.permissions import READ_ONLY_REFUSAL, Answer, denied_result


def permit(worker: WorkerPort, name: str, args: Mapping[str, object]) -> str | None:
    """None when the call may run; else the result text the model gets instead."""
    decision = worker.policy.check(name, args, worker.tool_ctx)
    if decision.kind == "allow":
        return None
    if decision.kind == "deny":
        return decision.result().text
    q = decision.question
    assert q is not None  # an "ask" decision always carries its question
    options: list[tuple[str, str]] = [("y", "allow once")]
    if q.session_label:
        options.append(("s", q.session_label))
    options.append(("n", "deny"))
    request = ev.PermissionRequest(
        id=worker.io.new_id("perm"),
        tool=name,
        question=q.title,
        detail=q.preview,
        options=tuple(options),
        preview_kind=q.preview_kind,
        diff=q.diff,
        outside_workspace=bool(q.outside_workspace),
    )
    key, message = worker.io.ask(request)
    if key == "y":
        answer = Answer.once()
    elif key == "s" and q.session_label:
        answer = Answer.session()
    else:
        answer = Answer.deny(message)
    worker.policy.remember(q, answer)
    if answer.allowed:
        return None
    return denied_result(answer).text


def refused_as_read_only(result: ev.ToolResult) -> bool:
    """Whether a tool result is the read-only mode's refusal (headless says why only then)."""
    return not result.ok and READ_ONLY_REFUSAL in result.text
