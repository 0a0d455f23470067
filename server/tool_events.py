"""What the streaming tool-call parser (`tool_stream.py`) reports, and those events in each
protocol's streaming shape."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ember.server.tools import ToolCall, anthropic_tool_use_id


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int  # 0, 1, ... in the order calls appear in this reply
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    index: int
    fragment: str  # the fragments of one call concatenate to its arguments JSON text


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    call: ToolCall  # the whole call (Ollama streams calls whole)


ToolEvent = ContentDelta | ToolCallStart | ToolCallArgs | ToolCallEnd


# ---- events in each protocol's streaming shape --------------------------------------------------


def openai_deltas(events: Iterable[ToolEvent]) -> list[dict[str, Any]]:
    """Chat-completion chunk `delta`s for these events, in order: {"content": ...} or
    {"tool_calls": [one entry]}. A call's first entry carries index, id, type, function.name and
    function.arguments (possibly ""); later entries carry index and function.arguments only."""
    deltas: list[dict[str, Any]] = []
    for event in events:
        last = deltas[-1] if deltas else None
        if isinstance(event, ContentDelta):
            if last is not None and "content" in last:
                last["content"] += event.text
            else:
                deltas.append({"content": event.text})
        elif isinstance(event, ToolCallStart):
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": event.index,
                            "id": event.id,
                            "type": "function",
                            "function": {"name": event.name, "arguments": ""},
                        }
                    ]
                }
            )
        elif isinstance(event, ToolCallArgs):
            if last is not None and "tool_calls" in last and last["tool_calls"][0]["index"] == event.index:
                last["tool_calls"][0]["function"]["arguments"] += event.fragment
            else:
                deltas.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]})
    return deltas


def anthropic_tool_use_start(event: ToolCallStart) -> dict[str, Any]:
    """`content_block` of a `content_block_start` event for this call (input arrives as deltas)."""
    return {"type": "tool_use", "id": anthropic_tool_use_id(event.id), "name": event.name, "input": {}}


def anthropic_input_json_delta(event: ToolCallArgs) -> dict[str, Any]:
    """`delta` of a `content_block_delta` event carrying an arguments fragment."""
    return {"type": "input_json_delta", "partial_json": event.fragment}
