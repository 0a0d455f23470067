"""Streaming tool-call parsing: the rules of `tool_parse.py`, applied to text deltas split anywhere, giving
the same result as the whole-reply parser.

Streaming holds back text that may be the start of `<tool_call>` or of a fence (like a stop string),
the whitespace before it, and a fence's line until its info string shows whether it may be a call.
A fence that may be a call is held back while it still may be one: it is released as content as
soon as it cannot, that is when its info string names another language, when its body starts with
something else than `{` or `[`, or when the JSON value in it has ended and is not a call or is
followed by more than blanks; what follows streams at once (only blanks, which a call may follow,
and the start of a possible fence wait). Nothing held back is ever emitted and then taken back.
By default a block that may be a call is buffered until it closes and is then checked.
With `incremental=True` a call is announced as soon as its name (a declared tool) and the opening
`{` of its arguments have arrived, in the template's key order, and the arguments stream as they are
written (other bodies — every fenced block among them, since no grammar covers fences — are buffered
and decided at the close); the call can
then no longer be taken back, so use it when a grammar (`tool_grammar.py`) guarantees valid calls. A
call cut off by max_tokens is then still reported, with whatever arguments text was generated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ember.server.text_holdback import partial_tag_length
from ember.server.tool_events import (
    ContentDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    ToolEvent,
    anthropic_input_json_delta,
    anthropic_tool_use_start,
    openai_deltas,
)
from ember.server.tool_fences import (
    CANONICAL_PREFIX,
    FENCE,
    NEXT_CALL_OBJECT,
    JsonEndScanner,
    find_fence,
    is_call_language,
    line_blank_after,
    may_be_call_language,
    parse_call_body,
    parse_fence_body,
    partial_fence_length,
)
from ember.server.tool_parse import CLOSE_TAG, OPEN_TAG
from ember.server.tools import ToolCall, ToolSpec, new_tool_call_id

__all__ = [
    "ContentDelta",
    "StreamingToolParser",
    "ToolCallArgs",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolEvent",
    "anthropic_input_json_delta",
    "anthropic_tool_use_start",
    "openai_deltas",
]

# ---- streaming ---------------------------------------------------------------------------------


_TEXT, _TAG, _FENCE, _VERBATIM = "text", "tag", "fence", "verbatim"  # what the parser is reading


class StreamingToolParser:
    """Feed the text deltas of one choice; get content and tool-call events back."""

    def __init__(
        self, tools: Sequence[ToolSpec], *, incremental: bool = False, id_factory: Callable[[], str] = new_tool_call_id
    ):
        self._tools = {spec.name: spec for spec in tools}
        self._incremental = incremental
        self._new_id = id_factory
        # _TEXT; _TAG: in a <tool_call> block; _FENCE: in a fenced block that may be a call;
        # _VERBATIM: in a rejected fenced block, which is content up to its closing fence
        self._mode = _TEXT
        self._pending = ""  # text not yet emitted: trailing whitespace + what may start a tag or fence
        self._line_blank = True  # whether the line before _pending holds only blanks so far
        self._in_code = False  # inside an ordinary code block: the next fence closes it
        self._after_call = False  # drop whitespace until the next non-space text
        self._calls: list[ToolCall] = []
        self._reset_block()
        # incremental mode: the call being streamed
        self._open: ToolCallStart | None = None
        self._args_start = 0
        self._args_sent = 0  # characters of arguments already emitted, from _args_start
        self._scanner = JsonEndScanner()

    def _reset_block(self) -> None:
        """Forget the block (a tag block, or a fenced block that may be a call) just read."""
        self._opener = ""  # <tool_call>, or the fence's line ("```json\n")
        self._body = ""  # the block's text after the opener
        self._close_from = 0  # where to look for the end in _body (earlier text has none)
        self._held_space = ""  # whitespace before the block: dropped if the block is a call
        self._value_start: int | None = None  # fence: where its JSON value starts in _body
        self._value = JsonEndScanner()  # fence: where that value ends
        self._value_scanned = 0
        self._value_is_call = False
        self._object_start = 0  # incremental mode: where the call object being read starts in _body

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The calls completed so far."""
        return tuple(self._calls)

    def has_tool_calls(self) -> bool:
        """Whether any call was emitted (or started): then finish_reason is "tool_calls"."""
        return bool(self._calls) or self._open is not None

    def feed(self, delta: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._mode in (_TAG, _FENCE):
            self._body += delta
        else:
            self._pending += delta
        steps = {_TEXT: self._scan_text, _TAG: self._scan_tag, _FENCE: self._scan_fence, _VERBATIM: self._scan_verbatim}
        while steps[self._mode](events):  # each step says whether it moved on to another mode
            pass
        return events

    def finish(self, *, cut: bool = False) -> list[ToolEvent]:
        """Flush what is held back at the end of generation. `cut`: max_tokens stopped it, so an open
        `<tool_call>` block that is not a whole call is dropped (one already announced in incremental
        mode cannot be taken back: it ends with the arguments written so far)."""
        events: list[ToolEvent] = []
        if self._mode == _TAG or (self._mode == _FENCE and self._value_start is not None):
            self._end_block(events, closed=False, drop_text=cut and self._mode == _TAG)
        elif self._mode == _FENCE:  # nothing but blanks after the fence's line: an ordinary code block
            self._pending = self._held_space + self._opener + self._body
            self._reset_block()
        if self._after_call:
            self._pending = self._pending.lstrip()
        self._emit(events, self._pending)
        self._mode, self._pending = _TEXT, ""
        return events

    def _to_text(self, rest: str, *, line_blank: bool) -> bool:
        self._mode, self._pending, self._line_blank = _TEXT, rest, line_blank
        return True

    @staticmethod
    def _emit(events: list[ToolEvent], text: str) -> None:
        if text:
            events.append(ContentDelta(text))

    def _emit_pending(self, events: list[ToolEvent], length: int) -> None:
        """Emit the first `length` characters of _pending."""
        head, self._pending = self._pending[:length], self._pending[length:]
        self._emit(events, head)
        self._line_blank = line_blank_after(self._line_blank, head)

    # ---- outside blocks ----

    def _scan_text(self, events: list[ToolEvent]) -> bool:
        """Emit what is certainly content; returns True when the mode changed (keep scanning)."""
        text = self._pending
        if self._after_call:
            stripped = text.lstrip()
            self._line_blank = line_blank_after(self._line_blank, text[: len(text) - len(stripped)])
            self._pending = text = stripped
            if not text:
                return False
            self._after_call = False
        tag = text.find(OPEN_TAG)
        fence = find_fence(text, 0, self._line_blank)
        if tag >= 0 and (fence < 0 or tag < fence):
            return self._open_block(events, _TAG, tag, OPEN_TAG)
        if fence >= 0 and not self._in_code:
            newline = text.find("\n", fence + len(FENCE))
            info = text[fence + len(FENCE) : newline if newline >= 0 else len(text)]
            if newline >= 0 and is_call_language(info):
                return self._open_block(events, _FENCE, fence, text[fence : newline + 1])
            if newline < 0 and may_be_call_language(info):  # wait for the rest of the fence's line
                self._emit_pending(events, len(text[:fence].rstrip()))
                return False
        if fence >= 0:  # an ordinary code block opens or closes: the fence is content
            self._emit(events, text[: fence + len(FENCE)])
            self._in_code = not self._in_code
            return self._to_text(text[fence + len(FENCE) :], line_blank=False)
        hold = max(partial_tag_length(text, OPEN_TAG), partial_fence_length(text, self._line_blank))
        self._emit_pending(events, len(text[: len(text) - hold].rstrip()))  # whitespace is held: a call may follow
        return False

    def _open_block(self, events: list[ToolEvent], mode: str, at: int, opener: str) -> bool:
        before = self._pending[:at]
        kept = before.rstrip()
        self._emit(events, kept)
        self._held_space = before[len(kept) :]
        self._mode, self._opener, self._body = mode, opener, self._pending[at + len(opener) :]
        self._pending = ""
        return True

    def _scan_verbatim(self, events: list[ToolEvent]) -> bool:
        """A rejected fenced block: content up to and including its closing fence."""
        close = find_fence(self._pending, 0, self._line_blank)
        if close >= 0:
            self._emit(events, self._pending[: close + len(FENCE)])
            return self._to_text(self._pending[close + len(FENCE) :], line_blank=False)
        self._emit_pending(events, len(self._pending) - partial_fence_length(self._pending, self._line_blank))
        return False

    # ---- inside a block ----

    def _scan_tag(self, events: list[ToolEvent]) -> bool:
        body = self._body
        close = body.find(CLOSE_TAG, self._close_from)
        if close < 0:
            self._close_from = max(0, len(body) - len(CLOSE_TAG) + 1)
            if self._incremental:
                self._stream_arguments(events, len(body) - partial_tag_length(body, CLOSE_TAG))
            return False
        self._body = body[:close]
        self._end_block(events, closed=True)
        return self._to_text(body[close + len(CLOSE_TAG) :], line_blank=False)

    def _scan_fence(self, events: list[ToolEvent]) -> bool:
        body = self._body
        if self._value_start is None:
            first = len(body) - len(body.lstrip())
            if first == len(body):
                return False
            if body[first] not in "{[":  # an ordinary code block: its fence is content, the rest is text
                self._emit(events, self._held_space + FENCE)
                rest = self._opener[len(FENCE) :] + body
                self._reset_block()
                self._in_code = True
                return self._to_text(rest, line_blank=False)
            self._value_start = self._value_scanned = first
        close = find_fence(body, self._close_from, True)
        if close >= 0:
            self._body = body[:close]
            self._end_block(events, closed=True)
            return self._to_text(body[close + len(FENCE) :], line_blank=False)
        self._close_from = body.rfind("\n") + 1
        limit = len(body) - partial_fence_length(body, True)
        if self._open is None and not self._may_be_call(limit):  # content up to the closing fence
            self._emit(events, self._held_space + self._opener)
            self._reset_block()
            self._mode, self._pending, self._line_blank = _VERBATIM, body, True
            return True
        return False

    def _may_be_call(self, limit: int) -> bool:
        """Whether the fenced body so far may still be a call: False once its JSON value has ended
        and is not a call or is followed by more than blanks."""
        body, value = self._body, self._value
        if value.end is None:
            value.scan(body, self._value_scanned, len(body))
            self._value_scanned = len(body)
            if value.end is None:
                return True
            self._value_is_call = parse_fence_body(body[self._value_start : value.end], self._tools) is not None
        return self._value_is_call and not body[value.end : limit].strip()

    def _stream_arguments(self, events: list[ToolEvent], limit: int) -> None:
        """Incremental mode: announce each call of the block once its name is known, then send its
        arguments up to `limit`; a call ends where the next call object of the same block begins."""
        body = self._body
        while True:
            if self._open is None:
                match = CANONICAL_PREFIX.match(body, self._object_start)
                if not match or match.end() >= limit or body[match.end()] != "{" or match.group(1) not in self._tools:
                    return  # not (yet) recognisable as a call: keep buffering, decide at the close
                self._held_space = ""
                self._open = ToolCallStart(len(self._calls), self._new_id(), match.group(1))
                self._args_start = match.end()
                events.append(self._open)
            scanned = self._args_start + self._args_sent
            if self._scanner.end is None:
                self._scanner.scan(body, scanned, limit)
            stop = min(limit, self._scanner.end) if self._scanner.end is not None else limit
            if stop > scanned:
                events.append(ToolCallArgs(self._open.index, body[scanned:stop]))
                self._args_sent = stop - self._args_start
            following = None if self._scanner.end is None else NEXT_CALL_OBJECT.match(body, self._scanner.end)
            if following is None or following.end() >= limit:
                return
            self._finish_open_call(events)
            self._object_start = following.end()

    def _end_block(self, events: list[ToolEvent], *, closed: bool, drop_text: bool = False) -> None:
        body, is_tag = self._body, self._mode == _TAG
        if self._incremental and is_tag:  # fences are outside the tool grammar: always checked whole
            self._stream_arguments(events, len(body))
        if self._open is not None:
            self._finish_open_call(events)
        elif self._object_start:  # calls of this block were announced; text after them that is no call is dropped
            pass
        elif calls := self._parse_block(body, is_tag):
            for name, arguments in calls:
                call = ToolCall(self._new_id(), name, arguments)
                events.append(ToolCallStart(len(self._calls), call.id, call.name))
                if call.arguments:
                    events.append(ToolCallArgs(len(self._calls), call.arguments))
                self._finish_call(events, call)
        elif not drop_text:
            closer = (CLOSE_TAG if is_tag else FENCE) if closed else ""
            self._emit(events, self._held_space + self._opener + body + closer)
        self._reset_block()

    def _parse_block(self, body: str, is_tag: bool) -> list[tuple[str, str]] | None:
        return (parse_call_body if is_tag else parse_fence_body)(body, self._tools)

    def _finish_open_call(self, events: list[ToolEvent]) -> None:
        start = self._open
        self._finish_call(
            events, ToolCall(start.id, start.name, self._body[self._args_start : self._args_start + self._args_sent])
        )

    def _finish_call(self, events: list[ToolEvent], call: ToolCall) -> None:
        events.append(ToolCallEnd(len(self._calls), call))
        self._calls.append(call)
        self._after_call = True
        self._open, self._args_start, self._args_sent = None, 0, 0
        self._scanner = JsonEndScanner()
