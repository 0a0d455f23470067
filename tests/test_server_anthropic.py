"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) of a live `ember serve`,
driven by the official `anthropic` SDK (tiny random-weight chat model: assertions are about the
protocol, not the prose), plus the request translation and the block writer on their own."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from ember.server.anthropic import openai_chat_body
from ember.server.anthropic_stream import BlockWriter, stop_fields
from ember.server.errors import ApiError

MODEL = "tiny-qwen-chat"
HELLO = [{"role": "user", "content": "Say hi."}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}  # bounded: the model is random
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C and sunny"}]},
            {"type": "text", "text": "Thanks!"},
        ],
    },
]


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


GREEDY = {"temperature": 0}  # SDK 2.x dropped the sampling arguments from its signatures: they go as extra body


def _greedy(client, **kw):
    kw.setdefault("messages", HELLO)
    kw["extra_body"] = {**GREEDY, **kw.get("extra_body", {})}
    return client.messages.create(model=MODEL, **kw)


def _count(client, **kw):
    return client.messages.count_tokens(model=MODEL, **kw).input_tokens


def _text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _raw_events(server, body: dict) -> list[tuple[str, dict]]:
    """(event name, payload) of a streamed response, straight off the wire."""
    events, name = [], None
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: ") :])))
    return events


# ---- translation and block writing (no server) -----------------------------------------------


def test_request_becomes_an_openai_chat_body():
    translated = openai_chat_body(
        {
            "model": MODEL,
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": TOOL_TURNS,
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_k": 3,
            "seed": 1,
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": {"user_id": "u"},
        }
    )
    body, kwargs = translated.body, translated.template_kwargs
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert body["messages"][0]["content"] == "Be brief."
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C and sunny"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER_TOOL["input_schema"],
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert (body["max_tokens"], body["stop"], body["temperature"], body["top_k"], body["seed"]) == (
        9,
        ["END"],
        0.5,
        3,
        1,
    )
    assert kwargs == {"enable_thinking": True}
    assert translated.prefill == ""
    any_choice = openai_chat_body(
        {
            "max_tokens": 1,
            "messages": HELLO,
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "thinking": {"type": "disabled"},
        }
    )
    assert (any_choice.body["tool_choice"], any_choice.body["parallel_tool_calls"]) == ("required", False)
    assert any_choice.template_kwargs == {"enable_thinking": False}


def test_a_final_assistant_text_is_a_prefill():
    prefilled = openai_chat_body(
        {
            "max_tokens": 1,
            "messages": [
                *HELLO,
                {"role": "assistant", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
            ],
        }
    )
    assert prefilled.body["messages"] == HELLO and prefilled.prefill == "Hello"
    assert openai_chat_body({"max_tokens": 1, "messages": TOOL_TURNS[:2]}).prefill == ""  # a past tool call


@pytest.mark.parametrize(
    "body, field",
    [
        ({"messages": HELLO}, "max_tokens"),
        ({"max_tokens": 0, "messages": HELLO}, "max_tokens"),
        ({"max_tokens": 5, "messages": HELLO, "bogus": 1}, "bogus"),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                        ],
                    }
                ],
            },
            "messages[0]",
        ),
        ({"max_tokens": 5, "messages": HELLO, "stop_sequences": ["ok", 3]}, "stop_sequences"),
        ({"max_tokens": 5, "messages": HELLO, "thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"max_tokens": 5, "messages": HELLO, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {
                "max_tokens": 5,
                "messages": HELLO,
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            "tool_choice.name",
        ),
    ],
)
def test_invalid_requests_name_the_field(body, field):
    with pytest.raises(ApiError) as caught:
        openai_chat_body(body)
    assert caught.value.status == 400 and caught.value.param.startswith(field)


def test_block_writer_closes_each_block_before_the_next():
    writer = BlockWriter()
    events = writer.feed(
        [
            {"reasoning_content": "hm", "reasoning": "hm"},
            {"content": "Sure"},
            {"content": "."},
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]},
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}
                ]
            },
        ]
    )
    events += writer.close()
    shape = [
        (name, payload["index"], (payload.get("content_block") or payload.get("delta") or {}).get("type"))
        for name, payload in events
    ]
    assert shape == [
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
    ]
    assert events[7][1]["content_block"] == {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}
    assert writer.has_tool_calls and writer.close() == []


def test_stop_reasons():
    assert stop_fields("stop", None, False) == ("end_turn", None)
    assert stop_fields("stop", 151645, False) == ("end_turn", None)
    assert stop_fields("stop", "END", False) == ("stop_sequence", "END")
    assert stop_fields("length", None, False) == ("max_tokens", None)
    assert stop_fields("stop", None, True) == ("tool_use", None)


# ---- the live server --------------------------------------------------------------------------


def test_message_shape_usage_and_max_tokens(client):
    message = _greedy(client, max_tokens=5)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert [block.type for block in message.content] in (["text"], [])
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    usage = message.usage
    assert usage.output_tokens == 5 and usage.cache_creation_input_tokens == 0
    assert usage.input_tokens + usage.cache_read_input_tokens == _count(client, messages=HELLO)
    assert message._request_id == message.id


def test_stream_events_and_the_assembled_message(client):
    whole = _text(_greedy(client, max_tokens=10))
    kinds, deltas = [], []
    with client.messages.stream(model=MODEL, max_tokens=10, messages=HELLO, extra_body=GREEDY) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                deltas.append(ev.delta.text)
        final = stream.get_final_message()
    raw = [k for k in kinds if k not in ("text", "ping")]  # "text" is the SDK's own convenience event
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    if deltas:
        assert raw[1] == "content_block_start" and raw[-3] == "content_block_stop"
    assert _text(final) == "".join(deltas) == whole
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == _count(client, messages=HELLO)
    assert final.id.startswith("msg_")


def test_raw_sse_event_names_match_payload_types(server):
    events = _raw_events(server, {"model": MODEL, "max_tokens": 6, "messages": HELLO, "temperature": 0})
    assert all(name == payload["type"] for name, payload in events)
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    open_index, next_index = None, 0
    for name, payload in events:  # blocks one at a time, indexes 0, 1, ...
        if name == "content_block_start":
            assert open_index is None and payload["index"] == next_index
            open_index = payload["index"]
        elif name == "content_block_delta":
            assert payload["index"] == open_index
        elif name == "content_block_stop":
            assert payload["index"] == open_index
            open_index, next_index = None, next_index + 1
    assert open_index is None
    delta = [p for n, p in events if n == "message_delta"][0]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6


def test_stop_sequence_truncates_and_is_reported(client):
    whole = _text(_greedy(client, max_tokens=12))
    tail = whole[len(whole) // 2 :]
    stop = next(
        (tail[i : i + 3] for i in range(len(tail)) if tail[i : i + 3].strip() and "\ufffd" not in tail[i : i + 3]), None
    )
    assert stop, f"no usable stop string in {whole!r}"
    message = _greedy(client, max_tokens=12, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert _text(message) == whole[: whole.index(stop)]
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, _text(final)) == ("stop_sequence", stop, _text(message))


def test_system_prompt_as_string_or_blocks(client):
    plain = _count(client, messages=HELLO)
    as_string = _count(client, messages=HELLO, system="You are terse.")
    as_blocks = _count(
        client, messages=HELLO, system=[{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]
    )
    assert as_string == as_blocks and as_string != plain
    message = _greedy(client, max_tokens=3, system=[{"type": "text", "text": "You are terse."}])
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == as_blocks


def test_prefill_continues_the_assistant_message(client):
    prefilled = [*HELLO, {"role": "assistant", "content": "Hello"}]
    assert _count(client, messages=prefilled) == _count(client, messages=HELLO) + 1  # "Hello" is one token
    message = _greedy(client, max_tokens=4, messages=prefilled)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == _count(client, messages=prefilled)


def test_count_tokens_matches_the_openai_prompt(client, server):
    counted = _count(client, messages=HELLO, system="You are terse.")
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=120,
        json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "system", "content": "You are terse."}, *HELLO]},
    )
    assert reply.status_code == 200 and counted == reply.json()["usage"]["prompt_tokens"]


def test_tool_result_turn_renders(client):
    first = _count(client, messages=TOOL_TURNS[:1], tools=[WEATHER_TOOL])
    full = _count(client, messages=TOOL_TURNS, tools=[WEATHER_TOOL])
    errored = [
        *TOOL_TURNS[:2],
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True}],
        },
    ]
    assert full > first + 10 and _count(client, messages=errored, tools=[WEATHER_TOOL]) > first
    message = _greedy(client, max_tokens=3, messages=TOOL_TURNS, tools=[WEATHER_TOOL])
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == full


def test_errors_have_anthropic_shape(client):
    with pytest.raises(anthropic.BadRequestError) as caught:  # max_tokens is required: the SDK insists too
        client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": HELLO})
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nonexistent", max_tokens=3, messages=HELLO)
    assert caught.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as caught:
        _greedy(client, max_tokens=3, extra_body={"bogus": True})
    assert caught.value.body["error"]["message"].startswith("bogus")
    with pytest.raises(anthropic.BadRequestError) as caught:
        _greedy(
            client,
            max_tokens=3,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                    ],
                }
            ],
        )
    assert "image" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        _greedy(client, max_tokens=3000)  # past the 2048-token context


def test_forced_tool_use(client):
    kw = dict(max_tokens=60, messages=HELLO, tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    message = _greedy(client, **kw)
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    assert isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("city"), str)
    with client.messages.stream(model=MODEL, extra_body=GREEDY, **kw) as stream:
        kinds = [ev.delta.type for ev in stream if ev.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in kinds and final.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("tool_use", "get_weather", calls[0].input)
    ]
