"""What a Responses request gives back: output items (reasoning, message, function_call), the response
object, and the streamed event sequence.

A stream is built from the chat path's deltas (`{"content"}`, `{"reasoning_content"}`, `{"tool_calls"}`):
each change of kind closes the open output item and opens the next, so the items a stream announces are
exactly the items of its final response (same ids), as the SDK's stream accumulator checks:

    response.created, response.in_progress
    per item: response.output_item.added
        message:   content_part.added, output_text.delta*, output_text.done, content_part.done
        reasoning: content_part.added, reasoning_text.delta*, reasoning_text.done, content_part.done
        function_call: function_call_arguments.delta*, function_call_arguments.done
    response.output_item.done
    response.completed  (status completed) | response.incomplete (max_output_tokens) | error, response.failed
"""

from __future__ import annotations

import time

from .generation import new_id

INCOMPLETE_REASONS = {"length": "max_output_tokens"}


def message_item(item_id: str, text: str, status: str) -> dict:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [output_text_part(text)],
    }


def output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    # Open-weight reasoning is shown as is (reasoning_text); there is no summariser, so summary is empty.
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(parsed, status: str) -> list[dict]:
    """A whole (non-streamed) reply as output items; the last one is cut short when the reply is."""
    items = []
    if parsed.reasoning is not None:
        items.append(reasoning_item(new_id("rs_"), parsed.reasoning, "completed"))
    if parsed.content or not parsed.tool_calls:
        items.append(message_item(new_id("msg_"), parsed.content or "", "completed"))
    for call in parsed.tool_calls:
        function = call["function"]
        items.append(
            function_call_item(new_id("fc_"), call["id"], function["name"], function["arguments"], "completed")
        )
    if status == "incomplete":
        items[-1]["status"] = "incomplete"
    return items


def usage_object(usage, reasoning_tokens: int = 0) -> dict | None:
    if usage is None:
        return None
    # Ember's prefix cache fills itself: no tokens are written to a cache on request, so cache_write_tokens is 0.
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, usage.completion_tokens)},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_object(
    response_id: str,
    created_at: int,
    model: str,
    echo: dict,
    params,
    *,
    status: str,
    output: list[dict],
    usage: dict | None = None,
    incomplete_reason: str | None = None,
    error: dict | None = None,
) -> dict:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": echo["instructions"],
        "max_output_tokens": echo["max_output_tokens"],
        "model": model,
        "output": output,
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "previous_response_id": echo.get("previous_response_id"),
        "reasoning": echo["reasoning"],
        "store": echo.get("store", False),
        "temperature": params.temperature,
        "text": echo["text"],
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": echo["user"],
        "metadata": echo["metadata"],
    }


class ResponseEventWriter:
    """Chat deltas in, Responses stream events out as (event type, payload) pairs."""

    def __init__(self):
        self.sequence = 0
        self.output: list[dict] = []  # finished items, in output order
        self.reasoning_text = ""
        self._open: dict | None = None  # the item being streamed
        self._text = ""  # its text (message / reasoning) or arguments (function_call)
        self._call_index: int | None = None  # the chat tool_calls index of an open function_call

    def event(self, kind: str, **payload) -> tuple[str, dict]:
        payload = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return kind, payload

    def lifecycle(self, kind: str, response: dict) -> tuple[str, dict]:
        return self.event(kind, response=response)

    @property
    def output_index(self) -> int:
        return len(self.output)

    def feed(self, delta: dict) -> list[tuple[str, dict]]:
        events = []
        if delta.get("reasoning_content") or delta.get("reasoning"):
            text = delta.get("reasoning_content") or delta["reasoning"]
            events += self._ensure("reasoning")
            self.reasoning_text += text
            events += self._text_delta("response.reasoning_text.delta", text)
        if delta.get("content"):
            events += self._ensure("message")
            events += self._text_delta("response.output_text.delta", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self._tool_call(call)
        return events

    def finish(self, status: str) -> list[tuple[str, dict]]:
        """Close the open item (cut short when the response is incomplete); a reply that said nothing at
        all still gets its (empty) message, as the non-streamed response has."""
        events = [] if self._open is not None or self.output else self._ensure("message")
        return events + self._close("incomplete" if status == "incomplete" else "completed")

    # ---- items ----------------------------------------------------------------------------------

    def _ensure(self, kind: str) -> list[tuple[str, dict]]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close("completed")
        if kind == "message":
            item = message_item(new_id("msg_"), "", "in_progress")
            item["content"] = []
            part = output_text_part("")
        else:
            item = reasoning_item(new_id("rs_"), "", "in_progress")
            item["content"] = []
            part = {"type": "reasoning_text", "text": ""}
        self._open, self._text = item, ""
        events.append(self.event("response.output_item.added", output_index=self.output_index, item=dict(item)))
        events.append(
            self.event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.output_index,
                content_index=0,
                part=part,
            )
        )
        return events

    def _text_delta(self, kind: str, text: str) -> list[tuple[str, dict]]:
        self._text += text
        extra = {"logprobs": []} if kind == "response.output_text.delta" else {}
        return [
            self.event(
                kind, item_id=self._open["id"], output_index=self.output_index, content_index=0, delta=text, **extra
            )
        ]

    def _tool_call(self, call: dict) -> list[tuple[str, dict]]:
        events = []
        function = call.get("function") or {}
        index = call.get("index", 0)
        if self._open is None or self._open["type"] != "function_call" or self._call_index != index:
            events += self._close("completed")
            self._open = function_call_item(
                new_id("fc_"), call.get("id") or new_id("call_"), function.get("name") or "", "", "in_progress"
            )
            self._text, self._call_index = "", index
            events.append(
                self.event("response.output_item.added", output_index=self.output_index, item=dict(self._open))
            )
        elif function.get("name"):
            self._open["name"] += function["name"]
        if function.get("arguments"):
            self._text += function["arguments"]
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=self._open["id"],
                    output_index=self.output_index,
                    delta=function["arguments"],
                )
            )
        return events

    def _close(self, status: str) -> list[tuple[str, dict]]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self.output_index}
        events = []
        if item["type"] == "message":
            part = output_text_part(self._text)
            events.append(
                self.event("response.output_text.done", **where, content_index=0, text=self._text, logprobs=[])
            )
            events.append(self.event("response.content_part.done", **where, content_index=0, part=part))
            item = message_item(item["id"], self._text, status)
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": self._text}
            events.append(self.event("response.reasoning_text.done", **where, content_index=0, text=self._text))
            events.append(self.event("response.content_part.done", **where, content_index=0, part=part))
            item = reasoning_item(item["id"], self._text, status)
        else:
            events.append(
                self.event("response.function_call_arguments.done", **where, name=item["name"], arguments=self._text)
            )
            item = function_call_item(item["id"], item["call_id"], item["name"], self._text, status)
        events.append(self.event("response.output_item.done", output_index=self.output_index, item=item))
        self.output.append(item)
        return events
