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
            "chat_template_kwargs": {"type": "object", "description": "extra variables for the chat template"},
            "enable_thinking": BOOLEAN,
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
                "anyOf": [{"type": "string", "maxLength": 0}, {"type": "null"}],
                "description": "fill-in-the-middle is not supported",
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


# ---- /v1/responses ---------------------------------------------------------------------------------


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
            "store": {"type": "boolean", "description": "accepted; nothing is stored (the server is stateless)"},
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


# ---- Ember's own routes ----------------------------------------------------------------------------


def tokenize_request(model: str) -> Schema:
    return {
        "anyOf": [
            obj(
                {
                    "model": model_field(model),
                    "prompt": STRING,
                    "add_special_tokens": BOOLEAN,
                    "return_token_strs": BOOLEAN,
                },
                ("prompt",),
            ),
            obj(
                {
                    "model": model_field(model),
                    "messages": array(ref("ChatMessage"), minItems=1),
                    "add_generation_prompt": BOOLEAN,
                    "return_token_strs": BOOLEAN,
                },
                ("messages",),
            ),
        ]
    }


def detokenize_request(model: str, vocab: int) -> Schema:
    return obj({"model": model_field(model), "tokens": array(integer(0, vocab - 1), minItems=1)}, ("tokens",))


def score_request(model: str, vocab: int) -> Schema:
    ids = array(integer(0, vocab - 1), minItems=1)
    common = {
        "model": model_field(model),
        "completion": {
            "anyOf": [{"type": "string", "minLength": 1}, ids],
            "description": "the text (or token ids) whose logprobs are wanted, one forced decode step per token",
        },
        "top_logprobs": integer(0, MAX_TOP_LOGPROBS),
        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
        "presence_penalty": {"type": "number", "minimum": -PENALTY_LIMIT, "maximum": PENALTY_LIMIT},
        "frequency_penalty": {"type": "number", "minimum": -PENALTY_LIMIT, "maximum": PENALTY_LIMIT},
        "logit_bias": sampling_properties(vocab, 0)["logit_bias"],
    }
    return {
        "anyOf": [
            obj({**common, "prompt": {"anyOf": [{"type": "string", "minLength": 1}, ids]}}, ("prompt", "completion")),
            obj({**common, "messages": array(ref("ChatMessage"), minItems=1)}, ("messages", "completion")),
        ]
    }


def score_response() -> Schema:
    alt = obj({"token_id": INTEGER, "token": STRING, "logprob": NUMBER}, ("token_id", "token", "logprob"))
    token = obj({**alt["properties"], "top_logprobs": array(alt)}, ("token_id", "token", "logprob", "top_logprobs"))
    return obj(
        {
            "object": const("score"),
            "model": STRING,
            "tokens": array(token),
            "total_logprob": NUMBER,
            "usage": obj(
                {"prompt_tokens": INTEGER, "completion_tokens": INTEGER}, ("prompt_tokens", "completion_tokens")
            ),
        },
        ("object", "model", "tokens", "total_logprob", "usage"),
    )
