"""Anthropic Messages output: a finished choice as one `message` object, and the chat output
parser's OpenAI-shaped deltas as Anthropic's streaming events.

Streaming sequence (what the official SDKs assemble):

    message_start                      message with empty content, usage.input_tokens
    content_block_start  index=0       {"type": "thinking" | "text" | "tool_use", ...}
    content_block_delta  index=0       thinking_delta | text_delta | input_json_delta
    content_block_stop   index=0
    ... one block at a time, indexes increasing ...
    message_delta                      stop_reason, stop_sequence; usage (cumulative totals)
    message_stop

A block is opened by the first delta of its kind and closed when a delta of another kind (or
another tool call) arrives, so text is always closed before a tool_use block starts.
"""

from __future__ import annotations

import json
from typing import Any

from ..runtime.engine.streams import Usage
from .tools import anthropic_tool_use_id, new_tool_call_id


def stop_fields(
    finish_reason: str | None, stop_reason: str | int | None, has_tool_calls: bool
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of an Anthropic message from the engine's finish.

    Running out of max_tokens wins over tool calls: a call cut short is not a finished turn. A stop
    token id (EOS, or a stop_token_ids extension) is a natural end; only a matched stop string is a
    stop_sequence."""
    if finish_reason == "length":
        return "max_tokens", None
    if has_tool_calls:
        return "tool_use", None
    if finish_reason == "stop" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return "end_turn", None


def usage_body(usage: Usage | None, prompt_tokens: int = 0) -> dict[str, int]:
    """Anthropic counts cache reads apart from input_tokens (total input = the two summed)."""
    if usage is None:
        return {
            "input_tokens": prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
    cached = usage.cached_tokens or 0
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped parsed call (`arguments` as JSON text) as a `tool_use` content block."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        tool_input = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:  # a call cut off mid-arguments: say what was written rather than lose it
        tool_input = {"_raw_arguments": arguments}
    if not isinstance(tool_input, dict):
        tool_input = {"_raw_arguments": arguments}
    return {
        "type": "tool_use",
        "id": anthropic_tool_use_id(call.get("id") or new_tool_call_id()),
        "name": function.get("name", ""),
        "input": tool_input,
    }


def content_blocks(parsed) -> list[dict[str, Any]]:
    """A ParsedOutput as message content: thinking, then text, then tool_use blocks (empty ones left out)."""
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content:
        blocks.append({"type": "text", "text": parsed.content})
    blocks.extend(tool_use_block(call) for call in parsed.tool_calls)
    return blocks


def message_body(
    message_id: str,
    model: str,
    *,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


class BlockWriter:
    """OpenAI chat deltas in, Anthropic `(event name, payload)` pairs out, one content block at a time."""

    def __init__(self) -> None:
        self.next_index = 0
        self.open_kind: str | None = None  # "text" | "thinking" | "tool_use"
        self.open_call: int | None = None  # the OpenAI tool_calls index of the open tool_use block
        self.has_tool_calls = False

    def feed(self, deltas: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        for delta in deltas:
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._ensure(events, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
                events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            if delta.get("content"):
                self._ensure(events, "text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                self._tool_call(events, call)
        return events

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        """Close the open block, if any (before message_delta)."""
        events: list[tuple[str, dict[str, Any]]] = []
        self._close(events)
        return events

    def _tool_call(self, events: list, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        function = call.get("function") or {}
        starts = call.get("id") is not None or self.open_kind != "tool_use" or self.open_call != index
        if starts:
            if call.get("id") is None and self.open_call is not None and index <= self.open_call:
                return  # a late fragment of a call whose block is closed: nothing can carry it now
            self._close(events)
            block = {
                "type": "tool_use",
                "id": anthropic_tool_use_id(call.get("id") or new_tool_call_id()),
                "name": function.get("name") or "",
                "input": {},
            }
            self._open(events, "tool_use", block)
            self.open_call = index
            self.has_tool_calls = True
        fragment = function.get("arguments")
        if fragment:
            events.append(self._delta({"type": "input_json_delta", "partial_json": fragment}))

    def _ensure(self, events: list, kind: str, block: dict[str, Any]) -> None:
        if self.open_kind != kind:
            self._close(events)
            self._open(events, kind, block)

    def _open(self, events: list, kind: str, block: dict[str, Any]) -> None:
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": self.next_index, "content_block": block})
        )
        self.open_kind = kind

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.next_index, "delta": delta}

    def _close(self, events: list) -> None:
        if self.open_kind is None:
            return
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self.next_index}))
        self.open_kind = None
        self.next_index += 1
