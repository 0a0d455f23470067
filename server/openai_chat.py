"""OpenAI `POST /v1/chat/completions`: messages → the chat template → the engine → chat completions,
streamed as SSE chunks (role first, content / reasoning / tool-call deltas, a finish chunk per choice,
the usage chunk with `choices: []`, then `[DONE]`) or as one JSON object."""

from __future__ import annotations

import time
from collections.abc import Callable

from sanic import Blueprint, response

from .chat_output import chat_finish_reason
from .chat_request import ChatRequest, prepare_chat
from .errors import ApiError, error_body
from .generation import HEARTBEAT, Generation, new_id
from .openai_logprobs import chat_logprobs
from .request_fields import get_bool, get_optional, json_body
from .sse import DONE, data, open_stream

blueprint = Blueprint("openai_chat")


@blueprint.post("/v1/chat/completions")
async def chat_completions(request):
    service = request.app.ctx.service
    body = json_body(request)
    chat = prepare_chat(service, body)
    stream = get_bool(body, "stream", False)
    completion_id = new_id("chatcmpl-")
    generation = Generation.start(
        service,
        chat.prompt_ids,
        chat.params,
        request_id=completion_id,
        max_tokens_param=chat.max_tokens_param,
        prediction_ids=chat.prediction_ids,
    )
    if stream:
        return await stream_chat(request, service, chat, generation, completion_id, include_usage(service, body))
    return await complete_chat(service, chat, generation, completion_id)


# `extra(finish_reason) -> dict`: fields a protocol built on this one (LM Studio) adds to the reply object,
# or to the last chunk of a stream (the usage chunk, else the last finish chunk).
Extra = Callable[[str | None], dict] | None


async def complete_chat(service, chat: ChatRequest, generation: Generation, completion_id: str, extra: Extra = None):
    result = await generation.collect()
    choices = []
    for choice in result.choices:
        parsed = chat.parse_output(choice.text, choice.finish_reason)
        message = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        finish = chat_finish_reason(choice.finish_reason, bool(parsed.tool_calls))
        entry = {
            "index": choice.index,
            "message": message,
            "finish_reason": finish,
            "logprobs": chat_logprobs(service.tokenizer, choice.logprobs, chat.top_logprobs) if chat.logprobs else None,
        }
        if choice.stop_reason is not None:
            entry["stop_reason"] = choice.stop_reason
        choices.append(entry)
    payload = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": service.model_name,
        "choices": choices,
        "usage": usage_dict(result.usage),
        "system_fingerprint": fingerprint(service),
    }
    return response.json({**payload, **(extra(choices[0]["finish_reason"]) if extra else {})})


async def stream_chat(
    request,
    service,
    chat: ChatRequest,
    generation: Generation,
    completion_id: str,
    include_usage: bool,
    extra: Extra = None,
):
    created = int(time.time())
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": service.model_name,
        "system_fingerprint": fingerprint(service),
    }

    def chunk(index: int, delta: dict, finish_reason=None, logprobs=None, more: dict | None = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return data({**base, "choices": [choice], **(more or {})})

    resp = await open_stream(request)
    parsers = {i: chat.new_stream_parser() for i in range(chat.params.n)}
    finishes: dict[int, str] = {}
    for i in range(chat.params.n):
        await resp.send(chunk(i, {"role": "assistant", "content": ""}))
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(generation.heartbeat_comment())
                continue
            parser = parsers[output.index]
            deltas = parser.feed(output.text) if output.text else []
            if output.finish_reason is not None:
                deltas += parser.finish(output.finish_reason)
            logprobs = (
                chat_logprobs(service.tokenizer, list(output.logprobs), chat.top_logprobs)
                if chat.logprobs and output.logprobs
                else None
            )
            for delta in deltas:
                await resp.send(chunk(output.index, delta, logprobs=logprobs))
                logprobs = None
            if logprobs is not None:  # tokens whose text is held back still report their logprobs
                await resp.send(chunk(output.index, {}, logprobs=logprobs))
            if output.finish_reason is not None:
                finish = chat_finish_reason(output.finish_reason, parser.has_tool_calls)
                finishes[output.index] = finish
                last = output.usage is not None and not include_usage
                more = extra(finishes.get(0)) if extra and last else None
                await resp.send(chunk(output.index, {}, finish_reason=finish, more=more))
        if include_usage and generation.usage is not None:
            more = extra(finishes.get(0)) if extra else {}
            await resp.send(data({**base, "choices": [], "usage": usage_dict(generation.usage), **more}))
    except ApiError as error:  # headers are out: the error travels as an event
        await resp.send(data(error_body("openai", error)))
    await resp.send(DONE)
    await resp.eof()
    return resp


def include_usage(service, body: dict) -> bool:
    """The final usage chunk of a stream: on unless the server disables it; a request's
    stream_options.include_usage decides when given."""
    options = get_optional(body, "stream_options", dict) or {}
    given = options.get("include_usage")
    return service.config.stream_usage if given is None else bool(given)


def usage_dict(usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": usage.accepted_prediction_tokens,
            "rejected_prediction_tokens": usage.rejected_prediction_tokens,
        },
    }


def fingerprint(service) -> str:
    return f"ember-{service.config.target}-{'det' if service.engine.config.deterministic else 'fast'}"
