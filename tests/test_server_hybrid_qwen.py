"""The server with a Qwen3.5-style model: the real Qwen3.5 chat template (XML tool calls, a generation
prompt that opens `<think>` itself) on the tiny random-weight chat model with Qwen3's vocabulary. There
is no real model with the XML form here: its text is random, so grammars make the calls (required /
named tool choice) and tests assert protocol behaviour through every API."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import openai
import pytest

from ember.server.chat_output import ChatOutputParser
from ember.server.ollama_request import ToolCallCollector
from ember.server.tool_format import XML_TOOL_CALLS
from ember.server.tools import ollama_tool_calls, parse_openai_tools

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "Qwen3.5-4B.jinja"
MODEL = "tiny-qwen35"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMETERS}}
THINK, END_THINK = 151667, 151668  # Qwen3's <think> and </think>
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(qwen_gguf, tmp_path_factory):
    from server_support import SERVER_ARGS, LiveServer, write_tiny_chat_model

    folder = tmp_path_factory.mktemp("tiny-qwen35") / MODEL
    write_tiny_chat_model(folder, qwen_gguf, chat_template=TEMPLATE.read_text(), qwen3_tokens=True)
    live = LiveServer(folder, *SERVER_ARGS)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def valid(arguments: str | dict) -> dict:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, PARAMETERS)
    return value


def test_required_call_in_the_xml_form_with_thinking_off_by_effort(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        reasoning_effort="none",
        max_tokens=80,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert getattr(choice.message, "reasoning_content", None) is None  # the prompt closed the think block
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    valid(call.function.arguments)


def test_streamed_named_call_equals_the_whole_one(client):
    request = dict(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
        extra_body=NO_THINKING,
    )
    chunks = list(client.chat.completions.create(stream=True, **request))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)  # nothing of the call leaks into content
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert all(t.id is None and t.function.name is None for t in calls[1:])
    arguments = "".join(t.function.arguments or "" for t in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls[0].function.arguments
    assert valid(arguments) == valid(whole) and arguments == whole


def test_cut_by_max_tokens_is_length_without_a_call(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=6, extra_body=NO_THINKING
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls and not choice.message.content


def test_the_template_opens_thinking_and_the_output_comes_back_as_reasoning(server):
    """Qwen3.5's generation prompt ends in `<think>\\n`: the model's text starts inside the block, with
    no opening tag, and is reasoning until `</think>`; thinking switched off gives plain content."""
    on = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0},
        timeout=300,
    ).json()["choices"][0]["message"]
    off = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "reasoning_effort": "minimal"},
        timeout=300,
    ).json()["choices"][0]["message"]
    assert on["reasoning_content"] and not on.get("content")
    assert off["content"] and not off.get("reasoning_content")
    prompt = {"model": MODEL, "messages": MESSAGES}
    tokens_on = httpx.post(server.url + "/v1/tokenize", json=prompt, timeout=60).json()["tokens"]
    tokens_off = httpx.post(server.url + "/v1/tokenize", json={**prompt, "enable_thinking": False}, timeout=60).json()
    assert tokens_on[-2] == THINK and tokens_off["tokens"][-2] == END_THINK  # "<think>\n" / "</think>\n\n"


def test_responses_api_function_call(client):
    reply = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],
        tool_choice="required",
        reasoning={"effort": "none"},
        max_output_tokens=80,
        temperature=0,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    valid(calls[0].arguments)


def test_anthropic_tool_use_whole_and_streamed(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    request = dict(
        model=MODEL,
        max_tokens=80,
        messages=MESSAGES,
        tools=[{"name": "get_weather", "input_schema": PARAMETERS}],
        tool_choice={"type": "any"},
        thinking={"type": "disabled"},
        extra_body={"temperature": 0},
    )
    whole = client.messages.create(**request)
    assert whole.stop_reason == "tool_use"
    blocks = [b for b in whole.content if b.type == "tool_use"]
    assert blocks and blocks[0].name == "get_weather" and blocks[0].id.startswith("toolu_")
    valid(blocks[0].input)
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.input for b in final.content if b.type == "tool_use"] == [blocks[0].input]


def test_ollama_thinks_with_the_template_and_reads_xml_calls(server):
    reply = httpx.post(
        server.url + "/api/chat",
        json={"model": MODEL, "messages": MESSAGES, "stream": False, "think": True, "options": {"num_predict": 5}},
        timeout=300,
    ).json()
    assert reply["message"]["thinking"] and reply["message"]["content"] == ""
    # Ollama has no tool_choice to force a call: its shaping of XML calls, streamed and whole.
    tools = parse_openai_tools([WEATHER])
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
    parser = ChatOutputParser(tools=tools, reasoning=None, incremental=True, tool_format=XML_TOOL_CALLS)
    collector = ToolCallCollector()
    for ch in text:
        collector.add(parser.feed(ch))
    collector.add(parser.finish("stop"))
    whole = ollama_tool_calls(XML_TOOL_CALLS.parse(text, tools).calls)
    assert [c["function"]["arguments"] for c in collector.ready(final=True)] == [
        c["function"]["arguments"] for c in whole
    ]
    assert whole == [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]
