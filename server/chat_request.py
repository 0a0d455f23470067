"""A chat request as every chat-shaped protocol prepares it: messages (and tools) through the chat
template, sampling fields onto SamplingParams, response_format / tool_choice onto a grammar, and the
output parser (reasoning and tool calls) each choice's text goes through.

OpenAI chat, LM Studio and (through their own field names) Anthropic and Ollama build a ChatRequest;
there is no second generation path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.sampling.params import SamplingParams
from .chat_features import ChatFeatures, chat_features
from .chat_output import ChatOutputParser, ParsedOutput, parse_chat_output
from .errors import bad_request
from .reasoning import ReasoningParser
from .request_fields import chat_messages, get_bool, get_int, get_optional, openai_sampling_fields
from .tool_format import JSON_TOOL_CALLS, ToolCallFormat


@dataclass
class ChatRequest:
    prompt_ids: list[int]
    params: SamplingParams
    logprobs: bool = False
    top_logprobs: int = 0
    tools: tuple = ()  # ToolSpecs the output is parsed for
    reasoning: ReasoningParser | None = None  # set when the model reasons in <think> blocks
    incremental_tools: bool = False  # tool-call arguments stream as written (a grammar guarantees them)
    max_tokens_param: str = "max_tokens"  # the field the client capped the output with (for errors)
    tool_format: ToolCallFormat = JSON_TOOL_CALLS  # how the model writes calls
    prediction_ids: tuple[int, ...] = ()  # Predicted Outputs: the expected output's tokens (drafts)

    def new_stream_parser(self) -> ChatOutputParser:
        return ChatOutputParser(
            tools=self.tools, reasoning=self.reasoning, incremental=self.incremental_tools, tool_format=self.tool_format
        )

    def parse_output(self, text: str, finish_reason: str | None = None) -> ParsedOutput:
        return parse_chat_output(
            text, tools=self.tools, reasoning=self.reasoning, finish_reason=finish_reason, tool_format=self.tool_format
        )


def prepare_chat(service, body: dict, *, template_kwargs: dict | None = None) -> ChatRequest:
    """An OpenAI-shaped chat body → ChatRequest (400 naming the field for anything invalid)."""
    service.require_ready()
    service.check_model(body.get("model"))
    messages = chat_messages(body, "messages")
    logprobs = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", 0, minimum=0, maximum=20)
    if top and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    fields = openai_sampling_fields(body)
    fields["logprobs"] = top if logprobs else None
    text, features = render_chat_prompt(service, body, messages, template_kwargs)
    fields["guided"], reasoning = features.for_prompt(service, text)
    max_tokens_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params = service.sampling_params(fields, rename={"max_tokens": max_tokens_param})
    return ChatRequest(
        service.encode_chat(text),
        params,
        logprobs,
        top,
        features.tools,
        reasoning,
        features.incremental_tool_stream,
        max_tokens_param,
        features.tool_format,
        prediction_ids(service, body.get("prediction")),
    )


def prediction_ids(service, prediction) -> tuple[int, ...]:
    """OpenAI's Predicted Outputs, `prediction: {"type": "content", "content": str | [{"type": "text", ...}]}`:
    its text's tokens, drafted from when the server speculates (ignored otherwise, as the output is the same)."""
    if prediction is None:
        return ()
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise bad_request('prediction must be {"type": "content", "content": ...}', "prediction")
    content = prediction.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise bad_request("prediction.content parts must be text parts", "prediction.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad_request("prediction.content must be a string or a list of text parts", "prediction.content")
    return tuple(service.encode_chat(content))


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def thinking_for_effort(body: dict) -> bool | None:
    """`reasoning_effort` as the template's `enable_thinking` switch (vLLM / SGLang accept both): none and
    minimal turn thinking off, any other effort on; None when the request gives no effort."""
    effort = get_optional(body, "reasoning_effort", str)
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise bad_request(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    return effort not in ("none", "minimal")


def render_chat_prompt(
    service, body: dict, messages: list[dict] | None = None, template_kwargs: dict | None = None
) -> tuple[str, ChatFeatures]:
    """The prompt text of an OpenAI-shaped chat body (tools, tool turns and template kwargs included):
    what /v1/chat/completions generates from and /v1/tokenize counts."""
    messages = chat_messages(body, "messages") if messages is None else messages
    kwargs = dict(get_optional(body, "chat_template_kwargs", dict) or {})
    kwargs.update(template_kwargs or {})
    if get_optional(body, "enable_thinking", bool) is not None:
        kwargs["enable_thinking"] = body["enable_thinking"]
    thinking = thinking_for_effort(body)
    if thinking is not None:
        kwargs.setdefault("enable_thinking", thinking)  # an explicit enable_thinking wins
    features = chat_features(service, body, messages)
    text = service.render_chat(
        features.messages,
        tools=features.template_tools,
        template_kwargs=kwargs,
        add_generation_prompt=get_bool(body, "add_generation_prompt", True),
    )
    return text, features
