"""Reading request bodies: typed field getters that answer 400 naming the field, and the sampling
fields OpenAI-style APIs share (chat, completions, LM Studio) mapped onto SamplingParams names."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import bad_request

_NUMBER = (int, float)


def json_body(request) -> dict:
    raw = request.body or b"null"
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"the body is not valid JSON: {error}") from error
    except RecursionError:
        raise bad_request("the body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    if b"\\u" in raw and b"\\ud" in raw.lower():  # only an escape can smuggle in a lone surrogate
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # the tokenizer and templates need real text
            raise bad_request(
                "the body contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff): not valid Unicode text"
            ) from None
    return body


def _type_name(types) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
    types = types if isinstance(types, tuple) else (types,)
    if float in types:
        return "a number"
    return " or ".join(names.get(t, t.__name__) for t in types)


def get_optional(body: dict, key: str, types, param: str | None = None) -> Any:
    """body[key] if present and not null, checked against `types` (bools are never numbers)."""
    value = body.get(key)
    if value is None:
        return None
    types = types if isinstance(types, tuple) else (types,)
    is_bool = isinstance(value, bool)
    if (is_bool and bool not in types) or not isinstance(value, types):
        raise bad_request(f"{key} must be {_type_name(types)}", param or key)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"{key} must be finite", param or key)
    return value


def get_bool(body: dict, key: str, default: bool) -> bool:
    value = get_optional(body, key, bool)
    return default if value is None else value


def get_int(
    body: dict,
    key: str,
    default: int | None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    param: str | None = None,
) -> int | None:
    value = get_optional(body, key, int, param)
    if value is None:
        return default
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise bad_request(f"{key} must be {bounds}, got {value}", param or key)
    return value


def get_str(body: dict, key: str, default: str | None = None) -> str | None:
    value = get_optional(body, key, str)
    return default if value is None else value


def stop_field(body: dict, key: str = "stop") -> tuple[str, ...] | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_request(f"{key} must be a string or an array of strings", key)
    if len(value) > 16:
        raise bad_request(f"{key} takes at most 16 strings", key)
    if any(s == "" for s in value):
        raise bad_request(f"{key} strings must not be empty", key)
    return tuple(value)


def logit_bias_field(body: dict, key: str = "logit_bias") -> dict[int, float] | None:
    value = get_optional(body, key, dict)
    if value is None:
        return None
    bias = {}
    for token, amount in value.items():
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            raise bad_request(f"{key} keys must be token ids, got {token!r}", key) from None
        if isinstance(amount, bool) or not isinstance(amount, _NUMBER) or not math.isfinite(amount):
            raise bad_request(f"{key} values must be numbers", key)
        bias[token_id] = float(amount)
    return bias


def prompt_field(service, prompt: Any, param: str) -> list[int]:
    """A prompt as text (tokenized with the model's BOS rule) or as token ids."""
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt must not be empty", param)
        return service.encode_text(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return service.check_token_ids(prompt, param)
    raise bad_request("prompt must be a non-empty string or an array of token ids", param)


_ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(body: dict, key: str = "messages") -> list[dict]:
    """OpenAI chat messages, checked for shape; content parts of type text are joined (the template
    sees plain strings); other part types are refused by name."""
    messages = body.get(key)
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"{key} must be a non-empty array", key)
    out = []
    for i, message in enumerate(messages):
        where = f"{key}[{i}]"
        if not isinstance(message, dict):
            raise bad_request("each message must be an object", where)
        role = message.get("role")
        if role not in _ROLES:
            raise bad_request(f"role must be one of {', '.join(_ROLES)}", f"{where}.role")
        message = dict(message)
        if role == "developer":
            message["role"] = "system"
        message["content"] = content_text(message.get("content"), f"{where}.content", allow_none=role == "assistant")
        for name in ("tool_call_id", "name"):  # looked up and shown by the template: must be text
            if message.get(name) is not None and not isinstance(message[name], str):
                raise bad_request(f"{name} must be a string", f"{where}.{name}")
        out.append(message)
    return out


def content_text(content: Any, param: str, *, allow_none: bool = False) -> str | None:
    if content is None:
        if allow_none:
            return None
        raise bad_request("content is required", param)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request("content parts must be objects with a type", f"{param}[{j}]")
            if part["type"] not in ("text", "input_text", "output_text"):
                raise bad_request(
                    f"content part type {part['type']!r} is not supported by this text model", f"{param}[{j}].type"
                )
            if not isinstance(part.get("text"), str):
                raise bad_request("a text part needs a string text", f"{param}[{j}].text")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request("content must be a string or an array of content parts", param)


def openai_sampling_fields(
    body: dict, *, max_tokens_keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
) -> dict[str, Any]:
    """The OpenAI sampling fields (plus vLLM's extras) as SamplingParams names; None = omitted."""
    max_tokens = None
    for key in max_tokens_keys:
        value = get_int(body, key, None, minimum=1)
        if value is not None:
            max_tokens = value
            break
    top_k = get_int(body, "top_k", None, minimum=-1)
    return {
        "temperature": get_optional(body, "temperature", _NUMBER),
        "top_p": get_optional(body, "top_p", _NUMBER),
        "top_k": 0 if top_k == -1 else top_k,
        "min_p": get_optional(body, "min_p", _NUMBER),
        "presence_penalty": get_optional(body, "presence_penalty", _NUMBER),
        "frequency_penalty": get_optional(body, "frequency_penalty", _NUMBER),
        "repetition_penalty": get_optional(body, "repetition_penalty", _NUMBER),
        "logit_bias": logit_bias_field(body),
        "seed": get_optional(body, "seed", int),
        "max_tokens": max_tokens,
        "min_tokens": get_int(body, "min_tokens", None, minimum=0),
        "stop": stop_field(body),
        "stop_token_ids": _int_list(body, "stop_token_ids"),
        "ignore_eos": get_optional(body, "ignore_eos", bool),
        "n": get_int(body, "n", None, minimum=1),
        "include_stop_str_in_output": get_optional(body, "include_stop_str_in_output", bool),
        "skip_special_tokens": get_optional(body, "skip_special_tokens", bool),
    }


def _int_list(body: dict, key: str) -> tuple[int, ...] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise bad_request(f"{key} must be an array of integers", key)
    return tuple(value)
