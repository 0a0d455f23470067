"""JSON Schemas of Ember's own routes (`/v1/tokenize`, `/v1/detokenize`, `/v1/score`), used by `openapi.py`."""

from __future__ import annotations

from ..runtime.sampling.params import MAX_TOP_LOGPROBS, PENALTY_LIMIT
from .openapi_schemas import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING,
    Schema,
    array,
    const,
    integer,
    model_field,
    obj,
    ref,
    sampling_properties,
)


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
