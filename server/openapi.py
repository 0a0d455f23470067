"""`GET /openapi.json`: an OpenAPI 3.1 document of the OpenAI-compatible routes and Ember's own, built
for the running server (the served model name is the `model` enum; token ids are bounded by its
vocabulary; max_tokens by its context).

Bounds in the request schemas are the server's real checks (openapi_schemas.py); every error status
has OpenAI's error shape `{"error": {"message", "type", "param", "code"}}`. Streaming responses are
documented as `text/event-stream` (OpenAI's chunk / event formats). The Anthropic, Ollama and LM Studio
routes follow their own vendors' published APIs and are not described here.
"""

from __future__ import annotations

from typing import Any

from . import openapi_ember_schemas as ember
from . import openapi_responses_schemas as responses
from . import openapi_schemas as s

# Which error statuses each kind of route can answer (401 only matters when the server has an API key).
_GENERATE_ERRORS = (400, 401, 404, 413, 429, 500, 503, 504)
_BODY_ERRORS = (400, 401, 404, 413, 503)
_GET_ERRORS = (401, 503)
_ERROR_TEXT = {
    400: "invalid request (param names the field)",
    401: "missing or wrong API key",
    404: "unknown model (or route)",
    413: "body too large",
    429: "queue full",
    500: "generation failed",
    503: "loading or shutting down",
    504: "request deadline passed",
}


def openapi_document(service) -> dict:
    model = service.model_name
    ready = service.model is not None and service.engine is not None
    vocab = service.vocab_size if ready else 1 << 20
    context = service.context_length or 2
    schemas = {
        "Error": s.ERROR,
        "ChatMessage": s.chat_message(),
        "ChatTool": s.chat_tool(),
        "ChatCompletionRequest": s.chat_request(model, vocab, context),
        "ChatCompletion": s.chat_completion(),
        "CompletionRequest": s.completion_request(model, vocab, context),
        "Completion": s.completion(),
        "ResponseRequest": responses.responses_request(model, context),
        "Response": responses.response_object(),
        "Model": s.model_card(),
        "TokenizeRequest": ember.tokenize_request(model),
        "DetokenizeRequest": ember.detokenize_request(model, vocab),
        "ScoreRequest": ember.score_request(model, vocab),
        "Score": ember.score_response(),
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Ember",
            "version": "0.1.0",
            "description": f"OpenAI-compatible API of an Ember server serving '{model}' (context {context} tokens).",
        },
        "paths": _paths(model),
        "components": {"schemas": schemas},
    }
    if service.config.api_key:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
    return doc


def _paths(model: str) -> dict:
    sse = {"text/event-stream": {"schema": {"type": "string"}}}
    return {
        "/v1/chat/completions": {
            "post": _post(
                "createChatCompletion",
                "Chat completion (OpenAI)",
                "ChatCompletionRequest",
                "ChatCompletion",
                extra_content=sse,
                errors=_GENERATE_ERRORS,
            )
        },
        "/v1/completions": {
            "post": _post(
                "createCompletion",
                "Text completion (OpenAI)",
                "CompletionRequest",
                "Completion",
                extra_content=sse,
                errors=_GENERATE_ERRORS,
            )
        },
        "/v1/responses": {
            "post": _post(
                "createResponse",
                "Create a response (OpenAI Responses API; stored per API key unless store is false)",
                "ResponseRequest",
                "Response",
                extra_content=sse,
                errors=_GENERATE_ERRORS,
            )
        },
        "/v1/responses/{response_id}": {
            "get": _get(
                "getResponse",
                "A stored response (404 when it was not stored, was evicted, or is another key's)",
                s.ref("Response"),
                errors=(401, 404),
                parameters=[_path_param("response_id")],
            )
        },
        "/v1/models": {
            "get": _get(
                "listModels",
                "The served model",
                s.obj({"object": s.const("list"), "data": s.array(s.ref("Model"))}, ("object", "data")),
            )
        },
        "/v1/models/{model}": {
            "get": _get(
                "retrieveModel",
                "One model (404 for any name but the served one)",
                s.ref("Model"),
                errors=(401, 404, 503),
                parameters=[_path_param("model", {"type": "string", "example": model})],
            )
        },
        "/v1/tokenize": {
            "post": _post(
                "tokenize",
                "Token ids of a prompt, or of chat messages through the chat template",
                "TokenizeRequest",
                s.obj(
                    {
                        "tokens": s.array(s.INTEGER),
                        "count": s.INTEGER,
                        "max_model_len": s.INTEGER,
                        "token_strs": s.array(s.nullable(s.STRING)),
                    },
                    ("tokens", "count", "max_model_len"),
                ),
                errors=_BODY_ERRORS,
            )
        },
        "/v1/detokenize": {
            "post": _post(
                "detokenize",
                "Text of token ids",
                "DetokenizeRequest",
                s.obj({"prompt": s.STRING}, ("prompt",)),
                errors=_BODY_ERRORS,
            )
        },
        "/v1/score": {
            "post": _post(
                "score",
                "Teacher-forced logprobs of a completion after a prompt",
                "ScoreRequest",
                "Score",
                errors=_GENERATE_ERRORS,
            )
        },
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "200 once the model is loaded and compiled; no API key needed",
                "security": [],
                "responses": {
                    code: {
                        "description": text,
                        "content": {
                            "application/json": {
                                "schema": s.obj({"status": s.STRING, "model": s.STRING, "error": s.STRING}, ("status",))
                            }
                        },
                    }
                    for code, text in (("200", "ready"), ("503", "loading, failed or draining"))
                },
            }
        },
        "/v1/info": {
            "get": _get(
                "info",
                "The served model and engine settings",
                s.obj(
                    {
                        "model": s.STRING,
                        "architecture": s.STRING,
                        "max_context_length": s.INTEGER,
                        "max_output_tokens": s.INTEGER,
                        "vocab_size": s.INTEGER,
                        "target": s.STRING,
                        "deterministic": s.BOOLEAN,
                        "max_num_seqs": s.INTEGER,
                        "kv_block_size": s.INTEGER,
                        "dtype": s.STRING,
                        "mesh": s.obj(
                            {"tensor_parallel": s.INTEGER, "expert_parallel": s.BOOLEAN},
                            ("tensor_parallel", "expert_parallel"),
                            description="the devices of the host the model is spread over",
                        ),
                        "weight_bytes": s.nullable(
                            s.obj(
                                {"device": s.INTEGER, "checkpoint": s.INTEGER, "ratio": s.NUMBER},
                                ("device", "checkpoint", "ratio"),
                                description="weight bytes on the device vs the checkpoint's tensor bytes",
                            )
                        ),
                    },
                    ("model", "max_context_length", "vocab_size"),
                ),
            )
        },
        "/v1/capacity": {
            "get": _get(
                "capacity",
                "Engine load: running and waiting requests, free KV blocks, prompts still prefilling",
                s.obj(
                    {
                        "prefilling": s.array(
                            s.obj(
                                {"id": s.STRING, "processed": s.INTEGER, "total": s.INTEGER},
                                ("id", "processed", "total"),
                            )
                        ),
                        "active": s.INTEGER,
                        "waiting": s.INTEGER,
                        "free_kv_blocks": s.INTEGER,
                        "total_kv_blocks": s.INTEGER,
                        "accepting": s.BOOLEAN,
                    },
                    ("active", "waiting", "free_kv_blocks", "total_kv_blocks", "accepting"),
                ),
            )
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors((401,)),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **_errors((401,)),
                },
            }
        },
    }


def _post(
    operation_id: str,
    summary: str,
    request: str,
    response: str | dict,
    *,
    errors: tuple[int, ...],
    extra_content: dict | None = None,
) -> dict:
    result = s.ref(response) if isinstance(response, str) else response
    return {
        "operationId": operation_id,
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": s.ref(request)}}},
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": result}, **(extra_content or {})}},
            **_errors(errors),
        },
    }


def _get(
    operation_id: str,
    summary: str,
    response: dict | None,
    *,
    errors: tuple[int, ...] = _GET_ERRORS,
    parameters: list | None = None,
) -> dict:
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": _errors(errors)}
    if response is not None:
        op["responses"] = {
            "200": {"description": "OK", "content": {"application/json": {"schema": response}}},
            **op["responses"],
        }
    if parameters:
        op["parameters"] = parameters
    return op


def _path_param(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"}}


def _errors(statuses: tuple[int, ...]) -> dict:
    return {
        str(code): {"description": _ERROR_TEXT[code], "content": {"application/json": {"schema": s.ref("Error")}}}
        for code in statuses
    }
