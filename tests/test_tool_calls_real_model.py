"""Tool calls on the real default model (Qwen2.5-Coder-1.5B-Instruct, CPU), through the real SDKs.

The contract (issue: tool calls that end when the model ends): a forced call ends where the model ends
its turn — one question, one call; `finish_reason` / `stop_reason` / `done_reason` say "tool_calls" only
for a turn that ended after complete calls and "length" when max_tokens cut it, and a call cut mid-way is
never returned. Greedy decoding makes each answer reproducible.

CI runs the tests not marked `slow` (one server, a handful of short requests); the rest run with
`./tools/test -m slow tests/test_tool_calls_real_model.py`.
"""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest
from server_support import REAL_MODEL_NAME

pytestmark = pytest.mark.real_model

MODEL = REAL_MODEL_NAME  # the name real_server (conftest) serves it under
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city name"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": WEATHER_SCHEMA,
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Get the local time in a city", "parameters": WEATHER_SCHEMA},
}
TOKYO = [{"role": "user", "content": "Weather in Tokyo?"}]
TWO_CITIES = [{"role": "user", "content": "What's the weather in Tokyo and in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 64}
ZERO_T = {"temperature": 0}  # the anthropic SDK 2.x takes sampling settings as extra body only


@pytest.fixture(scope="module")
def openai_client(real_server):
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def weather_calls(tool_calls) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in tool_calls or ()]


def streamed_chat(client, **kwargs) -> tuple[str, dict[int, list[str]], str | None]:
    """Content, {index: [name, arguments]} and finish_reason of a streamed chat completion."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, ["", ""])
                entry[0] += (delta.function.name or "") if delta.function else ""
                entry[1] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    return content, calls, finish


# ---- in CI ---------------------------------------------------------------------------------------


def test_required_single_city_gives_one_call_and_ends(openai_client):
    reply = openai_client.chat.completions.create(
        model=MODEL, messages=TOKYO, tools=[WEATHER], tool_choice="required", **GREEDY
    )
    choice = reply.choices[0]
    assert weather_calls(choice.message.tool_calls) == [("get_weather", {"city": "Tokyo"})]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert reply.usage.completion_tokens < GREEDY["max_tokens"]  # the model ended the turn itself


def test_required_single_city_streamed_equals_whole(openai_client):
    content, calls, finish = streamed_chat(
        openai_client, messages=TOKYO, tools=[WEATHER], tool_choice="required", **GREEDY
    )
    assert [(name, json.loads(args)) for name, args in calls.values()] == [("get_weather", {"city": "Tokyo"})]
    assert finish == "tool_calls" and content == ""


def test_a_call_cut_by_max_tokens_is_length_and_no_call(openai_client):
    reply = openai_client.chat.completions.create(
        model=MODEL, messages=TOKYO, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=10
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 10
    assert not choice.message.tool_calls and not choice.message.content


def test_anthropic_named_tool_gives_one_tool_use(real_server):
    client = anthropic.Anthropic(base_url=real_server.url, api_key="unused", max_retries=0, timeout=600)
    tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": WEATHER_SCHEMA}
        for t in (WEATHER, TIME)
    ]
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        extra_body=ZERO_T,
        messages=TOKYO,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    uses = [(block.name, block.input) for block in message.content if block.type == "tool_use"]
    assert uses == [("get_weather", {"city": "Tokyo"})]
    assert message.stop_reason == "tool_use" and message.usage.output_tokens < 64


def test_ollama_tools_give_one_call_and_stop(real_server):
    client = ollama.Client(host=real_server.url, timeout=600)
    reply = client.chat(
        model=MODEL, messages=TOKYO, tools=[WEATHER], stream=False, options={"temperature": 0, "num_predict": 64}
    )
    calls = [(call.function.name, dict(call.function.arguments)) for call in reply.message.tool_calls or ()]
    assert calls == [("get_weather", {"city": "Tokyo"})]
    assert reply.done_reason == "stop" and "<tool_call>" not in reply.message.content and reply.eval_count < 64


# ---- slow: `./tools/test -m slow tests/test_tool_calls_real_model.py` ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_two_cities_with_parallel_calls_give_two_distinct_calls(openai_client, stream):
    kwargs = dict(messages=TWO_CITIES, tools=[WEATHER], tool_choice="required", parallel_tool_calls=True, **GREEDY)
    if stream:
        content, calls, finish = streamed_chat(openai_client, **kwargs)
        got = [(name, json.loads(args)) for name, args in calls.values()]
    else:
        choice = openai_client.chat.completions.create(model=MODEL, **kwargs).choices[0]
        got, finish, content = weather_calls(choice.message.tool_calls), choice.finish_reason, choice.message.content
    assert sorted(args["city"] for _, args in got) == ["Paris", "Tokyo"] and {name for name, _ in got} == {
        "get_weather"
    }
    assert finish == "tool_calls" and not content


@pytest.mark.slow
def test_required_without_parallel_calls_gives_one_call(openai_client):
    choice = openai_client.chat.completions.create(
        model=MODEL, messages=TWO_CITIES, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, **GREEDY
    ).choices[0]
    assert len(choice.message.tool_calls) == 1 and choice.finish_reason == "tool_calls"


@pytest.mark.slow
def test_named_function_streamed_gives_one_call(openai_client):
    content, calls, finish = streamed_chat(
        openai_client,
        messages=TOKYO,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        **GREEDY,
    )
    assert [(name, json.loads(args)) for name, args in calls.values()] == [("get_time", {"city": "Tokyo"})]
    assert finish == "tool_calls" and content == ""


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_auto_after_a_tool_result_answers_without_a_half_written_call(openai_client, stream):
    messages = [
        *TOKYO,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 18, "sky": "clear"}'},
    ]
    kwargs = dict(messages=messages, tools=[WEATHER], tool_choice="auto", temperature=0, max_tokens=96)
    if stream:
        content, calls, finish = streamed_chat(openai_client, **kwargs)
        got = [(name, json.loads(args)) for name, args in calls.values()]
    else:
        choice = openai_client.chat.completions.create(model=MODEL, **kwargs).choices[0]
        content, finish, got = (
            choice.message.content or "",
            choice.finish_reason,
            weather_calls(choice.message.tool_calls),
        )
    assert "<tool_call>" not in content and "</tool_call>" not in content
    assert finish in ("stop", "tool_calls") and (finish == "tool_calls") == bool(got)
    assert got or "18" in content  # a text answer uses the tool's result


@pytest.mark.slow
def test_responses_api_required_gives_one_function_call(openai_client):
    response = openai_client.responses.create(
        model=MODEL,
        input="Weather in Tokyo?",
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "description": "Get the current weather in a city",
                "parameters": WEATHER_SCHEMA,
            }
        ],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]
    assert calls == [("get_weather", {"city": "Tokyo"})] and response.status == "completed"


@pytest.mark.slow
def test_responses_api_cut_call_is_incomplete(openai_client):
    response = openai_client.responses.create(
        model=MODEL,
        input="Weather in Tokyo?",
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}],
        tool_choice="required",
        temperature=0,
        max_output_tokens=10,
    )
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.slow
def test_anthropic_streamed_two_cities_and_cut(real_server):
    client = anthropic.Anthropic(base_url=real_server.url, api_key="unused", max_retries=0, timeout=600)
    tools = [
        {"name": "get_weather", "description": "Get the current weather in a city", "input_schema": WEATHER_SCHEMA}
    ]
    with client.messages.stream(
        model=MODEL, max_tokens=64, extra_body=ZERO_T, messages=TWO_CITIES, tools=tools, tool_choice={"type": "any"}
    ) as stream:
        message = stream.get_final_message()
    cities = sorted(block.input["city"] for block in message.content if block.type == "tool_use")
    assert cities == ["Paris", "Tokyo"] and message.stop_reason == "tool_use"
    cut = client.messages.create(
        model=MODEL, max_tokens=10, extra_body=ZERO_T, messages=TOKYO, tools=tools, tool_choice={"type": "any"}
    )
    assert cut.stop_reason == "max_tokens" and not [b for b in cut.content if b.type == "tool_use"]


@pytest.mark.slow
def test_ollama_streamed_answer_after_a_tool_result(real_server):
    """Ollama has no tool_choice (auto only): after a tool result the model answers in text or calls again,
    and a streamed reply never carries a call's text in its content."""
    client = ollama.Client(host=real_server.url, timeout=600)
    messages = [
        *TOKYO,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}],
        },
        {"role": "tool", "content": '{"temperature_c": 18, "sky": "clear"}', "tool_name": "get_weather"},
    ]
    content, calls, done = "", [], None
    for part in client.chat(
        model=MODEL, messages=messages, tools=[WEATHER], stream=True, options={"temperature": 0, "num_predict": 96}
    ):
        content += part.message.content or ""
        calls += [(call.function.name, dict(call.function.arguments)) for call in part.message.tool_calls or ()]
        done = part.done_reason or done
    assert "<tool_call>" not in content and done == "stop"
    assert calls or "18" in content
