"""Anthropic `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A Messages request is translated into an OpenAI chat-completions body (system + content blocks →
chat messages with tool calls and `role: "tool"` results; tools and tool_choice; stop_sequences →
stop; thinking → the template's `enable_thinking`; output_config.format → response_format) and goes
through `prepare_chat` like every chat protocol; the output parser's content, reasoning and tool
calls come back as text, thinking and tool_use blocks (`anthropic_stream.py`).

Choices of this server (a local model, not Anthropic's platform):
- Unknown top-level fields are refused (400), as Anthropic does, except platform features that mean
  nothing here (service_tier, container, cache_control, ...), which are accepted and ignored, and
  vLLM-style sampling extensions (seed, min_p, repetition_penalty, ...), which apply.
- A conversation ending in a plain-text assistant message is a prefill: the reply continues it (its
  tokens follow the template's generation prompt); the response holds only the new text.
- thinking.budget_tokens is checked but not enforced; thinking blocks carry an empty signature.
- The sampling fields (temperature, top_p, top_k) are read as sent; SDK 2.x sends them through
  `extra_body`, since its method signatures no longer list them.
- usage.input_tokens excludes prompt tokens served by the prefix cache, which are reported as
  cache_read_input_tokens (Anthropic's accounting: total input = the two summed).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, replace
from typing import Any

from sanic import Blueprint, response

from .anthropic_stream import BlockWriter, content_blocks, message_body, stop_fields, usage_body
from .chat_request import prepare_chat
from .errors import ApiError, bad_request, error_body
from .generation import HEARTBEAT, Generation, new_id
from .request_fields import get_bool, get_int, get_optional, json_body, stop_field
from .sse import SSE_HEADERS, event
from .tool_messages import anthropic_messages_to_openai
from .tools import parse_anthropic_tool_choice, parse_anthropic_tools

blueprint = Blueprint("anthropic")

_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "output_config",
    }
)
# Anthropic platform features with no meaning on a local server: accepted, ignored.
_IGNORED = frozenset(
    {
        "service_tier",
        "container",
        "cache_control",
        "inference_geo",
        "speed",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
        "mcp_servers",
        "context_management",
    }
)
# Sampling extensions (vLLM's names, as on the OpenAI routes), passed through as they are.
_EXTENSIONS = frozenset(
    {
        "seed",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "min_tokens",
        "ignore_eos",
        "logit_bias",
        "chat_template_kwargs",
    }
)
# prepare_chat names fields of the OpenAI body it was given; the Anthropic request's own names instead.
_PARAM_NAMES = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "enable_thinking": "thinking",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}


@blueprint.post("/v1/messages")
async def messages(request):
    service = request.app.ctx.service
    body = json_body(request)
    chat = _prepare(service, body, count_only=False)
    stream = get_bool(body, "stream", False)
    message_id = new_id("msg_")
    generation = Generation.start(service, chat.prompt_ids, chat.params, request_id=message_id)
    if stream:
        return await _stream(request, service, chat, generation, message_id)
    return await _complete(service, chat, generation, message_id)


@blueprint.post("/v1/messages/count_tokens")
async def count_tokens(request):
    service = request.app.ctx.service
    chat = _prepare(service, json_body(request), count_only=True)
    return response.json({"input_tokens": len(chat.prompt_ids)})


# ---- request ----------------------------------------------------------------------------------


def _prepare(service, body: dict, *, count_only: bool):
    """The Anthropic body → ChatRequest, rendered exactly as /v1/messages renders it (count_tokens too)."""
    service.require_ready()
    service.check_model(body.get("model"))
    try:
        translated = openai_chat_body(body, require_max_tokens=not count_only)
    except ApiError as error:
        raise with_field(error) from None
    try:
        chat = prepare_chat(service, translated.body, template_kwargs=translated.template_kwargs)
    except ApiError as error:
        raise with_field(error, _PARAM_NAMES) from None
    if translated.prefill:  # the template ended with the assistant's header: the reply goes on from here
        chat = replace(chat, prompt_ids=chat.prompt_ids + service.encode_chat(translated.prefill))
    return chat


@dataclass(frozen=True)
class Translated:
    body: dict[str, Any]  # an OpenAI chat-completions body
    template_kwargs: dict[str, Any]
    prefill: str = ""  # the final assistant message's text, which the reply continues (Anthropic's prefill)


def openai_chat_body(body: dict, *, require_max_tokens: bool = True) -> Translated:
    """An Anthropic Messages body → an OpenAI chat-completions body, chat template kwargs and the
    assistant prefill. 400 naming the Anthropic field for anything invalid."""
    unknown = sorted(set(body) - _FIELDS - _IGNORED - _EXTENSIONS)
    if unknown:
        raise bad_request(f"{unknown[0]}: Extra inputs are not permitted", unknown[0])
    out: dict[str, Any] = {key: body[key] for key in _EXTENSIONS if body.get(key) is not None}
    out["model"] = body.get("model")
    out["messages"], prefill = _split_prefill(anthropic_messages_to_openai(body.get("messages"), body.get("system")))
    if require_max_tokens and body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", "max_tokens")
    out["max_tokens"] = get_int(body, "max_tokens", None, minimum=1)
    out["temperature"] = get_optional(body, "temperature", (int, float))
    out["top_p"] = get_optional(body, "top_p", (int, float))
    out["top_k"] = get_int(body, "top_k", None, minimum=0)
    stop = stop_field(body, "stop_sequences")
    out["stop"] = list(stop) if stop else None
    get_optional(body, "metadata", dict)
    out.update(_tools(body))
    out["response_format"] = _response_format(body)
    template_kwargs = {}
    thinking = _thinking(body)
    if thinking is not None:
        template_kwargs["enable_thinking"] = thinking
    return Translated({k: v for k, v in out.items() if v is not None}, template_kwargs, prefill)


def _split_prefill(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """A conversation ending in a plain-text assistant message asks to continue that message: it is
    taken out of the rendered turns and its text follows the generation prompt instead."""
    last = messages[-1]
    if len(messages) < 2 or last["role"] != "assistant" or last.get("tool_calls") or last.get("reasoning_content"):
        return messages, ""
    return messages[:-1], last.get("content") or ""


def _tools(body: dict) -> dict[str, Any]:
    specs = parse_anthropic_tools(body.get("tools"))
    choice = parse_anthropic_tool_choice(body.get("tool_choice"), specs)
    if not specs:
        return {}
    if choice.mode == "function":
        tool_choice: Any = {"type": "function", "function": {"name": choice.name}}
    else:
        tool_choice = choice.mode  # auto | none | required ("any")
    return {
        "tools": [spec.to_openai() for spec in specs],
        "tool_choice": tool_choice,
        "parallel_tool_calls": choice.parallel,
    }


def _thinking(body: dict) -> bool | None:
    """thinking → the template's enable_thinking (None: not given, the template's default)."""
    thinking = get_optional(body, "thinking", dict)
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind == "disabled":
        return False
    if kind == "enabled":
        get_int(thinking, "budget_tokens", None, minimum=1, param="thinking.budget_tokens")
        if "budget_tokens" not in thinking:
            raise bad_request("thinking.budget_tokens: Field required", "thinking.budget_tokens")
        return True
    if kind == "adaptive":
        return True
    raise bad_request("thinking.type must be 'enabled', 'adaptive' or 'disabled'", "thinking.type")


def _response_format(body: dict) -> dict[str, Any] | None:
    """output_config.format ({"type": "json_schema", "schema"}) → OpenAI's response_format."""
    config = get_optional(body, "output_config", dict)
    if config is None or config.get("format") is None:
        return None
    fmt = config["format"]
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad_request("output_config.format.type must be 'json_schema'", "output_config.format.type")
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request("output_config.format.schema must be a JSON Schema object", "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def with_field(error: ApiError, names: dict[str, str] | None = None) -> ApiError:
    """Anthropic's error body has no `param`: the field goes into the message. `names` maps fields of
    the translated OpenAI body back to the request's own (message indexes shift in translation, so a
    translated message's index is dropped)."""
    param = error.param
    if error.status != 400 or not param:
        return error
    if names is not None:
        head = param.split("[", 1)[0].split(".", 1)[0]
        param = names.get(param) or ("messages" if head == "messages" else names.get(head, param))
    if error.message.startswith(param):
        return ApiError(error.status, error.message, param, error.code)
    return ApiError(error.status, f"{param}: {error.message}", param, error.code)


# ---- response ---------------------------------------------------------------------------------


async def _complete(service, chat, generation: Generation, message_id: str):
    result = await generation.collect()
    choice = result.choices[0]
    parsed = chat.parse_output(choice.text, choice.finish_reason)
    stop_reason, stop_sequence = stop_fields(choice.finish_reason, choice.stop_reason, bool(parsed.tool_calls))
    body = message_body(
        message_id,
        service.model_name,
        content=content_blocks(parsed),
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=usage_body(result.usage),
    )
    return response.json(body, headers={"request-id": message_id})


async def _stream(request, service, chat, generation: Generation, message_id: str):
    resp = await request.respond(
        content_type="text/event-stream; charset=utf-8", headers={**SSE_HEADERS, "request-id": message_id}
    )
    start = message_body(
        message_id,
        service.model_name,
        content=[],
        stop_reason=None,
        stop_sequence=None,
        usage=usage_body(None, len(chat.prompt_ids)),
    )
    await resp.send(event("message_start", {"type": "message_start", "message": start}))
    parser, blocks = chat.new_stream_parser(), BlockWriter()
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(heartbeat_events(generation))
                continue
            deltas = parser.feed(output.text) if output.text else []
            if output.finish_reason is not None:
                deltas += parser.finish(output.finish_reason)
            events = blocks.feed(deltas)
            if output.finish_reason is not None:
                events += blocks.close()
            for name, payload in events:
                await resp.send(event(name, payload))
            if output.finish_reason is not None:
                stop_reason, stop_sequence = stop_fields(
                    output.finish_reason, output.stop_reason, blocks.has_tool_calls or parser.has_tool_calls
                )
                await resp.send(
                    event(
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                            "usage": usage_body(output.usage or generation.usage, len(chat.prompt_ids)),
                        },
                    )
                )
                await resp.send(event("message_stop", {"type": "message_stop"}))
    except ApiError as error:  # headers are out: the error travels as an event
        await resp.send(event("error", error_body("anthropic", error)))
    except Exception as error:  # noqa: BLE001 — an unexpected failure mid-stream still ends the stream cleanly
        traceback.print_exception(error)
        failure = ApiError(500, f"internal error: {type(error).__name__}")
        await resp.send(event("error", error_body("anthropic", failure)))
    await resp.eof()
    return resp


def heartbeat_events(generation: Generation) -> str:
    """What an idle stream sends: Anthropic's `ping` event, after an SSE comment with the prefill's progress
    (`: prefill 512/4096`) while the prompt is being read (clients ignore comments)."""
    progress = generation.prefill_progress()
    ping = event("ping", {"type": "ping"})
    return ping if progress is None else generation.heartbeat_comment() + ping
