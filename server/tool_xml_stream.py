"""Streaming XML-form tool calls: the rules of `tool_xml.py` applied to text deltas split anywhere,
giving the same result as the whole-reply parser.

Text that may be the start of `<tool_call>`, and the whitespace before it, is held back; nothing held
back is emitted and then taken back. By default a block is buffered until it closes and is then
checked whole. With `incremental=True` (use it when a grammar, `tool_xml_grammar.py`, guarantees
valid calls) a call is announced as soon as `<function=NAME>` names a declared tool, and its JSON
arguments stream as the parameters are written: `{"city": ` once `<parameter=city>` is complete,
then a string parameter's text as it comes (escaped for JSON; the line break that may be the
template's layout before `</parameter>` waits), other values whole at their `</parameter>`, and `}`
at `</function>`, so the fragments concatenate to exactly the whole parser's arguments text. The
call then cannot be taken back: one cut off by max_tokens is reported with the text sent so far.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from ember.server.text_holdback import partial_tag_length
from ember.server.tool_events import ContentDelta, ToolCallArgs, ToolCallEnd, ToolCallStart, ToolEvent
from ember.server.tool_parse import CLOSE_TAG, OPEN_TAG
from ember.server.tool_xml import (
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    is_plain_string,
    parameter_schema,
    parameter_value,
    parse_function,
    trim_value,
)
from ember.server.tools import ToolCall, ToolSpec, new_tool_call_id

# Where the incremental reader is in the announced call's body.
_PARAMS, _VALUE, _DONE = "params", "value", "done"


def _json_text(text: str) -> str:
    """`text` escaped as the inside of a JSON string (escaping is per character, so pieces concatenate)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class StreamingXmlToolParser:
    """Feed the text deltas of one choice; get content and tool-call events back."""

    def __init__(
        self, tools: Sequence[ToolSpec], *, incremental: bool = False, id_factory: Callable[[], str] = new_tool_call_id
    ):
        self._tools = {spec.name: spec for spec in tools}
        self._incremental = incremental
        self._new_id = id_factory
        self._in_block = False
        self._pending = ""  # outside blocks: text not yet emitted (trailing blanks, a partial tag)
        self._after_call = False  # drop whitespace until the next non-space text
        self._calls: list[ToolCall] = []
        self._reset_block()

    def _reset_block(self) -> None:
        self._body = ""  # the block's text after <tool_call>
        self._close_from = 0  # where to look for </tool_call> in _body
        self._held_space = ""  # whitespace before the block: dropped if the block is a call
        # incremental mode: the call being announced and streamed
        self._open: ToolCallStart | None = None
        self._fragments: list[str] = []
        self._phase = _PARAMS
        self._cursor = 0  # in _body: where the next parameter or </function> is looked for
        self._value_start = 0  # the value's first character (after the layout line break, once known)
        self._value_lead_known = False
        self._value_sent = 0  # characters of a streamed string value already sent
        self._value_schema = None
        self._value_streams = False

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    def has_tool_calls(self) -> bool:
        return bool(self._calls) or self._open is not None

    def feed(self, delta: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._in_block:
            self._body += delta
        else:
            self._pending += delta
        while self._scan_block(events) if self._in_block else self._scan_text(events):
            pass
        return events

    def finish(self, *, cut: bool = False) -> list[ToolEvent]:
        """Flush at the end of generation; `cut`: max_tokens stopped it, so an unclosed block that is
        not a whole call is dropped (an announced call ends with the arguments sent so far)."""
        events: list[ToolEvent] = []
        if self._in_block:
            self._end_block(events, closed=False, drop_text=cut)
            self._in_block = False
        if self._after_call:
            self._pending = self._pending.lstrip()
        if self._pending:
            events.append(ContentDelta(self._pending))
        self._pending = ""
        return events

    # ---- outside blocks ----

    def _scan_text(self, events: list[ToolEvent]) -> bool:
        text = self._pending
        if self._after_call:
            text = self._pending = text.lstrip()
            if not text:
                return False
            self._after_call = False
        tag = text.find(OPEN_TAG)
        if tag >= 0:
            before = text[:tag]
            kept = before.rstrip()
            self._emit(events, kept)
            self._held_space = before[len(kept) :]
            self._in_block, self._body, self._pending = True, text[tag + len(OPEN_TAG) :], ""
            return True
        head = text[: len(text) - partial_tag_length(text, OPEN_TAG)].rstrip()  # blanks wait: a call may follow
        self._emit(events, head)
        self._pending = text[len(head) :]
        return False

    @staticmethod
    def _emit(events: list[ToolEvent], text: str) -> None:
        if text:
            events.append(ContentDelta(text))

    # ---- inside a block ----

    def _scan_block(self, events: list[ToolEvent]) -> bool:
        body = self._body
        close = body.find(CLOSE_TAG, self._close_from)
        if close < 0:
            self._close_from = max(0, len(body) - len(CLOSE_TAG) + 1)
            if self._incremental:
                self._stream_call(events, len(body) - partial_tag_length(body, CLOSE_TAG))
            return False
        self._body = body[:close]
        self._end_block(events, closed=True)
        self._in_block, self._pending = False, body[close + len(CLOSE_TAG) :]
        return True

    def _end_block(self, events: list[ToolEvent], *, closed: bool, drop_text: bool = False) -> None:
        body = self._body
        if self._incremental:
            self._stream_call(events, len(body))
        if self._open is not None:  # announced: it ends with what was sent
            self._finish_call(events, ToolCall(self._open.id, self._open.name, "".join(self._fragments)))
        elif self._phase == _DONE:  # the call of this block was streamed whole already
            pass
        elif (call := parse_function(body, self._tools)) is not None:
            made = ToolCall(self._new_id(), *call)
            events.append(ToolCallStart(len(self._calls), made.id, made.name))
            events.append(ToolCallArgs(len(self._calls), made.arguments))
            self._finish_call(events, made)
        elif not drop_text:
            self._emit(events, self._held_space + OPEN_TAG + body + (CLOSE_TAG if closed else ""))
        self._reset_block()

    def _finish_call(self, events: list[ToolEvent], call: ToolCall) -> None:
        events.append(ToolCallEnd(len(self._calls), call))
        self._calls.append(call)
        self._after_call = True
        self._open = None

    # ---- incremental: one call, announced by its name, arguments as they come ----

    def _send(self, events: list[ToolEvent], fragment: str) -> None:
        if fragment:
            self._fragments.append(fragment)
            events.append(ToolCallArgs(self._open.index, fragment))

    def _stream_call(self, events: list[ToolEvent], limit: int) -> None:
        """Read the block body up to `limit` (what cannot be part of `</tool_call>`) and stream."""
        body = self._body
        if self._open is None:
            if self._phase == _DONE:
                return
            match = FUNCTION_OPEN.match(body)
            if match is None or match.end() > limit or match.group(1) not in self._tools:
                return  # not (yet) recognisable as a call: keep buffering, decide at the close
            self._held_space = ""
            self._open = ToolCallStart(len(self._calls), self._new_id(), match.group(1))
            events.append(self._open)
            self._cursor = match.end()
        while self._open is not None:
            if self._phase == _VALUE:
                if not self._stream_value(events, limit):
                    return
                continue
            parameter = PARAMETER_OPEN.match(body, self._cursor)
            if parameter is not None and parameter.end() <= limit:
                name = parameter.group(1)
                self._send(events, ("{" if not self._fragments else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
                self._value_schema = parameter_schema(self._tools[self._open.name], name)
                self._value_streams = is_plain_string(self._value_schema)
                self._phase, self._value_start, self._value_lead_known, self._value_sent = (
                    _VALUE,
                    parameter.end(),
                    False,
                    0,
                )
                if self._value_streams:
                    self._send(events, '"')
                continue
            rest = body[self._cursor : limit].lstrip()
            if not rest.startswith(FUNCTION_CLOSE):
                return
            self._send(events, "}" if self._fragments else "{}")
            self._finish_call(events, ToolCall(self._open.id, self._open.name, "".join(self._fragments)))
            self._phase = _DONE

    def _stream_value(self, events: list[ToolEvent], limit: int) -> bool:
        """Send what is certain of the current value; True once it ended (at its `</parameter>`)."""
        body = self._body
        end = body.find(PARAMETER_CLOSE, self._value_start)
        if end >= 0 and end + len(PARAMETER_CLOSE) <= limit:
            raw = body[self._value_start : end]
            if self._value_streams:
                text = trim_value(raw) if not self._value_lead_known else (raw[:-1] if raw.endswith("\n") else raw)
                self._send(events, _json_text(text[self._value_sent :]) + '"')
            else:
                value = parameter_value(trim_value(raw), self._value_schema)
                self._send(events, json.dumps(value, ensure_ascii=False))
            self._phase, self._cursor = _PARAMS, end + len(PARAMETER_CLOSE)
            return True
        if not self._value_streams:
            return False
        if not self._value_lead_known:  # the layout line break after <parameter=P> is not value
            if self._value_start >= limit:
                return False
            self._value_start += body[self._value_start] == "\n"
            self._value_lead_known = True
        raw = body[self._value_start : limit]
        raw = raw[: len(raw) - partial_tag_length(raw, PARAMETER_CLOSE)]
        if raw.endswith("\n"):  # may be the layout line break before </parameter>
            raw = raw[:-1]
        if len(raw) > self._value_sent:
            self._send(events, _json_text(raw[self._value_sent :]))
            self._value_sent = len(raw)
        return False
