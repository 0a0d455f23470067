"""Ollama's API: `POST /api/chat` and `/api/generate` (NDJSON streams by default, one JSON object with
`stream: false`), `GET /api/version`, and 501 for what a one-model server cannot do (pull, push,
create, delete, copy, blobs; embeddings are server/embeddings.py). The rest lives beside it: `ollama_request.py` (translating
requests and reply pieces), `ollama_generate.py` (`/api/generate`), `ollama_models.py` (`/api/tags`,
`/api/show`, `/api/ps`).

Both generation routes go through the one chat path (`prepare_chat`): Ollama's `options` become OpenAI
sampling fields, `format` becomes `response_format`, `think` the template's `enable_thinking`, and
`/api/generate` without `raw` is a chat of `system` + `prompt`. With `raw: true` (or the trivial
template `{{ .Prompt }}`) the prompt is tokenized as it is, like `/v1/completions`.

Choices Ember makes where Ollama differs:
- `options.num_ctx` is accepted and ignored: the context is fixed at startup (`/api/show` reports it as
  `<arch>.context_length`); `num_predict` is clipped to the room the context leaves.
- `keep_alive` is accepted and ignored: the one model stays loaded for the server's lifetime; the
  "load" call (an empty prompt) answers at once, `keep_alive: 0` with done_reason "unload".
- Durations come from the engine's timings: `load_duration` is the wait for a batch slot (the model is
  always resident), `prompt_eval_duration` the prefill, `eval_duration` first to last token.
- `/api/version` answers OLLAMA_COMPAT_VERSION, the Ollama release whose API this module speaks.
"""

from __future__ import annotations

import time
from typing import Any

from sanic import Blueprint, response

from .chat_request import ChatRequest, prepare_chat
from .errors import ApiError
from .generation import HEARTBEAT, Generation, new_id
from .ollama_generate import generate
from .ollama_models import check_ollama_model, register_model_routes, requested_name
from .ollama_request import (
    ToolCallCollector,
    created_at,
    done_fields,
    done_reason,
    fit_to_context,
    load_reply,
    ollama_messages,
    ollama_tools,
    openai_fields,
    split_deltas,
    template_kwargs,
    tool_call,
)
from .openai_logprobs import chat_logprobs
from .request_fields import get_bool, json_body
from .sse import ndjson, open_ndjson

OLLAMA_COMPAT_VERSION = "0.9.0"

blueprint = Blueprint("ollama")
register_model_routes(blueprint)
blueprint.add_route(generate, "/api/generate", methods=["POST"], name="generate")


@blueprint.get("/api/version")
async def version(request):
    return response.json({"version": OLLAMA_COMPAT_VERSION})


# ---- /api/chat ----------------------------------------------------------------------------------


@blueprint.post("/api/chat")
async def chat(request):
    started = time.perf_counter()
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    check_ollama_model(service, body.get("model"))
    model = requested_name(service, body.get("model"))
    if not body.get("messages"):
        return load_reply(body, model, chat=True)
    openai_body = {"messages": ollama_messages(body["messages"]), **openai_fields(body)}
    tools = ollama_tools(body.get("tools"))
    if tools:
        openai_body["tools"] = tools
    chat_request = prepare_chat(service, openai_body, template_kwargs=template_kwargs(service, body, model))
    chat_request.params = fit_to_context(service, chat_request.prompt_ids, chat_request.params)
    stream = get_bool(body, "stream", True)
    generation = Generation.start(
        service,
        chat_request.prompt_ids,
        chat_request.params,
        request_id=new_id("ollama-chat-"),
        max_tokens_param="options.num_predict",
    )
    base = {"model": model}
    if stream:
        return await _stream_chat(request, chat_request, generation, base, started)
    result = await generation.collect()
    choice = result.choices[0]
    parsed = chat_request.parse_output(choice.text, choice.finish_reason)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or ""}
    if parsed.reasoning:
        message["thinking"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [tool_call(call, i) for i, call in enumerate(parsed.tool_calls)]
    reply = {**base, "created_at": created_at(), "message": message}
    if chat_request.logprobs:
        reply["logprobs"] = _logprobs(service, chat_request, choice.logprobs)
    reply.update(done_fields(result.usage, done_reason(choice.finish_reason), started))
    return response.json(reply)


def _logprobs(service, chat_request: ChatRequest, entries) -> list[dict]:
    return chat_logprobs(service.tokenizer, list(entries), chat_request.top_logprobs)["content"]


async def _stream_chat(request, chat_request: ChatRequest, generation: Generation, base: dict, started: float):
    service = request.app.ctx.service
    resp = await open_ndjson(request)
    parser = chat_request.new_stream_parser()
    calls = ToolCallCollector()
    finish_reason = None

    def line(content: str = "", **extra) -> dict:
        return {
            **base,
            "created_at": created_at(),
            "message": {"role": "assistant", "content": content, **extra},
            "done": False,
        }

    try:
        async for output in generation.events():
            if output is HEARTBEAT:  # NDJSON has no comments: an empty delta keeps the connection busy
                await resp.send(ndjson(line()))
                continue
            deltas = parser.feed(output.text) if output.text else []
            if output.finish_reason is not None:
                deltas += parser.finish(output.finish_reason)
                finish_reason = output.finish_reason
            content, thinking = split_deltas(deltas)
            calls.add(deltas)
            extra: dict[str, Any] = {"thinking": thinking} if thinking else {}
            logprobs = (
                _logprobs(service, chat_request, output.logprobs) if chat_request.logprobs and output.logprobs else None
            )
            if content or thinking or logprobs:
                chunk = line(content, **extra)
                if logprobs:
                    chunk["logprobs"] = logprobs
                await resp.send(ndjson(chunk))
            ready = calls.ready(final=output.finish_reason is not None)
            if ready:
                await resp.send(ndjson(line(tool_calls=ready)))
        final = {**base, "created_at": created_at(), "message": {"role": "assistant", "content": ""}}
        final.update(done_fields(generation.usage, done_reason(finish_reason), started))
        await resp.send(ndjson(final))
    except ApiError as error:  # headers are out: the error travels as a line, as Ollama sends it
        await resp.send(ndjson({"error": error.message}))
    await resp.eof()
    return resp


# ---- what one served model cannot do --------------------------------------------------------------

_NOT_SUPPORTED = {
    ("POST", "/api/pull"): "pulling models is not supported",
    ("POST", "/api/push"): "pushing models is not supported",
    ("POST", "/api/create"): "creating models is not supported",
    ("DELETE", "/api/delete"): "deleting models is not supported",
    ("POST", "/api/copy"): "copying models is not supported",
}


def _not_supported_handler(reason: str):
    async def handler(request, **_):
        service = request.app.ctx.service
        raise ApiError(501, f"{reason}: Ember serves one model, '{service.model_name}', loaded at startup")

    return handler


for (_method, _uri), _reason in _NOT_SUPPORTED.items():
    blueprint.add_route(
        _not_supported_handler(_reason), _uri, methods=[_method], name=_uri.strip("/").replace("/", "_")
    )
blueprint.add_route(
    _not_supported_handler("uploading blobs is not supported"),
    "/api/blobs/<digest>",
    methods=["HEAD", "POST"],
    name="api_blobs",
)
