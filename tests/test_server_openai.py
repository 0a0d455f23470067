"""The OpenAI routes of a live `ember serve`, driven by the official `openai` SDK (tiny random-weight
chat model: assertions are about the protocol, not the prose)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def _greedy(client, **kw):
    return client.chat.completions.create(model="tiny-qwen-chat", messages=MESSAGES, temperature=0, **kw)


def test_models_lists_the_served_model_with_its_context(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-qwen-chat"]
    assert models[0].model_extra["max_model_len"] == 2048


def test_chat_completion_shape_and_usage(client):
    reply = _greedy(client, max_tokens=7)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 7 and reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 7


def test_stream_matches_the_non_streamed_greedy_answer(client):
    whole = _greedy(client, max_tokens=12).choices[0].message.content
    chunks = list(_greedy(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16  # the prompt ran a moment ago


def test_streamed_logprobs_one_entry_per_token(client):
    chunks = list(
        _greedy(
            client, max_tokens=6, stream=True, logprobs=True, top_logprobs=3, stream_options={"include_usage": True}
        )
    )
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == 6 == chunks[-1].usage.completion_tokens
    for entry in entries:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)


def test_n_choices_with_a_seed_are_reproducible(client):
    kw = dict(model="m", messages=MESSAGES, n=2, seed=7, temperature=1.0, max_tokens=5)
    first = client.chat.completions.create(**{**kw, "model": "tiny-qwen-chat"})
    again = client.chat.completions.create(**{**kw, "model": "tiny-qwen-chat"})
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert first.usage.completion_tokens == 10


def test_stop_string_is_never_emitted(client):
    whole = _greedy(client, max_tokens=12).choices[0].message.content
    stop = whole[len(whole) // 2 :][:3]
    assert stop
    stopped = _greedy(client, max_tokens=12, stop=[stop])
    text = stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop" and stop not in text and whole.startswith(text)
    streamed = "".join(
        c.choices[0].delta.content or "" for c in _greedy(client, max_tokens=12, stop=[stop], stream=True) if c.choices
    )
    assert streamed == text


def test_completions_with_echo_logprobs_and_token_ids(client):
    reply = client.completions.create(
        model="tiny-qwen-chat", prompt="def add(a, b):", max_tokens=5, temperature=0, echo=True, logprobs=2
    )
    choice = reply.choices[0]
    assert choice.text.startswith("def add(a, b):")
    assert len(choice.logprobs.tokens) == 5 and all(len(t) <= 2 for t in choice.logprobs.top_logprobs)
    ids = client.post("/tokenize", body={"prompt": "def add(a, b):"}, cast_to=httpx.Response).json()["tokens"]
    by_ids = client.completions.create(model="tiny-qwen-chat", prompt=ids, max_tokens=5, temperature=0)
    assert choice.text == "def add(a, b):" + by_ids.choices[0].text


def test_streamed_completion_usage_chunk(client):
    chunks = list(
        client.completions.create(
            model="tiny-qwen-chat",
            prompt="x = ",
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_invalid_fields_are_400_with_the_param(client):
    with pytest.raises(openai.BadRequestError) as error:
        _greedy(client, max_tokens=4, top_p=2.0)
    assert error.value.body["param"] == "top_p" and error.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny-qwen-chat", messages=[{"role": "wizard", "content": "x"}])
    assert error.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as error:
        _greedy(client, max_tokens=10**6)
    assert error.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as error:
        _greedy(client, max_completion_tokens=10**6)
    assert error.value.body["param"] == "max_completion_tokens"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-17", messages=MESSAGES, max_tokens=2)
    assert error.value.body["code"] == "model_not_found"


def test_bad_json_and_oversized_bodies(server):
    bad = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    huge = httpx.post(server.url + "/v1/chat/completions", content=b"x" * (9 * 1024 * 1024), timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "invalid_request_error"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def _check_weather_arguments(arguments: str) -> None:
    import jsonschema

    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_required_tool_choice_returns_a_schema_valid_call(client):
    reply = client.chat.completions.create(
        model="tiny-qwen-chat",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        temperature=0.7,
        seed=3,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    _check_weather_arguments(call.function.arguments)


def test_streamed_tool_call_is_assembled_by_the_sdk(client):
    with client.chat.completions.stream(
        model="tiny-qwen-chat",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    _check_weather_arguments(choice.message.tool_calls[0].function.arguments)
    # the same request unstreamed gives the same call (greedy)
    whole = client.chat.completions.create(
        model="tiny-qwen-chat",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    assert whole.choices[0].message.tool_calls[0].function.arguments == choice.message.tool_calls[0].function.arguments


def test_tool_results_render_in_a_later_turn(client):
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
    ]
    reply = client.chat.completions.create(
        model="tiny-qwen-chat", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    tokens = client.post("/tokenize", body={"messages": history}, cast_to=httpx.Response).json()
    text = client.post("/detokenize", body={"tokens": tokens["tokens"]}, cast_to=httpx.Response).json()["prompt"]
    assert "<tool_response>" in text and '{"temp": -3}' in text and '"city": "Oslo"' in text


def test_json_schema_response_format_is_enforced(client):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "b"]}},
        "required": ["n", "tag"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="tiny-qwen-chat",
        messages=MESSAGES,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    import jsonschema

    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    assert reply.choices[0].finish_reason == "stop"


def test_invalid_schema_and_tools_are_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="tiny-qwen-chat",
            messages=MESSAGES,
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
            },
        )
    assert error.value.body["param"].startswith("response_format.json_schema.schema")
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="tiny-qwen-chat",
            messages=MESSAGES,
            max_tokens=4,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert error.value.body["param"] == "tool_choice.function.name"
