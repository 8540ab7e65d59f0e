"""The agent's help with `edit` while the model writes the call (tools/files.py: select_old).

Two things, both decided on the round's DSML events as they stream:

* Forced [upto]. Copying a long `old` costs a token per few characters and invites copy slips.
  Once the streamed start of `old` is long enough, spans two lines with text, ends at a line end
  and is already found once in the file (files.upto_ready), the agent writes `[upto]` and a
  newline as the model's next tokens: the model then only adds the last line(s) of the span (TAIL),
  or closes old right away when it was complete. The ids are appended by the agent, not sampled
  (decode.TokenStream.force), and go into the transcript exactly like sampled ones.
* Preflight. When `old` closes, the agent checks that it selects a span (files.check_old). If not,
  generation stops there, before `new` is written (a wasted `new` can be long), and the model
  gets the edit's own error (why, with the closest candidates) as the one result of the round.

Both act only on a file the model has read (the guard would refuse anything else) and only when
`path` came before `old`, as the schema orders them.
"""

from __future__ import annotations

from collections.abc import Callable

from ds4agent.protocol import dsml
from ds4agent.tools import ToolContext, files, oldtext

EDIT_TOOL = "edit"


class EditAssist:
    tool = EDIT_TOOL

    __slots__ = ("_ctx", "_upto_ids", "_invoke", "_index", "_path", "_param", "_old", "_ready",
                 "_forced", "completed", "failure")

    def __init__(self, ctx: ToolContext, encode: Callable[[str], list[int]]) -> None:
        self._ctx = ctx
        self._upto_ids = tuple(encode(oldtext.UPTO + "\n"))
        self._invoke: str | None = None
        self._index = -1
        self._path: str | None = None
        self._param: str | None = None
        self._old: list[str] = []
        self._ready: Callable[[str], bool] | None = None
        self._forced = False
        self.completed = 0  # invokes of the block closed so far
        self.failure: tuple[int, str] | None = None  # (invoke index, result text) of a failed preflight

    def observe(self, events: list[dsml.Event]) -> None:
        for e in events:
            if isinstance(e, dsml.InvokeStart):
                self._invoke, self._index = e.name, e.index
                self._path, self._ready, self._forced = None, None, False
            elif isinstance(e, dsml.ParamStart):
                self._param = e.name
                self._old = []
            elif isinstance(e, dsml.ParamDelta):
                if self._param == "old":
                    self._old.append(e.text)
            elif isinstance(e, dsml.ParamEnd):
                self._param = None
                if self._invoke != EDIT_TOOL:
                    continue
                value = e.param.value
                if e.param.name == "path" and isinstance(value, str):
                    self._path = value
                elif e.param.name == "old" and self._path is not None and isinstance(value, str):
                    text = files.check_old(self._ctx, self._path, value)
                    if text is not None:
                        self.failure = (self._index, text)
            elif isinstance(e, dsml.InvokeEnd):
                self._invoke = None
                self.completed += 1

    def force_now(self, in_string_body: bool) -> tuple[int, ...]:
        """The ids to write next ([upto] + newline), or () to let the model go on. in_string_body:
        the parser is inside the value with no close tag starting (writing there then cannot
        break the tag)."""
        if (not in_string_body or self._forced or self._invoke != EDIT_TOOL or self._param != "old"
                or self._path is None):
            return ()
        prefix = "".join(self._old)
        if not prefix.endswith("\n") or len(prefix) < oldtext.UPTO_MIN_BYTES // 4:
            return ()  # cheap refusals before the file is read
        if self._ready is None:
            self._ready = files.upto_ready_at(self._ctx, self._path) or (lambda _p: False)
        if not self._ready(prefix):
            return ()
        self._forced = True
        return self._upto_ids
