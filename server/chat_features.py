"""The parts of a chat request beyond messages and sampling: tools and tool_choice, response_format,
and reasoning — and the grammar they imply.

- `tool_choice` "required" or a named function: a grammar forces well-formed `<tool_call>` blocks whose
  arguments match the tool's schema; "auto" (tools given): free text, but a `<tool_call>` the model starts
  must be completed validly; "none": tools are not rendered and nothing is parsed as a call.
- `response_format` json_object / json_schema: a JSON grammar. Combined with a forced tool call it is a
  400 (the two grammars contradict); with "auto" tools, the JSON format wins and calls are not parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.sampling.guided import GuidedDecoding
from .errors import bad_request
from .reasoning import ReasoningParser, prompt_closes_reasoning
from .structured import StructuredOutputError, guided_from_response_format
from .tool_format import JSON_TOOL_CALLS, ToolCallFormat
from .tool_messages import messages_for_template
from .tools import ToolChoice, ToolSpec, parse_openai_tool_choice, parse_openai_tools


@dataclass
class ChatFeatures:
    messages: list[dict]  # ready for the chat template
    tools: tuple[ToolSpec, ...] = ()  # tools the output is parsed for
    choice: ToolChoice | None = None
    response_format: GuidedDecoding | None = None
    reasoning: ReasoningParser | None = None  # set per prompt by `for_prompt`
    template_tools: list[dict] | None = None
    tool_format: ToolCallFormat = JSON_TOOL_CALLS  # how the model writes calls (its template's form)

    def for_prompt(self, service, prompt_text: str) -> tuple[GuidedDecoding | None, ReasoningParser | None]:
        """The grammar and the reasoning parser, once the rendered prompt is known (a template may open
        the reasoning block itself)."""
        reasoning = self.reasoning.for_prompt(prompt_text) if self.reasoning is not None else None
        if self.response_format is not None or not self.tools or self.choice is None:
            return self.response_format, reasoning
        grammar = self.tool_format.grammar(
            self.tools,
            self.choice,
            tokenizer=service.grammar_tokenizer(),
            # thinking switched off in the template (it closed an empty block): no block to allow
            reasoning=reasoning is not None and not prompt_closes_reasoning(prompt_text, reasoning.end_tag),
            starts_in_reasoning=bool(reasoning and reasoning.starts_in_reasoning),
        )
        return (GuidedDecoding.lark(grammar) if grammar else None), reasoning

    @property
    def incremental_tool_stream(self) -> bool:
        """Tool calls stream argument by argument when a grammar guarantees they complete validly."""
        return self.response_format is None and bool(self.tools)


def chat_features(service, body: dict, messages: list[dict]) -> ChatFeatures:
    tools = parse_openai_tools(body.get("tools"))
    choice = parse_openai_tool_choice(
        body.get("tool_choice"), tools, parallel_tool_calls=body.get("parallel_tool_calls")
    )
    try:
        response_format = guided_from_response_format(body.get("response_format"))
    except StructuredOutputError as error:
        raise bad_request(error.detail, error.param) from error
    if response_format is not None and choice.forces_call:
        raise bad_request("response_format cannot be combined with a tool_choice that forces a call", "tool_choice")
    active = () if choice.mode == "none" or response_format is not None else tools
    template_tools = [t.to_openai() for t in tools] if tools and choice.mode != "none" else None
    return ChatFeatures(
        messages_for_template(messages),
        active,
        choice if active else None,
        response_format,
        ReasoningParser.for_tokenizer(service.tokenizer),
        template_tools,
        service.tool_format,
    )
