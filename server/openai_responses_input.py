"""OpenAI Responses request → the OpenAI chat body `prepare_chat` takes, so the Responses API shares the
one chat path (template, tools, grammars, reasoning) instead of growing a second one.

    input (string | items)        → messages (message items; function_call → assistant tool_calls;
                                    function_call_output → tool messages; reasoning items dropped)
    instructions                  → a system message in front
    max_output_tokens             → max_completion_tokens
    tools [{type: function, name, description, parameters, strict}] → [{type: function, function: {...}}]
    tool_choice {type: function, name} / {type: allowed_tools, mode, tools} → chat tool_choice (+ tools kept)
    text.format                   → response_format
    reasoning.effort              → reasoning_effort (summary ignored: there is no summariser)

`previous_response_id`'s stored items (server/response_store.py) go before the input; `conversation`,
`item_reference` input items and `background` are refused (400 naming the field).
Errors the chat path raises name chat fields (`messages[3].content`); `responses_param` maps them
back to the Responses field the client sent (`input[2].content`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request
from .request_fields import get_bool, get_int, get_optional, get_str
from .tools import make_tool_spec

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass
class ResponsesRequest:
    """A checked Responses body: the chat body to run, plus what the response object echoes back."""

    chat_body: dict
    stream: bool
    echo: dict  # instructions, max_output_tokens, tools, tool_choice, text, reasoning, ... as the client sent
    sources: list[str] = field(default_factory=list)  # chat message k came from this Responses field
    call_sources: dict[int, list[str]] = field(default_factory=dict)  # message k's tool_calls[j] came from

    def responses_param(self, param: str | None) -> str | None:
        """A chat field path in an error → the Responses field it came from."""
        if not param:
            return param
        match = re.match(r"^messages\[(\d+)\](?:\.tool_calls\[(\d+)\])?(.*)$", param)
        if match:
            k = int(match.group(1))
            if k >= len(self.sources):
                return "input"
            if match.group(2) is not None and k in self.call_sources:
                j = int(match.group(2))
                calls = self.call_sources[k]
                return calls[j] + _call_suffix(match.group(3)) if j < len(calls) else self.sources[k]
            source = self.sources[k]
            if not source.startswith("input["):  # instructions, or input as one string
                return source
            return source + (match.group(3) if match.group(2) is None else "")
        for chat, ours in (
            ("messages", "input"),
            ("max_completion_tokens", "max_output_tokens"),
            ("response_format.json_schema", "text.format"),
            ("response_format", "text.format"),
            ("reasoning_effort", "reasoning.effort"),
            ("tool_choice.function", "tool_choice"),
        ):
            if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
                return ours + param[len(chat) :]
        match = re.match(r"^tools\[(\d+)\]\.function(.*)$", param)
        if match:
            return f"tools[{match.group(1)}]{match.group(2)}"
        return param


def _call_suffix(suffix: str) -> str:
    """`.function.arguments` of a chat tool call is `.arguments` of a function_call item."""
    return suffix.removeprefix(".function")


def parse_responses_request(body: dict, previous_items: list[dict] | None = None) -> ResponsesRequest:
    """`previous_items`: the stored conversation `previous_response_id` names (it goes before `input`)."""
    if body.get("conversation") is not None:
        raise bad_request(
            "conversation is not supported: conversations are not stored; "
            "send previous_response_id or the whole conversation in input",
            "conversation",
        )
    if get_bool(body, "background", False):
        raise bad_request("background responses are not supported (nothing is stored to poll)", "background")
    if body.get("prompt") is not None:
        raise bad_request("prompt templates are not supported; send instructions and input", "prompt")
    if get_str(body, "truncation", "disabled") not in ("disabled", "auto"):
        raise bad_request("truncation must be 'auto' or 'disabled'", "truncation")
    if body.get("truncation") == "auto":
        raise bad_request("truncation 'auto' is not supported: input items are never dropped", "truncation")
    if get_int(body, "top_logprobs", 0, minimum=0, maximum=20):
        raise bad_request("logprobs are not supported on /v1/responses (use /v1/chat/completions)", "top_logprobs")
    include = get_optional(body, "include", list) or []
    if not all(isinstance(x, str) for x in include):
        raise bad_request("include must be an array of strings", "include")
    if "message.output_text.logprobs" in include:
        raise bad_request("logprobs are not supported on /v1/responses (use /v1/chat/completions)", "include")
    metadata = _metadata(body)
    instructions = get_optional(body, "instructions", str)
    max_output_tokens = get_int(body, "max_output_tokens", None, minimum=1)
    request = ResponsesRequest(chat_body={}, stream=get_bool(body, "stream", False), echo={})
    messages = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
        request.sources.append("instructions")
    if previous_items:
        earlier = _input_messages(previous_items, ResponsesRequest(chat_body={}, stream=False, echo={}))
        messages += earlier
        request.sources += ["previous_response_id"] * len(earlier)
    messages += _input_messages(body.get("input"), request)
    tools, choice = _tools(body)
    response_format, text = _text_format(body)
    effort = _reasoning(body)
    chat = {
        "model": body.get("model"),
        "messages": messages,
        "max_completion_tokens": max_output_tokens,
        "temperature": get_optional(body, "temperature", (int, float)),
        "top_p": get_optional(body, "top_p", (int, float)),
        "tools": tools or None,
        "tool_choice": choice,
        "parallel_tool_calls": get_optional(body, "parallel_tool_calls", bool),
        "response_format": response_format,
        "reasoning_effort": effort,
    }
    request.chat_body = {k: v for k, v in chat.items() if v is not None}
    request.echo = {
        "instructions": instructions,
        "max_output_tokens": max_output_tokens,
        "parallel_tool_calls": get_bool(body, "parallel_tool_calls", True),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "text": text,
        "reasoning": {"effort": effort, "summary": None},
        "metadata": metadata,
        "user": get_optional(body, "user", str),
        "previous_response_id": body.get("previous_response_id"),
        "store": get_bool(body, "store", True),
    }
    return request


def _metadata(body: dict) -> dict:
    metadata = get_optional(body, "metadata", dict) or {}
    if len(metadata) > 16 or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise bad_request("metadata must be an object of at most 16 string values", "metadata")
    return metadata


# ---- input items --------------------------------------------------------------------------------


def _input_messages(raw: Any, request: ResponsesRequest) -> list[dict]:
    if isinstance(raw, str):
        request.sources.append("input")
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad_request("input must be a string or a non-empty array of input items", "input")
    messages: list[dict] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request("each input item must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise bad_request(f"role must be one of {', '.join(_MESSAGE_ROLES)}", f"{where}.role")
            messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
            request.sources.append(where)
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # calls after a reply: one assistant turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                request.sources.append(where)
            # sources has one entry per chat message so far (instructions included): the last is this one
            request.call_sources.setdefault(len(request.sources) - 1, []).append(where)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request("a function_call_output needs the call_id of its call", f"{where}.call_id")
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _content(item.get("output"), f"{where}.output")}
            )
            request.sources.append(where)
        elif kind == "reasoning":
            continue  # past reasoning: chat templates drop it from history anyway
        elif kind == "item_reference":
            raise bad_request(
                "item_reference is not supported (send previous_response_id, or the items themselves)", f"{where}.type"
            )
        else:
            raise bad_request(
                f"input item type {kind!r} is not supported (message, function_call, "
                f"function_call_output and reasoning are)",
                f"{where}.type",
            )
    if not messages:
        raise bad_request("input has no messages", "input")
    return messages


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or an array of content parts", param)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request("content parts must be objects with a type", f"{param}[{j}]")
        key = "refusal" if part["type"] == "refusal" else "text"
        if part["type"] not in (*_TEXT_PARTS, "refusal"):
            raise bad_request(
                f"content part type {part['type']!r} is not supported by this text model", f"{param}[{j}].type"
            )
        if not isinstance(part.get(key), str):
            raise bad_request(f"a {part['type']} part needs a string {key}", f"{param}[{j}].{key}")
        texts.append(part[key])
    return "".join(texts)


def _function_call(item: dict, where: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"a function_call item needs a string {key}", f"{where}.{key}")
    try:
        arguments = json.loads(item["arguments"]) if item["arguments"] else {}
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be a JSON object (as a string)", f"{where}.arguments")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"] or "{}"},
    }


# ---- tools, text.format, reasoning ---------------------------------------------------------------


def _tools(body: dict) -> tuple[list[dict], Any]:
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise bad_request("tools must be an array", "tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request("each tool must be an object", where)
        if tool.get("type") != "function":
            raise bad_request(
                f"tool type {tool.get('type')!r} is not supported; only function tools are "
                f"(hosted tools need OpenAI's servers)",
                f"{where}.type",
            )
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise bad_request("strict must be a boolean", f"{where}.strict")
        make_tool_spec(
            tool.get("name"), tool.get("description"), tool.get("parameters"), where, schema_key="parameters"
        )  # checked here so errors name the Responses fields
        function = {
            key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None
        }
        tools.append({"type": "function", "function": function})
    return tools, _tool_choice(body.get("tool_choice"), tools)


def _tool_choice(raw: Any, tools: list[dict]) -> Any:
    if raw is None or isinstance(raw, str):
        return raw  # "auto" | "none" | "required": the chat path checks the value
    if not isinstance(raw, dict):
        raise bad_request("tool_choice must be a string or an object", "tool_choice")
    kind = raw.get("type")
    if kind == "function":
        if not isinstance(raw.get("name"), str):
            raise bad_request("tool_choice of type function needs a name", "tool_choice.name")
        if all(t["function"]["name"] != raw["name"] for t in tools):
            raise bad_request(f"tool_choice names {raw['name']!r}, which is not among the tools", "tool_choice.name")
        return {"type": "function", "function": {"name": raw["name"]}}
    if kind == "allowed_tools":
        mode, allowed = raw.get("mode"), raw.get("tools")
        if mode not in ("auto", "required"):
            raise bad_request("allowed_tools mode must be 'auto' or 'required'", "tool_choice.mode")
        if not isinstance(allowed, list) or not all(isinstance(t, dict) for t in allowed):
            raise bad_request("allowed_tools needs an array of tools", "tool_choice.tools")
        names = {t.get("name") for t in allowed}
        unknown = names - {t["function"]["name"] for t in tools}
        if unknown or any(t.get("type") != "function" for t in allowed):
            raise bad_request("allowed_tools may only name function tools given in tools", "tool_choice.tools")
        tools[:] = [t for t in tools if t["function"]["name"] in names]  # the others may not be called
        return mode
    raise bad_request(
        "tool_choice must be 'auto', 'none', 'required', a function or allowed_tools",
        "tool_choice.type" if "type" in raw else "tool_choice",
    )


def _text_format(body: dict) -> tuple[dict | None, dict]:
    text = get_optional(body, "text", dict) or {}
    fmt = text.get("format")
    if fmt is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}, {"format": {"type": kind}}
    if kind != "json_schema":
        raise bad_request("text.format.type must be 'text', 'json_object' or 'json_schema'", "text.format.type")
    if not isinstance(fmt.get("name"), str):
        raise bad_request("a json_schema format needs a name", "text.format.name")
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request("a json_schema format needs a schema object", "text.format.schema")
    if fmt.get("strict") is not None and not isinstance(fmt["strict"], bool):
        raise bad_request("strict must be a boolean", "text.format.strict")
    schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": schema}, {"format": {"type": "json_schema", **schema}}


def _reasoning(body: dict) -> str | None:
    reasoning = get_optional(body, "reasoning", dict) or {}
    effort = reasoning.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(_EFFORTS)}", "reasoning.effort")
    summary = reasoning.get("summary")
    if summary is not None and summary not in ("auto", "concise", "detailed"):
        raise bad_request("reasoning.summary must be 'auto', 'concise' or 'detailed'", "reasoning.summary")
    return effort


def remap_error(error: ApiError, request: ResponsesRequest) -> ApiError:
    error.param = request.responses_param(error.param)
    return error
