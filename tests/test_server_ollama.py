"""Ollama's API through the official `ollama` Python client against a live server (tiny random-weight
Qwen2 with the real Qwen2.5 tokenizer and template: the text is random, so these assert protocol shape
and counts, not prose)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import httpx
import ollama
import pytest

GREEDY = {"temperature": 0, "seed": 7}
HELLO = [{"role": "user", "content": "Say hello."}]
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


@pytest.fixture(scope="module")
def name(client) -> str:
    return client.list().models[0].model


def assert_done(final, *, max_tokens: int | None = None) -> None:
    assert final.done is True
    assert final.done_reason in ("stop", "length")
    for key in DURATIONS:
        value = getattr(final, key)
        assert isinstance(value, int) and value >= 0, (key, value)
    assert final.total_duration >= final.eval_duration
    assert final.total_duration > 0
    assert final.prompt_eval_count > 0
    assert final.eval_count >= 1
    if max_tokens is not None:
        assert final.eval_count <= max_tokens
        if final.done_reason == "length":
            assert final.eval_count == max_tokens


# ---- models ---------------------------------------------------------------------------------------


def test_version(server):
    reply = httpx.get(server.url + "/api/version").json()
    assert re.fullmatch(r"\d+\.\d+\.\d+", reply["version"])


def test_list_names_the_model_with_its_details(client):
    models = client.list().models
    assert len(models) == 1
    model = models[0]
    assert model.model.endswith(":latest")
    assert model.size > 0 and re.fullmatch(r"[0-9a-f]{64}", model.digest)
    assert model.modified_at is not None
    details = model.details
    assert (details.format, details.family, list(details.families)) == ("safetensors", "qwen2", ["qwen2"])
    assert re.fullmatch(r"\d+(\.\d+)?[KMB]", details.parameter_size)
    assert details.quantization_level == "F32"
    assert client.list().models[0].digest == model.digest  # stable


def test_show_reports_architecture_template_and_capabilities(client, name):
    shown = client.show(name)
    info = shown.modelinfo
    assert info["general.architecture"] == "qwen2"
    assert info["qwen2.context_length"] == 2048  # the served context (--ctx)
    assert info["qwen2.embedding_length"] == 64 and info["qwen2.block_count"] == 2
    assert info["general.parameter_count"] > 0
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert "thinking" not in shown.capabilities  # Qwen2.5's vocabulary has no think tags
    assert "<|im_start|>" in shown.template
    assert "temperature" in shown.parameters and 'stop "<|im_end|>"' in shown.parameters
    assert shown.details.family == "qwen2"
    assert client.show(name.removesuffix(":latest")).details.format == "safetensors"


def test_ps_reports_the_running_model(client, name):
    running = client.ps().models
    assert len(running) == 1
    model = running[0]
    assert model.model == name
    assert model.size_vram == 0  # CPU
    assert model.size >= client.list().models[0].size  # weights plus the KV pool
    assert model.context_length == 2048
    assert model.expires_at > datetime(2100, 1, 1, tzinfo=UTC)


# ---- chat ------------------------------------------------------------------------------------------


def test_chat_non_streaming(client, name):
    reply = client.chat(model=name, messages=HELLO, stream=False, options={**GREEDY, "num_predict": 6})
    assert reply.model == name
    assert reply.message.role == "assistant" and isinstance(reply.message.content, str)
    assert reply.created_at.endswith("Z")
    assert_done(reply, max_tokens=6)


def test_chat_stream_assembles_to_the_same_reply(client, name):
    options = {**GREEDY, "num_predict": 8}
    chunks = list(client.chat(model=name, messages=HELLO, stream=True, options=options))
    assert len(chunks) >= 2
    assert all(chunk.done is False for chunk in chunks[:-1])
    final = chunks[-1]
    assert_done(final, max_tokens=8)
    assert final.message.content == ""
    streamed = "".join(chunk.message.content or "" for chunk in chunks)
    whole = client.chat(model=name, messages=HELLO, stream=False, options=options)
    assert streamed == whole.message.content
    assert final.eval_count == whole.eval_count


def test_eval_count_is_the_number_of_generated_tokens(client, name):
    reply = client.chat(
        model=name, messages=HELLO, stream=False, logprobs=True, top_logprobs=2, options={**GREEDY, "num_predict": 5}
    )
    assert len(reply.logprobs) == reply.eval_count
    assert all(len(entry.top_logprobs) == 2 for entry in reply.logprobs)
    chunks = list(
        client.chat(model=name, messages=HELLO, stream=True, logprobs=True, options={**GREEDY, "num_predict": 5})
    )
    assert sum(len(chunk.logprobs or ()) for chunk in chunks) == chunks[-1].eval_count


@pytest.mark.parametrize("num_predict", [1, 3])
def test_num_predict_limits_the_reply(client, name, num_predict):
    reply = client.chat(model=name, messages=HELLO, stream=False, options={**GREEDY, "num_predict": num_predict})
    assert_done(reply, max_tokens=num_predict)


@pytest.mark.parametrize("num_predict", [-1, 100_000])
def test_num_predict_unbounded_or_too_large_stops_at_the_context_end(client, name, num_predict):
    prompt = "hello" + " hello" * 2039  # 2040 tokens of the 2048-token context
    reply = client.generate(
        model=name, prompt=prompt, raw=True, stream=False, options={"num_predict": num_predict, "stop": ["<|im_end|>"]}
    )
    assert reply.prompt_eval_count == 2040
    assert_done(reply)
    assert reply.eval_count <= 8
    if reply.done_reason == "length":
        assert reply.eval_count == 8


def test_stop_strings_end_the_reply(client, name):
    options = {**GREEDY, "num_predict": 24}
    full = client.generate(model=name, prompt="Count", raw=True, stream=False, options=options).response
    candidates = [c for c in full[len(full) // 3 :] if c.strip() and c.isprintable() and c != "\ufffd"]
    if not candidates:
        pytest.skip(f"the random model produced no usable stop character: {full!r}")
    stop = candidates[0]
    stopped = client.generate(model=name, prompt="Count", raw=True, stream=False, options={**options, "stop": [stop]})
    assert stopped.done_reason == "stop"
    assert stopped.response == full[: full.index(stop)]


def test_chat_accepts_tools_format_think_false_and_keep_alive(client, name):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    reply = client.chat(
        model=name,
        messages=HELLO,
        tools=tools,
        stream=False,
        keep_alive="5m",
        think=False,
        options={**GREEDY, "num_predict": 4},
    )
    assert_done(reply, max_tokens=4)
    for call in reply.message.tool_calls or ():
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    reply = client.chat(model=name, messages=HELLO, format="json", stream=False, options={**GREEDY, "num_predict": 4})
    assert_done(reply, max_tokens=4)


def test_chat_with_an_earlier_tool_call_and_its_result(client, name):
    messages = [
        *HELLO,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    reply = client.chat(model=name, messages=messages, stream=False, options={**GREEDY, "num_predict": 3})
    assert_done(reply, max_tokens=3)


def test_load_and_unload_calls_answer_at_once(client, name):
    loaded = client.generate(model=name)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert client.chat(model=name, messages=[]).done_reason == "load"
    assert client.generate(model=name, keep_alive=0).done_reason == "unload"


# ---- generate --------------------------------------------------------------------------------------


def test_generate_streams_response_deltas_and_context(client, name):
    options = {**GREEDY, "num_predict": 6}
    chunks = list(
        client.generate(model=name, prompt="Once upon a time", system="Be brief.", stream=True, options=options)
    )
    final = chunks[-1]
    assert_done(final, max_tokens=6)
    assert all(chunk.done is False for chunk in chunks[:-1])
    text = "".join(chunk.response for chunk in chunks)
    whole = client.generate(model=name, prompt="Once upon a time", system="Be brief.", stream=False, options=options)
    assert whole.response == text
    assert len(final.context) == final.prompt_eval_count + final.eval_count
    again = client.generate(
        model=name, prompt="And then", context=final.context, stream=False, options={**GREEDY, "num_predict": 2}
    )
    assert again.prompt_eval_count > len(final.context)


def test_generate_raw_prompt_is_not_templated(client, name):
    templated = client.generate(model=name, prompt="Hello", stream=False, options={**GREEDY, "num_predict": 1})
    raw = client.generate(model=name, prompt="Hello", raw=True, stream=False, options={**GREEDY, "num_predict": 1})
    trivial = client.generate(
        model=name, prompt="Hello", template="{{ .Prompt }}", stream=False, options={**GREEDY, "num_predict": 1}
    )
    assert raw.prompt_eval_count == trivial.prompt_eval_count == 1
    assert templated.prompt_eval_count > raw.prompt_eval_count


# ---- errors ----------------------------------------------------------------------------------------


def status_of(call) -> int:
    with pytest.raises(ollama.ResponseError) as caught:
        result = call()
        if not isinstance(result, (dict, ollama.ChatResponse, ollama.GenerateResponse)):
            list(result)  # a stream raises on its first read
    return caught.value.status_code


def test_unknown_model_is_404(client):
    assert status_of(lambda: client.chat(model="no-such-model", messages=HELLO, stream=False)) == 404
    assert status_of(lambda: client.chat(model="no-such-model", messages=HELLO, stream=True)) == 404
    assert status_of(lambda: client.generate(model="no-such-model", prompt="x")) == 404
    assert status_of(lambda: client.show("no-such-model")) == 404


@pytest.mark.parametrize(
    "call",
    [
        lambda c, n: c.pull(n),
        lambda c, n: c.push(n),
        lambda c, n: c.create(model="copy", from_=n),
        lambda c, n: c.delete(n),
        lambda c, n: c.copy(n, "copy"),
    ],
    ids=["pull", "push", "create", "delete", "copy"],
)
def test_model_management_is_501(client, name, call):
    with pytest.raises(ollama.ResponseError) as caught:
        call(client, name)
    assert caught.value.status_code == 501
    assert "not supported" in caught.value.error


@pytest.mark.parametrize(
    "body, field",
    [
        ({"messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}]}, "images"),
        ({"messages": HELLO, "think": True}, "thinking"),
        ({"messages": HELLO, "format": 12}, "format"),
        ({"messages": HELLO, "options": {"temperature": "hot"}}, "temperature"),
        ({"messages": HELLO, "options": {"top_p": 7}}, "top_p"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_bad_chat_requests_are_400_in_ollamas_shape(server, name, body, field):
    reply = httpx.post(server.url + "/api/chat", json={"model": name, "stream": False, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert isinstance(error, str) and field in error


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "x", "template": "{{ .System }} {{ .Prompt }} !"}, "template"),
        ({"prompt": "x", "suffix": 5}, "suffix"),
        ({"prompt": "x", "images": ["aGVsbG8="]}, "images"),
        ({"prompt": "x", "context": [-1]}, "token ids"),
    ],
)
def test_bad_generate_requests_are_400(server, name, body, field):
    reply = httpx.post(server.url + "/api/generate", json={"model": name, "stream": False, **body})
    assert reply.status_code == 400, reply.text
    assert field in reply.json()["error"]


def test_stream_is_ndjson(server, name):
    with httpx.stream(
        "POST", server.url + "/api/chat", json={"model": name, "messages": HELLO, "options": {"num_predict": 3}}
    ) as reply:
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])


# ---- translation (no server) ----------------------------------------------------------------------


def test_options_become_openai_fields():
    from ember.server.ollama_request import openai_fields

    fields = openai_fields(
        {
            "options": {
                "temperature": 0.2,
                "top_k": -1,
                "top_p": 0.9,
                "min_p": 0.1,
                "seed": 3,
                "num_predict": -1,
                "num_ctx": 8192,
                "repeat_penalty": 1.1,
                "presence_penalty": 0.5,
                "frequency_penalty": 0.25,
                "stop": ["\n"],
                "mirostat": 0,
                "num_thread": 4,
            },
            "format": "json",
            "logprobs": True,
            "top_logprobs": 3,
        }
    )
    assert fields == {
        "temperature": 0.2,
        "top_k": 0,
        "top_p": 0.9,
        "min_p": 0.1,
        "seed": 3,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "stop": ["\n"],
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 3,
    }
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert openai_fields({"format": schema, "options": {"num_predict": 7}}) == {
        "max_tokens": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "ollama", "schema": schema}},
    }
    assert openai_fields({"format": "", "options": {"num_predict": 0, "stop": []}}) == {"stop": None}


def test_streamed_tool_call_deltas_become_whole_ollama_calls():
    from ember.server.ollama_request import ToolCallCollector, split_deltas

    calls = ToolCallCollector()
    calls.add(
        [
            {"content": "ok"},
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
        ]
    )
    calls.add([{"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}])
    assert calls.ready(final=False) == []  # the call may still be growing
    calls.add(
        [
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
            {
                "tool_calls": [
                    {"index": 1, "id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}
                ]
            },
        ]
    )
    assert calls.ready(final=False) == [
        {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert calls.ready(final=True) == [{"function": {"index": 1, "name": "now", "arguments": {}}}]
    assert calls.ready(final=True) == []
    assert split_deltas([{"reasoning_content": "hm", "reasoning": "hm"}, {"content": "a"}, {"content": "b"}]) == (
        "ab",
        "hm",
    )


def test_format_schema_is_enforced_by_the_grammar(client, name):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    reply = client.chat(model=name, messages=HELLO, format=schema, stream=False, options={**GREEDY, "num_predict": 300})
    assert reply.done_reason == "stop"  # the grammar ends the reply once the object is complete
    value = json.loads(reply.message.content)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 1 <= value["n"] <= 9
    streamed = "".join(
        part.message.content
        for part in client.chat(
            model=name, messages=HELLO, format=schema, options={**GREEDY, "num_predict": 300}, stream=True
        )
    )
    assert streamed == reply.message.content
    generated = client.generate(
        model=name, prompt="Answer in JSON.", format="json", stream=False, options={**GREEDY, "num_predict": 60}
    )
    if generated.done_reason == "stop":
        assert isinstance(json.loads(generated.response), dict)
