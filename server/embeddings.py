"""Embeddings of the served model (runtime/execution/hidden_states.py: mean-pooled, L2-normalised final
hidden states): OpenAI's `POST /v1/embeddings` (a string, strings, token ids or lists of them;
`encoding_format` float or base64; `dimensions` only when it equals the model's width), Ollama's
`POST /api/embed` (`input`, `truncate`) and its older `POST /api/embeddings` (`prompt` → `embedding`),
and LM Studio's `POST /api/v0/embeddings` (OpenAI's shape)."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
from sanic import Blueprint, response

from .errors import bad_request
from .ollama_models import check_ollama_model, requested_name
from .request_fields import get_bool, get_int, get_str, json_body

blueprint = Blueprint("embeddings")

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def input_ids(service, value: Any, param: str, *, truncate: bool = False) -> list[list[int]]:
    """Each input's token ids: text is tokenized with the model's BOS rule; ids are checked."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param} must be a non-empty string, array of strings, or array of token id arrays", param)
    if len(value) > MAX_INPUTS:
        raise bad_request(f"at most {MAX_INPUTS} inputs per request", param)
    out = []
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if isinstance(item, str):
            if not item:
                raise bad_request("inputs must not be empty strings", where)
            ids = service.encode_text(item)
        elif _is_ids(item):
            ids = service.check_token_ids(item, where)
        else:
            raise bad_request("each input must be a non-empty string or array of token ids", where)
        if len(ids) > service.context_length:
            if not truncate:
                raise bad_request(
                    f"input is {len(ids)} tokens; this model's context is {service.context_length} tokens", where
                )
            ids = ids[: service.context_length]
        out.append(ids)
    return out


async def embed(service, inputs: list[list[int]]) -> np.ndarray:
    """[len(inputs), d] on a worker thread (the event loop keeps serving)."""
    return await asyncio.to_thread(service.embedder.embed, inputs)


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32 bytes, as OpenAI's SDK decodes them
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


@blueprint.post("/v1/embeddings")
async def openai_embeddings(request):
    return await _openai_embeddings(request)


@blueprint.post("/api/v0/embeddings")
async def lmstudio_embeddings(request):
    return await _openai_embeddings(request)


async def _openai_embeddings(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    service.check_model(body.get("model"))
    encoding = get_str(body, "encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request('encoding_format must be "float" or "base64"', "encoding_format")
    dimensions = get_int(body, "dimensions", None, minimum=1)
    width = service.embedder.width
    if dimensions is not None and dimensions != width:
        raise bad_request(f"dimensions must be {width}, the served model's width (it cannot be reduced)", "dimensions")
    inputs = input_ids(service, body.get("input"), "input")
    vectors = await embed(service, inputs)
    tokens = sum(len(ids) for ids in inputs)
    return response.json(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
                for i, vector in enumerate(vectors)
            ],
            "model": service.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


@blueprint.post("/api/embed")
async def ollama_embed(request):
    started = time.perf_counter()
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    check_ollama_model(service, body.get("model"))
    dimensions = get_int(body, "dimensions", None, minimum=1)
    if dimensions is not None and dimensions != service.embedder.width:
        raise bad_request(f"dimensions must be {service.embedder.width}, the served model's width", "dimensions")
    inputs = input_ids(service, body.get("input"), "input", truncate=get_bool(body, "truncate", True))
    vectors = await embed(service, inputs)
    return response.json(
        {
            "model": requested_name(service, body.get("model")),
            "embeddings": [_encoded(v, "float") for v in vectors],
            "total_duration": int((time.perf_counter() - started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": sum(len(ids) for ids in inputs),
        }
    )


@blueprint.post("/api/embeddings")
async def ollama_embeddings_legacy(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    check_ollama_model(service, body.get("model"))
    prompt = get_str(body, "prompt", "")
    if not prompt:
        return response.json({"embedding": []})  # Ollama answers an empty prompt with an empty vector
    vectors = await embed(service, input_ids(service, prompt, "prompt", truncate=True))
    return response.json({"embedding": _encoded(vectors[0], "float")})
