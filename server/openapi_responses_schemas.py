"""JSON Schemas of the OpenAI Responses API's bodies (`POST /v1/responses`), used by `openapi.py`; the
shared building blocks and the other routes' schemas are in `openapi_schemas.py`."""

from __future__ import annotations

from .openapi_schemas import (
    BOOLEAN,
    INTEGER,
    JSON_SCHEMA_OBJECT,
    NUMBER,
    STRING,
    TOOL_NAME,
    Schema,
    array,
    const,
    max_tokens_schema,
    model_field,
    nullable,
    obj,
)


def responses_request(model: str, context: int) -> Schema:
    part = obj({"type": {"enum": ["input_text", "output_text", "text"]}, "text": STRING}, ("type", "text"))
    refusal = obj({"type": const("refusal"), "refusal": STRING}, ("type", "refusal"))
    content = {"anyOf": [STRING, array({"anyOf": [part, refusal]})]}
    item = {
        "anyOf": [
            obj(
                {
                    "type": const("message"),
                    "role": {"enum": ["user", "system", "developer", "assistant"]},
                    "content": content,
                },
                ("role", "content"),
            ),
            obj(
                {
                    "type": const("function_call"),
                    "call_id": STRING,
                    "name": STRING,
                    "arguments": {"type": "string", "description": "a JSON object as text"},
                },
                ("type", "call_id", "name", "arguments"),
            ),
            obj(
                {
                    "type": const("function_call_output"),
                    "call_id": {"type": "string", "minLength": 1},
                    "output": {"anyOf": [STRING, array(part)]},
                },
                ("type", "call_id", "output"),
            ),
            obj(
                {"type": const("reasoning"), "id": STRING, "summary": array(obj({}))},
                ("type",),
                description="accepted and dropped (chat templates leave past reasoning out)",
            ),
        ]
    }
    tool = obj(
        {
            "type": const("function"),
            "name": TOOL_NAME,
            "description": STRING,
            "parameters": JSON_SCHEMA_OBJECT,
            "strict": BOOLEAN,
        },
        ("type", "name"),
    )
    tool_choice = {
        "anyOf": [
            {"enum": ["auto", "none", "required"]},
            obj({"type": const("function"), "name": TOOL_NAME}, ("type", "name")),
            obj(
                {
                    "type": const("allowed_tools"),
                    "mode": {"enum": ["auto", "required"]},
                    "tools": array(obj({"type": const("function"), "name": TOOL_NAME}, ("type", "name"))),
                },
                ("type", "mode", "tools"),
            ),
        ]
    }
    text_format = {
        "oneOf": [
            obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
            obj(
                {
                    "type": const("json_schema"),
                    "name": STRING,
                    "description": STRING,
                    "schema": JSON_SCHEMA_OBJECT,
                    "strict": BOOLEAN,
                },
                ("type", "name", "schema"),
            ),
        ]
    }
    return obj(
        {
            "model": model_field(model),
            "input": {"anyOf": [STRING, array(item, minItems=1)]},
            "instructions": STRING,
            "max_output_tokens": max_tokens_schema(context),
            "temperature": {"type": "number", "minimum": 0},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "tools": array(tool),
            "tool_choice": tool_choice,
            "parallel_tool_calls": BOOLEAN,
            "text": obj({"format": text_format}),
            "reasoning": obj(
                {
                    "effort": {"enum": ["none", "minimal", "low", "medium", "high", "xhigh"]},
                    "summary": {"enum": ["auto", "concise", "detailed"]},
                },
                description="effort is passed to the chat template's reasoning switch; there is no "
                "summariser, so summary is accepted and ignored",
            ),
            "metadata": {
                "type": "object",
                "maxProperties": 16,
                "additionalProperties": STRING,
                "description": "echoed back",
            },
            "store": {
                "type": "boolean",
                "description": "keep the response (default true) in a bounded in-memory store, per API key",
            },
            "previous_response_id": {
                "anyOf": [STRING, {"type": "null"}],
                "description": "continue a stored response's conversation (400 when it is not stored)",
            },
            "stream": BOOLEAN,
            "user": STRING,
        },
        ("input",),
    )


def response_object() -> Schema:
    status = {"enum": ["completed", "incomplete", "in_progress"]}
    output_text = obj(
        {"type": const("output_text"), "text": STRING, "annotations": array(obj({})), "logprobs": array(obj({}))},
        ("type", "text", "annotations"),
    )
    item = {
        "oneOf": [
            obj(
                {
                    "type": const("message"),
                    "id": STRING,
                    "role": const("assistant"),
                    "status": status,
                    "content": array(output_text),
                },
                ("type", "id", "role", "status", "content"),
            ),
            obj(
                {
                    "type": const("reasoning"),
                    "id": STRING,
                    "summary": array(obj({})),
                    "status": status,
                    "content": array(obj({"type": const("reasoning_text"), "text": STRING}, ("type", "text"))),
                },
                ("type", "id", "summary"),
            ),
            obj(
                {
                    "type": const("function_call"),
                    "id": STRING,
                    "call_id": STRING,
                    "name": STRING,
                    "arguments": STRING,
                    "status": status,
                },
                ("type", "call_id", "name", "arguments"),
            ),
        ]
    }
    usage = obj(
        {
            "input_tokens": INTEGER,
            "input_tokens_details": obj({"cached_tokens": INTEGER}, ("cached_tokens",)),
            "output_tokens": INTEGER,
            "output_tokens_details": obj({"reasoning_tokens": INTEGER}, ("reasoning_tokens",)),
            "total_tokens": INTEGER,
        },
        ("input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"),
    )
    return obj(
        {
            "id": {"type": "string", "pattern": "^resp_"},
            "object": const("response"),
            "created_at": INTEGER,
            "status": status,
            "incomplete_details": nullable(obj({"reason": const("max_output_tokens")}, ("reason",))),
            "error": {"type": "null"},
            "model": STRING,
            "output": array(item),
            "instructions": nullable(STRING),
            "max_output_tokens": nullable(INTEGER),
            "parallel_tool_calls": BOOLEAN,
            "temperature": NUMBER,
            "top_p": NUMBER,
            "tool_choice": {},
            "tools": array(obj({})),
            "text": obj({}),
            "reasoning": obj({}),
            "usage": usage,
            "metadata": obj({}),
        },
        (
            "id",
            "object",
            "created_at",
            "status",
            "model",
            "output",
            "parallel_tool_calls",
            "tool_choice",
            "tools",
            "usage",
        ),
    )
