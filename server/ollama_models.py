"""Ollama's model routes for the one served model: `GET /api/tags` (the list), `POST /api/show`
(details, `model_info` in GGUF's key names, the chat template, capabilities, default parameters) and
`GET /api/ps` (the running model). Registered on the Ollama blueprint by `ollama.py`.

Names: Ollama names carry a tag; the served model is listed as `<name>:latest` unless its name has
one, and requests may name it with or without `:latest`."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sanic import response

from .errors import ApiError, bad_request
from .model_facts import architecture_info, model_facts
from .request_fields import get_bool, json_body

# A model that never unloads: Ollama reports keep_alive -1 as an expiry centuries away.
_NEVER_EXPIRES = timedelta(days=365 * 290)


def ollama_name(service) -> str:
    name = service.model_name
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def check_ollama_model(service, requested: Any, param: str = "model") -> None:
    """404 in Ollama's words for a name other than the served model's (absent means the served one)."""
    if requested is None or requested == "":
        return
    if not isinstance(requested, str):
        raise bad_request("model must be a string", param)
    names = {service.model_name, service.config.model, ollama_name(service)}
    if requested not in names and requested.removesuffix(":latest") not in names:
        raise ApiError(404, f'model "{requested}" not found, try pulling it first', param, code="model_not_found")


def requested_name(service, requested: Any) -> str:
    """Replies echo the name the request used (as Ollama does), else the listed name."""
    return requested if isinstance(requested, str) and requested else ollama_name(service)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def model_details(service) -> dict[str, Any]:
    facts = model_facts(service.model)
    arch = service.model.spec.arch
    return {
        "parent_model": "",
        "format": facts.format,
        "family": arch,
        "families": [arch],
        "parameter_size": facts.parameter_size,
        "quantization_level": facts.quantization,
    }


def _listing(service) -> dict[str, Any]:
    facts = model_facts(service.model)
    name = ollama_name(service)
    return {
        "name": name,
        "model": name,
        "modified_at": _iso(facts.modified_at or service.created),
        "size": facts.size_bytes,
        "digest": facts.digest,
        "details": model_details(service),
    }


async def tags(request):
    service = request.app.ctx.service
    service.require_ready()
    return response.json({"models": [_listing(service)]})


async def ps(request):
    service = request.app.ctx.service
    engine = service.require_ready()
    entry = _listing(service)
    del entry["modified_at"]
    size = entry["size"] + _kv_bytes(service, engine)
    on_device = service.config.target != "cpu"
    entry.update(
        {
            "size": size,
            "size_vram": size if on_device else 0,
            "expires_at": _iso(time.time() + _NEVER_EXPIRES.total_seconds()),
            "context_length": service.context_length,
        }
    )
    return response.json({"models": [entry]})


def _kv_bytes(service, engine) -> int:
    """The KV pool the engine allocated (part of what the loaded model occupies)."""
    try:
        from ..runtime.engine.engine import kv_bytes_per_block

        blocks = int(engine.snapshot()["total_kv_blocks"])
        return blocks * int(
            kv_bytes_per_block(service.model, engine.config.block_size, kv_cache_dtype=engine.config.kv_cache_dtype)
        )
    except Exception:  # a figure for a listing: never worth failing the request over
        return 0


async def show(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    name = body.get("model") or body.get("name")  # `name` is the older spelling
    if not name:
        raise bad_request("model is required", "model")
    check_ollama_model(service, name)
    facts = model_facts(service.model)
    template = getattr(service.tokenizer, "chat_template", None) or ""
    parameters = _parameters_text(service)
    info = architecture_info(service.model, service.context_length)
    if not get_bool(body, "verbose", False):
        info = {k: v for k, v in info.items() if not k.startswith("tokenizer.")}
    return response.json(
        {
            "modelfile": _modelfile(service, template, parameters),
            "parameters": parameters,
            "template": template,
            "details": model_details(service),
            "model_info": info,
            "capabilities": capabilities(service, template),
            "modified_at": _iso(facts.modified_at or service.created),
        }
    )


def capabilities(service, template: str) -> list[str]:
    """What Ollama would list for this model: completion always, tools when the template renders them,
    thinking when the vocabulary has the think tags."""
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if thinks(service):
        found.append("thinking")
    return found


def thinks(service) -> bool:
    try:
        from .reasoning import ReasoningParser

        return ReasoningParser.for_tokenizer(service.tokenizer) is not None
    except Exception:  # a tokenizer without token_to_id: no think tags to find
        return False


def _parameters_text(service) -> str:
    """The defaults a request gets (the checkpoint's generation_config), Modelfile PARAMETER style."""
    params = service.engine.default_params()
    lines = [
        f"temperature {params.temperature:g}",
        f"top_k {params.top_k}",
        f"top_p {params.top_p:g}",
        f"min_p {params.min_p:g}",
        f"repeat_penalty {params.repetition_penalty:g}",
        f"num_ctx {service.context_length}",
    ]
    for token_id in sorted(service.eos_ids):
        text = service.tokenizer.decode([token_id], skip_special_tokens=False)
        if text:
            lines.append(f'stop "{text}"')
    return "\n".join(lines)


def _modelfile(service, template: str, parameters: str) -> str:
    lines = [f"# Modelfile generated by Ember for {ollama_name(service)}", f"FROM {service.model.checkpoint.path}"]
    if template:
        lines.append(f'TEMPLATE """{template}"""')
    lines.extend(f"PARAMETER {line}" for line in parameters.splitlines())
    return "\n".join(lines) + "\n"


def register_model_routes(blueprint) -> None:
    blueprint.add_route(tags, "/api/tags", methods=["GET"], name="tags")
    blueprint.add_route(ps, "/api/ps", methods=["GET"], name="ps")
    blueprint.add_route(show, "/api/show", methods=["POST"], name="show")
