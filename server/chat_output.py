"""What a chat choice's text becomes: content, reasoning and tool calls — whole (non-streaming) or as
OpenAI-shaped chat deltas (streaming). Reasoning is split off first (`<think>` blocks, for models whose
vocabulary has them), then the content goes through the tool-call parser (Qwen's `<tool_call>` blocks,
arguments validated against the tool's schema), in the form the model writes them (`tool_format.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .reasoning import ReasoningParser
from .tool_events import openai_deltas
from .tool_format import JSON_TOOL_CALLS, ToolCallFormat
from .tools import ToolSpec, openai_tool_calls


@dataclass
class ParsedOutput:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI message.tool_calls entries


def _reasoning_delta(text: str) -> dict:
    return {"reasoning_content": text, "reasoning": text}


class ChatOutputParser:
    """One choice's streaming parser: feed text deltas, get OpenAI chat `delta` dicts."""

    def __init__(
        self,
        *,
        tools: Sequence[ToolSpec],
        reasoning: ReasoningParser | None,
        incremental: bool,
        tool_format: ToolCallFormat = JSON_TOOL_CALLS,
    ):
        self._reasoning = reasoning.stream() if reasoning is not None else None
        self._tools = tool_format.stream(tools, incremental=incremental) if tools else None

    @property
    def has_tool_calls(self) -> bool:
        return self._tools is not None and self._tools.has_tool_calls()

    def feed(self, text: str) -> list[dict]:
        return self._deltas(text, final=False)

    def finish(self, finish_reason: str | None = None) -> list[dict]:
        return self._deltas("", final=True, cut=finish_reason == "length")

    def _deltas(self, text: str, *, final: bool, cut: bool = False) -> list[dict]:
        if self._reasoning is None:
            return self._content(text, final=final, cut=cut)
        split = self._reasoning.finish() if final else self._reasoning.feed(text)
        return ([_reasoning_delta(split.reasoning)] if split.reasoning else []) + self._content(
            split.content, final=final, cut=cut
        )

    def _content(self, text: str, *, final: bool, cut: bool = False) -> list[dict]:
        if self._tools is None:
            return [{"content": text}] if text else []
        events = self._tools.feed(text) if text else []
        if final:
            events += self._tools.finish(cut=cut)
        return openai_deltas(events)


def chat_finish_reason(finish_reason: str | None, has_tool_calls: bool) -> str | None:
    """OpenAI's finish_reason for a choice: "length" whenever max_tokens cut the output (a call in it may
    be unfinished), "tool_calls" when the model ended its turn after calls, else the engine's reason."""
    if finish_reason == "length" or not has_tool_calls:
        return finish_reason
    return "tool_calls"


def parse_chat_output(
    text: str,
    *,
    tools: Sequence[ToolSpec],
    reasoning: ReasoningParser | None,
    finish_reason: str | None = None,
    tool_format: ToolCallFormat = JSON_TOOL_CALLS,
) -> ParsedOutput:
    """The whole text of a choice; `finish_reason` "length" drops a tool call left half-written."""
    reasoning_text = None
    if reasoning is not None:
        split = reasoning.split(text)
        reasoning_text, text = split.reasoning or None, split.content
    if not tools:
        return ParsedOutput(text, reasoning_text)
    reply = tool_format.parse(text, tools, cut=finish_reason == "length")
    calls = openai_tool_calls(reply.calls)
    return ParsedOutput(reply.content if reply.content or not calls else None, reasoning_text, calls)
