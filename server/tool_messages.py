"""Tool turns of a conversation, in the form chat templates expect.

Templates (Qwen2.5's among them) render a past call with `{{ tool_call.arguments | tojson }}`, so
arguments must be an object: OpenAI clients send them as a JSON string, which would otherwise be
rendered as a quoted string. Tool results are `role: "tool"` messages with string content.

- `messages_for_template`: OpenAI or Ollama chat messages (content already plain text) -> the same
  messages with each tool call as `{"id", "type": "function", "function": {"name", "arguments": dict}}`
  and each tool message carrying the `name` of the call it answers (some templates show it).
- `anthropic_messages_to_openai`: Anthropic `system` + `messages` (text, tool_use, tool_result and
  thinking blocks) -> OpenAI-style messages, ready for `messages_for_template`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ember.server.tools import ToolError


def _arguments_object(arguments: Any, param: str) -> Any:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            raise ToolError("tool call arguments must be a JSON object (as a string)", param) from None
        if isinstance(value, dict):
            return value
    raise ToolError("tool call arguments must be a JSON object", param)


def messages_for_template(messages: Sequence[dict[str, Any]], *, param: str = "messages") -> list[dict[str, Any]]:
    """Normalise the tool-related parts of OpenAI/Ollama chat messages for the chat template."""
    out: list[dict[str, Any]] = []
    names_by_id: dict[str, str] = {}
    last_call_names: list[str] = []  # Ollama tool messages may not say which call they answer
    tool_replies_seen = 0
    for i, message in enumerate(messages):
        message = dict(message)
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                raise ToolError("tool_calls must be an array", f"{param}[{i}].tool_calls")
            message["tool_calls"] = [
                _template_call(call, f"{param}[{i}].tool_calls[{j}]") for j, call in enumerate(calls)
            ]
            last_call_names = [call["function"]["name"] for call in message["tool_calls"]]
            names_by_id.update(
                (c["id"], c["function"]["name"]) for c in message["tool_calls"] if isinstance(c.get("id"), str)
            )
            tool_replies_seen = 0
        elif role == "tool":
            if "name" not in message:
                call_id = message.get("tool_call_id")
                name = message.get("tool_name") or (names_by_id.get(call_id) if isinstance(call_id, str) else None)
                if name is None and tool_replies_seen < len(last_call_names):
                    name = last_call_names[tool_replies_seen]  # answers come in the order of the calls
                if name is not None:
                    message["name"] = name
            if message.get("content") is None:
                message["content"] = ""
            tool_replies_seen += 1
        out.append(message)
    return out


def _template_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise ToolError("each tool call must be an object", where)
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ToolError("a tool call needs function.name", f"{where}.function.name")
    normalised = {
        "type": "function",
        "function": {
            "name": function["name"],
            "arguments": _arguments_object(function.get("arguments"), f"{where}.function.arguments"),
        },
    }
    if isinstance(call.get("id"), str):
        normalised["id"] = call["id"]
    return normalised


# ---- Anthropic ------------------------------------------------------------------------------


def _text_of(content: Any, param: str) -> str:
    """Text of a string or of a list of text blocks (tool_result content, system)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise ToolError("content must be a string or an array of content blocks", param)
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ToolError("only text blocks are supported here", f"{param}[{j}]")
        texts.append(block["text"])
    return "".join(texts)


def anthropic_messages_to_openai(messages: Any, system: Any = None, *, param: str = "messages") -> list[dict[str, Any]]:
    """Anthropic Messages API conversation -> OpenAI-style chat messages (tool calls with dict
    arguments, results as `role: "tool"`). A user turn's tool_result blocks become tool messages
    placed before the rest of that turn's text; an assistant's thinking blocks become
    `reasoning_content` (templates that show past reasoning read that key)."""
    if not isinstance(messages, list) or not messages:
        raise ToolError("messages must be a non-empty array", param)
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ToolError("each message must be an object with role 'user' or 'assistant'", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out.extend(_anthropic_turn(message["role"], content, f"{where}.content"))
        else:
            raise ToolError("content must be a string or an array of content blocks", f"{where}.content")
    return out


def _anthropic_turn(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise ToolError("a tool_use block needs an id and a name", here)
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": _arguments_object(block.get("input"), f"{here}.input"),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise ToolError("a tool_result block needs a tool_use_id", f"{here}.tool_use_id")
            text = _text_of(block.get("content"), f"{here}.content")
            if block.get("is_error") is True:
                text = f"Error: {text}"  # the template has no error flag: say it in words
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        else:
            raise ToolError(f"content block type {kind!r} is not supported in a {role} message", f"{here}.type")
    if role == "user":
        return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return [message]
