"""`POST /v1/responses` (OpenAI Responses API; stored responses and previous_response_id) with the official `openai` SDK against a live
`ember serve` on the tiny random-weight chat model: its text is random, so the tests check the shapes,
the event order, and that streamed and whole answers agree. The event writer and the request
translation are also checked offline (tool calls and reasoning, which the random model does not
produce on its own), through the SDK's own stream accumulator."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from ember.server.chat_output import ParsedOutput
from ember.server.errors import ApiError
from ember.server.openai_responses_input import parse_responses_request
from ember.server.openai_responses_output import ResponseEventWriter, output_items, response_object

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": WEATHER,
    "strict": True,
}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def check_response(response, model: str, max_output_tokens: int) -> None:
    assert response.id.startswith("resp_") and response.object == "response" and response.model == model
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
        assert response.usage.output_tokens == max_output_tokens
    messages = [item for item in response.output if item.type == "message"]
    assert len(messages) == 1 and messages[0].id.startswith("msg_") and messages[0].role == "assistant"
    assert [part.type for part in messages[0].content] == ["output_text"]
    assert response.output_text == messages[0].content[0].text
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens <= max_output_tokens and usage.input_tokens > 0
    assert usage.input_tokens_details.cached_tokens <= usage.input_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


# ---- whole responses -----------------------------------------------------------------------------------


def test_create_with_a_string_input(client, model):
    response = client.responses.create(
        model=model,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0.5,
        top_p=0.9,
        metadata={"run": "1"},
    )
    check_response(response, model, 8)
    assert response.instructions == "Be brief." and response.max_output_tokens == 8
    assert response.temperature == 0.5 and response.top_p == 0.9 and response.metadata == {"run": "1"}
    assert response.tools == [] and response.error is None and response.previous_response_id is None


def test_input_tokens_are_the_chat_templates_tokens(client, model, server):
    """instructions + input items render exactly as the same conversation does on the chat path."""
    items = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Bonjour"}]},
        {"role": "user", "content": "How are you?"},
    ]
    response = client.responses.create(model=model, input=items, instructions="You are terse.", max_output_tokens=2)
    check_response(response, model, 2)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "How are you?"},
    ]
    tokens = httpx.post(server.url + "/v1/tokenize", json={"messages": messages}, timeout=60).json()
    assert response.usage.input_tokens == tokens["count"]


def test_function_call_history_and_tools(client, model):
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C, sunny"},
    ]
    response = client.responses.create(
        model=model,
        input=items,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_output_tokens=6,
        store=False,
        reasoning={"effort": "low"},
    )
    assert response.status in ("completed", "incomplete")
    assert [tool.name for tool in response.tools] == ["get_weather"] and response.tool_choice == "auto"
    for item in response.output:
        assert item.type in ("message", "function_call", "reasoning")
        if item.type == "function_call":  # once the chat path parses calls: a call of a declared tool
            assert item.name == "get_weather" and item.call_id.startswith("call_") and item.id.startswith("fc_")
            assert isinstance(json.loads(item.arguments), dict)


def test_text_formats_are_accepted(client, model):
    for text in (
        {"format": {"type": "text"}},
        {"format": {"type": "json_object"}},
        {"format": {"type": "json_schema", "name": "city", "schema": WEATHER, "strict": True}},
    ):
        response = client.responses.create(model=model, input="A city, as JSON.", text=text, max_output_tokens=4)
        assert response.text.format.type == text["format"]["type"]
        assert response.status in ("completed", "incomplete")


def test_a_forced_function_call_is_a_function_call_item(client, model):
    """tool_choice naming a function: the grammar makes the random model call it with valid arguments."""
    tool = {
        **WEATHER_TOOL,
        "parameters": {
            **WEATHER,
            "properties": {"city": {"type": "string", "maxLength": 6}},
            "additionalProperties": False,
        },
    }
    choice = {"type": "function", "name": "get_weather"}
    response = client.responses.create(
        model=model, input="Weather in Oslo?", tools=[tool], tool_choice=choice, max_output_tokens=60, temperature=0
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    assert set(json.loads(calls[0].arguments)) == {"city"}
    with client.responses.stream(
        model=model, input="Weather in Oslo?", tools=[tool], tool_choice=choice, max_output_tokens=60, temperature=0
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = stream.get_final_response()  # the SDK helper's own accumulated response
    assert [item.type for item in final.output] == ["function_call"]
    assert final.output[0].arguments == streamed == events[-3].arguments
    assert final.output[0].parsed_arguments == json.loads(streamed)  # the SDK parses strict tools' arguments


def test_json_schema_format_gives_matching_json(client, model):
    schema = {**WEATHER, "properties": {"city": {"type": "string", "maxLength": 6}}, "additionalProperties": False}
    response = client.responses.create(
        model=model,
        input="JSON please",
        max_output_tokens=60,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}},
    )
    if response.status == "completed":
        assert set(json.loads(response.output_text)) == {"city"}


# ---- refusals -----------------------------------------------------------------------------------------


def test_previous_response_id_continues_the_stored_conversation(server, client, model):
    first = client.responses.create(model=model, input="Hello", instructions="Be brief.", max_output_tokens=3)
    assert first.store is True
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(
        model=model, input="And then?", previous_response_id=first.id, max_output_tokens=2, store=False
    )
    assert second.previous_response_id == first.id and second.store is False
    # the prompt was the stored conversation (without the old instructions) plus the new input
    history = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    tokens = httpx.post(server.url + "/v1/tokenize", json={"messages": history}).json()["count"]
    assert second.usage.input_tokens == tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)  # store: false
    streamed = client.responses.create(
        model=model, input="More.", previous_response_id=first.id, max_output_tokens=2, stream=True
    )
    final = [e for e in streamed if e.type in ("response.completed", "response.incomplete")][-1].response
    assert client.responses.retrieve(final.id).previous_response_id == first.id  # streams are stored too


def test_stored_responses_are_per_api_key(server, client, model):
    first = client.responses.create(model=model, input="Hello", max_output_tokens=2)
    other = openai.OpenAI(base_url=server.url + "/v1", api_key="another-key", max_retries=0, timeout=300)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as caught:
        other.responses.create(model=model, input="x", previous_response_id=first.id, max_output_tokens=2)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "previous_response_not_found"
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_store_is_lru_and_bounded():
    from ember.server.response_store import ResponseStore

    store = ResponseStore(max_entries=3, max_bytes=10_000)
    for i in range(3):
        store.put("k", {"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert store.get("k", "r0") is not None  # r0 becomes the most recently used
    store.put("k", {"id": "r3"}, [])
    assert store.get("k", "r1") is None and store.get("k", "r0") is not None and len(store) == 3
    assert store.get("other", "r0") is None  # per key
    store.put("k", {"id": "big"}, [{"content": "y" * 9_960}])  # over the byte bound: older ones go
    assert store.get("k", "big") is not None and store.bytes <= 10_000 and len(store) == 1
    store.put("k", {"id": "huge"}, [{"content": "z" * 20_000}])  # larger than the store: not kept
    assert store.get("k", "huge") is None and store.get("k", "big") is not None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "objekt"}}]}, "tools[0].parameters"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"text": {"format": {"type": "json_schema", "schema": WEATHER}}}, "text.format.name"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER_TOOL]}, "tool_choice.name"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"input": []}, "input"),
    ],
)
def test_invalid_requests_name_the_responses_field(client, model, extra, param):
    body = {"model": model, "input": "Hello", "max_output_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**body)
    assert caught.value.body["param"] == param, caught.value.body


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="Hello", max_output_tokens=2)


# ---- streaming ----------------------------------------------------------------------------------------


MESSAGE_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_stream_event_order_and_agreement(client, model):
    events = list(client.responses.create(model=model, input="Count to ten.", max_output_tokens=10, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    body = [k for i, k in enumerate(kinds[2:-1]) if k != "response.output_text.delta" or kinds[i + 1] != k]
    assert body == MESSAGE_EVENTS  # one message item; its deltas collapsed
    created, final = events[0].response, events[-1].response
    assert created.id == final.id and created.status == "in_progress" and created.output == []
    assert final.status == kinds[-1].removeprefix("response.")
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    text = "".join(e.delta for e in deltas)
    item = events[2].item
    assert all(e.item_id == item.id and e.output_index == 0 and e.content_index == 0 for e in deltas)
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text == final.output_text
    assert final.output[0].id == item.id and final.usage.output_tokens <= 10
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


def test_stream_helper_accumulates_the_same_text(client, model):
    with client.responses.stream(model=model, input="Tell me a story.", max_output_tokens=12) as stream:
        events = list(stream)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    text = "".join(e.delta for e in deltas)
    assert deltas and deltas[-1].snapshot == text  # the SDK's accumulated snapshot
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.output_text == text
    if final.type == "response.completed":
        assert stream.get_final_response().output_text == text


def test_stream_of_an_invalid_request_is_a_plain_400(client, model):
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=model, input="x", previous_response_id="resp_1", stream=True)


def test_a_client_that_leaves_mid_stream_frees_its_request(server, model):
    import time

    body = {"model": model, "input": "Write a long essay.", "max_output_tokens": 1500, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data:") and '"response.output_text.delta"' in line:
                break  # leave after the first delta
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        capacity = httpx.get(server.url + "/v1/capacity", timeout=30).json()
        if capacity["active"] == 0 and capacity["waiting"] == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"the abandoned stream still runs: {capacity}")


# ---- offline: the event writer and the request translation ----------------------------------------------

ECHO = {
    "instructions": None,
    "max_output_tokens": None,
    "parallel_tool_calls": True,
    "tools": [],
    "tool_choice": "auto",
    "text": {"format": {"type": "text"}},
    "reasoning": {"effort": None, "summary": None},
    "metadata": {},
    "user": None,
}
PARAMS = SimpleNamespace(temperature=0.7, top_p=1.0)


def _sdk_replay(events):
    """The SDK's stream accumulator over our events: returns its final response and the text deltas."""
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    deltas = []
    for _, payload in events:
        for out in state.handle_event(construct_type(type_=ResponseStreamEvent, value=payload)):
            if out.type == "response.output_text.delta":
                deltas.append(out.delta)
    return state._completed_response, "".join(deltas)


def test_writer_streams_reasoning_text_and_tool_calls_as_the_sdk_expects():
    writer = ResponseEventWriter()
    start = response_object("resp_1", 0, "m", ECHO, PARAMS, status="in_progress", output=[])
    events = [writer.lifecycle("response.created", start), writer.lifecycle("response.in_progress", start)]
    for delta in [
        {"reasoning_content": "Let me", "reasoning": "Let me"},
        {"reasoning_content": " think"},
        {"content": "Checking"},
        {"content": " now."},
        {
            "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ]
        },
    ]:
        events += writer.feed(delta)
    events += writer.finish("completed")
    final = response_object("resp_1", 0, "m", ECHO, PARAMS, status="completed", output=writer.output)
    events.append(writer.lifecycle("response.completed", final))
    assert [payload["sequence_number"] for _, payload in events] == list(range(len(events)))
    response, streamed_text = _sdk_replay(events)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    assert response.output[0].content[0].text == writer.reasoning_text == "Let me think"
    assert response.output_text == streamed_text == "Checking now."
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in response.output[2:]] == [
        ("call_a", "get_weather", {"city": "Paris"}),
        ("call_b", "get_weather", {"city": "Rome"}),
    ]
    kinds = [kind for kind, _ in events]
    assert kinds.count("response.function_call_arguments.done") == 2
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


def test_an_empty_reply_still_streams_its_message():
    writer = ResponseEventWriter()
    kinds = [kind for kind, _ in writer.finish("incomplete")]
    assert kinds == [k for k in MESSAGE_EVENTS if k != "response.output_text.delta"]
    assert writer.output[0]["status"] == "incomplete" and writer.output[0]["content"][0]["text"] == ""


def test_whole_output_items():
    calls = [{"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    items = output_items(ParsedOutput("", "hmm", calls), "completed")
    assert [item["type"] for item in items] == ["reasoning", "function_call"]  # no empty message beside calls
    assert items[1]["call_id"] == "call_x" and items[1]["id"].startswith("fc_")
    items = output_items(ParsedOutput("partial"), "incomplete")
    assert items[0]["status"] == "incomplete" and items[0]["content"][0]["text"] == "partial"


def test_translation_to_a_chat_body():
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]}
    result = {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "cold"}]}
    body = {
        "model": "m",
        "instructions": "Sys",
        "max_output_tokens": 9,
        "temperature": 0.2,
        "parallel_tool_calls": False,
        "input": [
            {"role": "user", "content": "Hi"},
            said,
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": ""},
            result,
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}},
        "reasoning": {"effort": "high"},
    }
    request = parse_responses_request(body)
    chat = request.chat_body
    assert chat["messages"] == [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    assert chat["max_completion_tokens"] == 9 and chat["temperature"] == 0.2 and chat["reasoning_effort"] == "high"
    assert chat["parallel_tool_calls"] is False and not request.stream
    # errors the chat path raises name the Responses field the client sent
    assert request.responses_param("messages[2].tool_calls[1].function.arguments") == "input[3].arguments"
    assert request.responses_param("messages[3].content") == "input[4].content"
    assert request.responses_param("messages[0].content") == "instructions"
    assert request.responses_param("tools[0].function.parameters") == "tools[0].parameters"
    assert request.responses_param("response_format.json_schema.schema") == "text.format.schema"
    assert request.responses_param("max_completion_tokens") == "max_output_tokens"


def test_allowed_tools_narrows_the_tools():
    other = {**WEATHER_TOOL, "name": "get_time"}
    request = parse_responses_request(
        {
            "input": "x",
            "tools": [WEATHER_TOOL, other],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_time"}],
            },
        }
    )
    assert [t["function"]["name"] for t in request.chat_body["tools"]] == ["get_time"]
    assert request.chat_body["tool_choice"] == "required"
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"input": "x", "conversation": "conv_1"})
    assert caught.value.param == "conversation"


@pytest.mark.parametrize(("effort", "thinking"), [("none", False), ("minimal", False), ("low", True), ("high", True)])
def test_reasoning_effort_becomes_the_templates_thinking_switch(effort, thinking):
    from ember.server.chat_request import thinking_for_effort

    request = parse_responses_request({"input": "x", "reasoning": {"effort": effort}})
    assert request.chat_body["reasoning_effort"] == effort and request.echo["reasoning"]["effort"] == effort
    assert thinking_for_effort(request.chat_body) is thinking
