"""How a model writes tool calls, decided from its chat template: the one place that knows there are
two forms. Everything else (the chat output parser, the grammar of a request) asks the served model's
`ToolCallFormat` to parse a reply, stream one, or write the grammar that forces calls.

- JSON (Qwen2.5 / Qwen3 / Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  (`tool_parse.py`, `tool_stream.py`, `tool_grammar.json_call_rules`).
- XML (Qwen3-Coder / Qwen3.5): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>` (`tool_xml.py`, `tool_xml_stream.py`, `tool_xml_grammar.py`).

A template that shows the model `<tool_call>`, `<function=` and `<parameter=` (in its instructions or
in how it renders past calls) uses the XML form; every other template the JSON form (templates whose
calls use another outer tag, such as Seed-OSS's `<seed:tool_call>`, are not read as XML).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ember.server.tool_events import ToolEvent
from ember.server.tool_grammar import CallRules, json_call_rules, tool_call_grammar
from ember.server.tool_parse import ParsedReply, parse_tool_calls
from ember.server.tool_stream import StreamingToolParser
from ember.server.tool_xml import parse_xml_tool_calls
from ember.server.tool_xml_grammar import xml_call_rules
from ember.server.tool_xml_stream import StreamingXmlToolParser
from ember.server.tools import ToolCall, ToolChoice, ToolSpec, new_tool_call_id


class ToolStreamParser(Protocol):
    """One choice's streaming tool-call parser (either form)."""

    @property
    def calls(self) -> tuple[ToolCall, ...]: ...

    def has_tool_calls(self) -> bool: ...

    def feed(self, delta: str) -> list[ToolEvent]: ...

    def finish(self, *, cut: bool = False) -> list[ToolEvent]: ...


@dataclass(frozen=True)
class ToolCallFormat:
    name: str  # "json" or "xml"
    _parse: Callable[..., ParsedReply]
    _stream: Callable[..., ToolStreamParser]
    _call_rules: CallRules

    def parse(
        self,
        text: str,
        tools: Sequence[ToolSpec],
        *,
        cut: bool = False,
        id_factory: Callable[[], str] = new_tool_call_id,
    ) -> ParsedReply:
        """Content and calls of a whole reply; `cut`: max_tokens stopped it (a half-written call is dropped)."""
        return self._parse(text, tools, cut=cut, id_factory=id_factory)

    def stream(
        self,
        tools: Sequence[ToolSpec],
        *,
        incremental: bool = False,
        id_factory: Callable[[], str] = new_tool_call_id,
    ) -> ToolStreamParser:
        """A streaming parser for one choice; `incremental`: arguments stream as written (a grammar holds)."""
        return self._stream(tools, incremental=incremental, id_factory=id_factory)

    def grammar(
        self,
        tools: Sequence[ToolSpec],
        choice: ToolChoice,
        *,
        tokenizer=None,
        reasoning: bool = False,
        starts_in_reasoning: bool = False,
    ) -> str | None:
        """The Lark grammar enforcing `choice` in this form, or None (see `tool_grammar.tool_call_grammar`)."""
        return tool_call_grammar(
            tools,
            choice,
            tokenizer=tokenizer,
            reasoning=reasoning,
            starts_in_reasoning=starts_in_reasoning,
            call_rules=self._call_rules,
        )


JSON_TOOL_CALLS = ToolCallFormat("json", parse_tool_calls, StreamingToolParser, json_call_rules)
XML_TOOL_CALLS = ToolCallFormat("xml", parse_xml_tool_calls, StreamingXmlToolParser, xml_call_rules)


def tool_call_format_for_template(source: str | None) -> ToolCallFormat:
    """The form a chat template (its Jinja source; None without one) shows the model."""
    if source is not None and all(mark in source for mark in ("<tool_call>", "<function=", "<parameter=")):
        return XML_TOOL_CALLS
    return JSON_TOOL_CALLS
