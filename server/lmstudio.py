"""LM Studio's REST API (`/api/v0/...`): the model list with LM Studio's fields, and chat completions
and completions that are OpenAI's (the same handlers' code) plus LM Studio's `stats`, `model_info` and
`runtime` blocks — on the one JSON object, or on the last SSE chunk before `[DONE]` of a stream.

Stats, from the engine's timings of the request:
- `time_to_first_token`: seconds from arrival to the first token;
- `generation_time`: seconds the engine worked on it (prefill and decode; queueing excluded);
- `tokens_per_second`: completion tokens / generation_time;
- `stop_reason`: LM Studio's names: eosFound, stopStringFound, maxPredictedTokensReached,
  contextLengthReached, toolCalls, userStopped, failed.
Errors keep OpenAI's shape (as LM Studio's do).
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from sanic import Blueprint, response

from .chat_request import prepare_chat
from .generation import Generation, new_id
from .model_facts import model_facts
from .openai_chat import complete_chat, include_usage, stream_chat
from .openai_completions import complete_completion, prepare_completion, start_completion, stream_completion
from .request_fields import get_bool, json_body

blueprint = Blueprint("lmstudio")

_SUPPORTED_FORMATS = ["gguf", "safetensors"]


@functools.cache
def _ember_version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "unknown"


# ---- models -------------------------------------------------------------------------------------


def model_card(service) -> dict[str, Any]:
    facts = model_facts(service.model)
    trained = int(service.model.dims.as_dict().get("max_context") or 0) or service.context_length
    template = getattr(service.tokenizer, "chat_template", None) or ""
    card = {
        "id": service.model_name,
        "object": "model",
        "type": "llm",
        "publisher": _publisher(service),
        "arch": service.model.spec.arch,
        "compatibility_type": facts.format,
        "quantization": facts.quantization,
        "state": "loaded",
        "max_context_length": trained,
        "loaded_context_length": service.context_length,
    }
    if "tools" in template:
        card["capabilities"] = ["tool_use"]
    return card


def _publisher(service) -> str:
    """GGUF's general.organization when the file names one; else "local" (a model from disk)."""
    organization = (service.model.checkpoint.metadata or {}).get("general.organization")
    return organization if isinstance(organization, str) and organization else "local"


@blueprint.get("/api/v0/models")
async def models(request):
    service = request.app.ctx.service
    service.require_ready()
    return response.json({"object": "list", "data": [model_card(service)]})


@blueprint.get("/api/v0/models/<name:path>")
async def model(request, name: str):
    service = request.app.ctx.service
    service.require_ready()
    service.check_model(name)
    return response.json(model_card(service))


# ---- the blocks LM Studio adds ------------------------------------------------------------------


def lmstudio_blocks(service, generation: Generation, finish_reason: str | None) -> dict[str, Any]:
    """`stats`, `model_info` and `runtime` for a finished request (finish_reason as the reply said it)."""
    usage = generation.usage
    blocks: dict[str, Any] = {}
    ending = generation.endings.get(0, (None, None))
    if usage is not None:
        working = max(usage.e2e_s - usage.queue_s, 0.0)
        blocks["stats"] = {
            "tokens_per_second": usage.completion_tokens / working if working > 0 else 0.0,
            "time_to_first_token": usage.ttft_s,
            "generation_time": working,
            "stop_reason": _stop_reason(service, usage, finish_reason or ending[0], ending[1]),
        }
    facts = model_facts(service.model)
    blocks["model_info"] = {
        "arch": service.model.spec.arch,
        "quant": facts.quantization,
        "format": facts.format,
        "context_length": service.context_length,
    }
    blocks["runtime"] = {"name": "ember", "version": _ember_version(), "supported_formats": _SUPPORTED_FORMATS}
    return blocks


def _stop_reason(service, usage, finish_reason: str | None, stop_reason: str | int | None) -> str:
    if finish_reason == "tool_calls":
        return "toolCalls"
    if finish_reason == "length":
        full = usage.prompt_tokens + usage.completion_tokens >= service.context_length
        return "contextLengthReached" if full else "maxPredictedTokensReached"
    if finish_reason == "abort":
        return "userStopped"
    if finish_reason == "error":
        return "failed"
    return "stopStringFound" if isinstance(stop_reason, str) else "eosFound"


# ---- generation ---------------------------------------------------------------------------------


@blueprint.post("/api/v0/chat/completions")
async def chat_completions(request):
    service = request.app.ctx.service
    body = json_body(request)
    chat = prepare_chat(service, body)
    completion_id = new_id("chatcmpl-")
    generation = Generation.start(
        service, chat.prompt_ids, chat.params, request_id=completion_id, max_tokens_param=chat.max_tokens_param
    )

    def blocks(finish_reason):
        return lmstudio_blocks(service, generation, finish_reason)

    if get_bool(body, "stream", False):
        return await stream_chat(
            request, service, chat, generation, completion_id, include_usage(service, body), extra=blocks
        )
    return await complete_chat(service, chat, generation, completion_id, extra=blocks)


@blueprint.post("/api/v0/completions")
async def completions(request):
    service = request.app.ctx.service
    completion = prepare_completion(service, json_body(request))
    generation, completion_id = start_completion(service, completion)

    def blocks(finish_reason):
        return lmstudio_blocks(service, generation, finish_reason)

    if completion.stream:
        return await stream_completion(request, service, completion, generation, completion_id, extra=blocks)
    return await complete_completion(service, completion, generation, completion_id, extra=blocks)
