"""JSON Schemas (OpenAPI 3.1 = JSON Schema 2020-12) of the bodies the OpenAI-style and Ember routes read
and write, used by `openapi.py`.

Request schemas list only the fields the server reads, and their bounds are the server's own checks
(request_fields.py, SamplingParams.validate, the tokenizer's vocabulary, the context length); where the
server has no bound (temperature, seed) the schema has none either. Unknown fields are ignored by the
server, so no schema says additionalProperties: false.
"""

from __future__ import annotations

from typing import Any

from ..runtime.sampling.params import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    PENALTY_LIMIT,
)

Schema = dict[str, Any]
STRING: Schema = {"type": "string"}
BOOLEAN: Schema = {"type": "boolean"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    return schema


def array(items: Schema, **extra) -> Schema:
    return {"type": "array", "items": items, **extra}


def integer(minimum: int | None = None, maximum: int | None = None, **extra) -> Schema:
    schema: Schema = {"type": "integer", **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def const(value: str) -> Schema:
    return {"type": "string", "const": value}


# ---- shared request pieces -------------------------------------------------------------------------


def sampling_properties(vocab: int, context: int) -> dict[str, Schema]:
    """The sampling fields chat and completions share (OpenAI's plus vLLM's extras)."""
    token_id = integer(0, vocab - 1)
    return {
        "temperature": {"type": "number", "minimum": 0, "description": "0 = greedy; the server has no upper bound"},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": integer(-1, description="0 or -1 = off"),
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "presence_penalty": {"type": "number", "minimum": -PENALTY_LIMIT, "maximum": PENALTY_LIMIT},
        "frequency_penalty": {"type": "number", "minimum": -PENALTY_LIMIT, "maximum": PENALTY_LIMIT},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
        "logit_bias": {
            "type": "object",
            "maxProperties": MAX_LOGIT_BIAS,
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT, "maximum": LOGIT_BIAS_LIMIT},
            "description": f"token id (in [0, {vocab})) -> bias added to its logit",
        },
        "seed": integer(description="taken modulo 2**32"),
        "min_tokens": integer(0, description="must not exceed max_tokens"),
        "stop": {"anyOf": [{"type": "string", "minLength": 1}, array({"type": "string", "minLength": 1}, maxItems=16)]},
        "stop_token_ids": array(token_id, maxItems=MAX_STOP_TOKEN_IDS),
        "ignore_eos": BOOLEAN,
        "n": integer(1, MAX_N),
        "include_stop_str_in_output": BOOLEAN,
        "skip_special_tokens": BOOLEAN,
        "stream": BOOLEAN,
        "stream_options": obj({"include_usage": BOOLEAN}),
    }


def max_tokens_schema(context: int) -> Schema:
    return integer(
        1,
        context - 1,
        description=f"at most the context ({context} tokens) minus the prompt; "
        "absent: until the model stops, up to the server's cap",
    )


TEXT_PART = obj({"type": {"enum": ["text", "input_text", "output_text"]}, "text": STRING}, ("type", "text"))
CONTENT = {"anyOf": [STRING, array(TEXT_PART)]}
TOOL_NAME = {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}
JSON_SCHEMA_OBJECT = {"type": "object", "description": "a JSON Schema"}


def chat_message() -> Schema:
    call = obj(
        {
            "id": STRING,
            "type": const("function"),
            "function": obj(
                {"name": TOOL_NAME, "arguments": {"type": "string", "description": "a JSON object as text"}},
                ("name", "arguments"),
            ),
        },
        ("function",),
    )
    return {
        "oneOf": [
            obj(
                {"role": {"enum": ["system", "developer", "user"]}, "content": CONTENT, "name": STRING},
                ("role", "content"),
            ),
            obj({"role": const("assistant"), "content": nullable(CONTENT), "tool_calls": array(call)}, ("role",)),
            obj({"role": const("tool"), "content": CONTENT, "tool_call_id": STRING}, ("role", "content")),
        ]
    }


def chat_tool() -> Schema:
    return obj(
        {
            "type": const("function"),
            "function": obj(
                {"name": TOOL_NAME, "description": STRING, "parameters": JSON_SCHEMA_OBJECT, "strict": BOOLEAN},
                ("name",),
            ),
        },
        ("type", "function"),
    )


def chat_request(model: str, vocab: int, context: int) -> Schema:
    response_format = {
        "oneOf": [
            obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
            obj(
                {
                    "type": const("json_schema"),
                    "json_schema": obj(
                        {"name": STRING, "description": STRING, "schema": JSON_SCHEMA_OBJECT, "strict": BOOLEAN},
                        ("name",),
                    ),
                },
                ("type", "json_schema"),
            ),
        ]
    }
    tool_choice = {
        "anyOf": [
            {"enum": ["auto", "none", "required"]},
            obj({"type": const("function"), "function": obj({"name": TOOL_NAME}, ("name",))}, ("type", "function")),
        ]
    }
    return obj(
        {
            "model": model_field(model),
            "messages": array(ref("ChatMessage"), minItems=1),
            "max_completion_tokens": max_tokens_schema(context),
            "max_tokens": max_tokens_schema(context),
            **sampling_properties(vocab, context),
            "logprobs": BOOLEAN,
            "top_logprobs": integer(0, MAX_TOP_LOGPROBS, description="needs logprobs: true"),
            "tools": array(ref("ChatTool")),
            "tool_choice": tool_choice,
            "parallel_tool_calls": BOOLEAN,
            "response_format": response_format,
            "prediction": obj(
                {
                    "type": const("content"),
                    "content": {
                        "anyOf": [STRING, array(obj({"type": const("text"), "text": STRING}, ("type", "text")))]
                    },
                },
                ("type", "content"),
                description="Predicted Outputs: the expected output, a draft source when the server speculates",
            ),
            "chat_template_kwargs": {"type": "object", "description": "extra variables for the chat template"},
            "enable_thinking": BOOLEAN,
            "reasoning_effort": {
                "enum": ["none", "minimal", "low", "medium", "high", "xhigh"],
                "description": "the template's enable_thinking: none and minimal turn it off, the others on",
            },
        },
        ("messages",),
    )


def completion_request(model: str, vocab: int, context: int) -> Schema:
    ids = array(integer(0, vocab - 1), minItems=1)
    return obj(
        {
            "model": model_field(model),
            "prompt": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    ids,
                    array({"anyOf": [{"type": "string", "minLength": 1}, ids]}, minItems=1, maxItems=1),
                ],
                "description": "text, token ids, or a batch of exactly one of those",
            },
            "max_tokens": max_tokens_schema(context),
            **sampling_properties(vocab, context),
            "echo": BOOLEAN,
            "logprobs": integer(0, MAX_TOP_LOGPROBS, description="alternatives per token"),
            "best_of": integer(1, description="must equal n"),
            "suffix": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "fill-in-the-middle: the text after the hole (prompt, a string, is the text before it); "
                "400 when the served model has no FIM tokens",
            },
        },
        ("prompt",),
    )


def model_field(model: str) -> Schema:
    return {"type": "string", "enum": [model], "description": "the served model (absent: the served model)"}


# ---- responses -------------------------------------------------------------------------------------


ERROR = obj(
    {
        "error": obj(
            {"message": STRING, "type": STRING, "param": nullable(STRING), "code": nullable(STRING)},
            ("message", "type", "param", "code"),
        )
    },
    ("error",),
)
USAGE = obj(
    {
        "prompt_tokens": INTEGER,
        "completion_tokens": INTEGER,
        "total_tokens": INTEGER,
        "prompt_tokens_details": obj({"cached_tokens": INTEGER}, ("cached_tokens",)),
        "completion_tokens_details": obj(
            {"accepted_prediction_tokens": INTEGER, "rejected_prediction_tokens": INTEGER},
            ("accepted_prediction_tokens", "rejected_prediction_tokens"),
        ),
    },
    ("prompt_tokens", "completion_tokens", "total_tokens"),
)
FINISH_REASON = nullable({"enum": ["stop", "length", "tool_calls", "abort"]})
STOP_REASON = {"anyOf": [STRING, INTEGER, {"type": "null"}]}


def chat_completion() -> Schema:
    top = obj({"token": STRING, "logprob": NUMBER, "bytes": array(INTEGER)}, ("token", "logprob"))
    logprobs = nullable(
        obj(
            {
                "content": array(
                    obj({**top["properties"], "top_logprobs": array(top)}, ("token", "logprob", "top_logprobs"))
                )
            },
            ("content",),
        )
    )
    tool_call = obj(
        {
            "id": STRING,
            "type": const("function"),
            "function": obj({"name": STRING, "arguments": STRING}, ("name", "arguments")),
        },
        ("id", "type", "function"),
    )
    message = obj(
        {
            "role": const("assistant"),
            "content": nullable(STRING),
            "reasoning_content": STRING,
            "reasoning": STRING,
            "tool_calls": array(tool_call),
        },
        ("role", "content"),
    )
    choice = obj(
        {
            "index": INTEGER,
            "message": message,
            "finish_reason": FINISH_REASON,
            "logprobs": logprobs,
            "stop_reason": STOP_REASON,
        },
        ("index", "message", "finish_reason", "logprobs"),
    )
    return obj(
        {
            "id": STRING,
            "object": const("chat.completion"),
            "created": INTEGER,
            "model": STRING,
            "choices": array(choice),
            "usage": USAGE,
            "system_fingerprint": STRING,
        },
        ("id", "object", "created", "model", "choices", "usage"),
    )


def completion() -> Schema:
    logprobs = nullable(
        obj(
            {
                "tokens": array(STRING),
                "token_logprobs": array(NUMBER),
                "top_logprobs": array({"type": "object", "additionalProperties": NUMBER}),
                "text_offset": array(INTEGER),
            },
            ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
        )
    )
    choice = obj(
        {
            "index": INTEGER,
            "text": STRING,
            "finish_reason": FINISH_REASON,
            "logprobs": logprobs,
            "stop_reason": STOP_REASON,
        },
        ("index", "text", "finish_reason", "logprobs"),
    )
    return obj(
        {
            "id": STRING,
            "object": const("text_completion"),
            "created": INTEGER,
            "model": STRING,
            "choices": array(choice),
            "usage": USAGE,
            "system_fingerprint": STRING,
        },
        ("id", "object", "created", "model", "choices", "usage"),
    )


def model_card() -> Schema:
    return obj(
        {
            "id": STRING,
            "object": const("model"),
            "created": INTEGER,
            "owned_by": STRING,
            "max_model_len": INTEGER,
            "context_length": INTEGER,
        },
        ("id", "object", "created", "owned_by"),
    )
