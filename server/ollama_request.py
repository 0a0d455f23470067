"""Ollama requests and replies in the one chat path's terms: `options` → OpenAI sampling fields,
`format` → `response_format`, `think` → the template's `enable_thinking`, messages and tools → OpenAI's
shape; and the pieces of a reply (timestamps, the closing counts and nanosecond durations, tool calls
with arguments as objects, the immediate answer to a "load" call)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sanic import response

from ..runtime.sampling.params import SamplingParams
from .errors import bad_request
from .ollama_models import thinks
from .request_fields import get_bool, get_int, get_optional

_NUMBER = (int, float)
# Ollama option -> OpenAI chat field, for the sampling options Ember applies. Other documented options
# (num_ctx, num_keep, repeat_last_n, typical_p, tfs_z, mirostat*, penalize_newline, num_batch, num_gpu,
# num_thread, use_mmap, ...) are accepted and ignored, as Ollama ignores options a runner lacks.
_SAMPLING_OPTIONS = (
    ("temperature", "temperature", _NUMBER),
    ("top_p", "top_p", _NUMBER),
    ("min_p", "min_p", _NUMBER),
    ("seed", "seed", int),
    ("presence_penalty", "presence_penalty", _NUMBER),
    ("frequency_penalty", "frequency_penalty", _NUMBER),
    ("repeat_penalty", "repetition_penalty", _NUMBER),
)


# ---- request translation ------------------------------------------------------------------------


def openai_fields(body: dict) -> dict[str, Any]:
    """Ollama's `options`, `format`, `logprobs` → the fields of an OpenAI chat body."""
    options = get_optional(body, "options", dict) or {}
    out: dict[str, Any] = {}
    for key, openai_key, types in _SAMPLING_OPTIONS:
        value = get_optional(options, key, types, f"options.{key}")
        if value is not None:
            out[openai_key] = value
    top_k = get_optional(options, "top_k", int, "options.top_k")
    if top_k is not None:
        out["top_k"] = max(top_k, 0)  # llama.cpp: k <= 0 keeps the whole vocabulary
    num_predict = get_optional(options, "num_predict", int, "options.num_predict")
    if num_predict is not None and num_predict > 0:  # -1 (until a stop), -2 (fill the context): no limit
        out["max_tokens"] = num_predict
    get_optional(options, "num_ctx", int, "options.num_ctx")  # checked, then ignored (see the docstring)
    stop = options.get("stop")
    if stop is not None:
        if isinstance(stop, list) and not stop:
            stop = None
        out["stop"] = stop
    format_ = body.get("format")
    if format_ == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(format_, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "ollama", "schema": format_}}
    elif format_ not in (None, ""):
        raise bad_request('format must be "json" or a JSON schema object', "format")
    if get_bool(body, "logprobs", False):
        out["logprobs"] = True
        out["top_logprobs"] = get_int(body, "top_logprobs", 0, minimum=0, maximum=20)
    return out


def template_kwargs(service, body: dict, model: str) -> dict[str, Any]:
    think = get_optional(body, "think", (bool, str))
    if think is None:
        return {}
    if isinstance(think, str) and think not in ("low", "medium", "high"):
        raise bad_request('think must be a boolean or one of "low", "medium", "high"', "think")
    if think and not thinks(service):
        raise bad_request(f'"{model}" does not support thinking', "think")  # Ollama's answer too
    return {"enable_thinking": bool(think)}  # a level still means "think"


def ollama_messages(raw: Any) -> list[dict]:
    """Ollama messages → OpenAI ones: images refused, `thinking` kept for templates that show it."""
    if not isinstance(raw, list):
        raise bad_request("messages must be an array", "messages")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise bad_request("each message must be an object", f"messages[{i}]")
        if message.get("images"):
            raise bad_request("images are not supported: the served model reads text only", f"messages[{i}].images")
        message = {k: v for k, v in message.items() if k not in ("images", "thinking")}
        if raw[i].get("thinking") and message.get("role") == "assistant":
            message["reasoning_content"] = raw[i]["thinking"]
        if message.get("content") is None and message.get("role") != "assistant":
            message["content"] = ""
        out.append(message)
    return out


def ollama_tools(raw: Any) -> list | None:
    """Ollama's tools have OpenAI's shape; some clients leave out `type`."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request("tools must be an array", "tools")
    return [{"type": "function", **tool} if isinstance(tool, dict) and "type" not in tool else tool for tool in raw]


def fit_to_context(service, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
    """num_predict beyond the context's room stops at the context's end (done_reason "length"), as in
    Ollama, rather than being refused."""
    room = service.context_length - len(prompt_ids)
    if params.max_tokens is not None and room >= 1 and params.max_tokens > room:
        return replace(params, max_tokens=room)
    return params


# ---- responses ----------------------------------------------------------------------------------


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(round(seconds * 1e9)))


def done_fields(usage, reason: str, started: float) -> dict[str, Any]:
    """The closing fields of a reply: counts and integer-nanosecond durations."""
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": _ns(max(time.perf_counter() - started, usage.e2e_s)),
        "load_duration": _ns(usage.queue_s),
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": _ns(usage.ttft_s - usage.queue_s),
        "eval_count": usage.completion_tokens,
        "eval_duration": _ns(usage.decode_s),
    }


def done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


def tool_call(call: dict, index: int) -> dict:
    """An OpenAI tool call (arguments as JSON text) → Ollama's (arguments as an object, no id)."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    return {
        "function": {
            "index": index,
            "name": function.get("name", ""),
            "arguments": arguments if isinstance(arguments, dict) else {},
        }
    }


class ToolCallCollector:
    """Gathers streamed OpenAI tool-call deltas; Ollama sends each call whole, once it is complete."""

    def __init__(self):
        self.calls: dict[int, dict] = {}
        self.sent = 0

    def add(self, deltas: list[dict]) -> None:
        for delta in deltas:
            for part in delta.get("tool_calls") or ():
                call = self.calls.setdefault(
                    part.get("index", len(self.calls)), {"function": {"name": "", "arguments": ""}}
                )
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""

    def ready(self, final: bool) -> list[dict]:
        """Calls complete so far: every one but the last until the stream ends."""
        upto = len(self.calls) if final else max(len(self.calls) - 1, 0)
        out = [tool_call(self.calls[i], i) for i in sorted(self.calls)[self.sent : upto]]
        self.sent = max(self.sent, upto)
        return out


def split_deltas(deltas: list[dict]) -> tuple[str, str]:
    content = "".join(d.get("content") or "" for d in deltas)
    thinking = "".join(d.get("reasoning_content") or d.get("reasoning") or "" for d in deltas)
    return content, thinking


def load_reply(body: dict, model: str, chat: bool):
    """An empty request is Ollama's way to load (or, with keep_alive 0, unload) a model."""
    keep_alive = body.get("keep_alive")
    reason = "unload" if keep_alive in (0, "0", "0s", "0m") else "load"
    reply: dict[str, Any] = {"model": model, "created_at": created_at()}
    reply.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    reply.update({"done": True, "done_reason": reason})
    return response.json(reply)
