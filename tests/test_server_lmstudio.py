"""LM Studio's REST API (`/api/v0/...`) over raw HTTP against a live server (tiny random-weight Qwen2:
the text is random, so these assert protocol shape and counts, not prose)."""

from __future__ import annotations

import json

import httpx
import pytest

from ember.runtime.engine.streams import Usage
from ember.server.lmstudio import _stop_reason

STOP_REASONS = {
    "eosFound",
    "stopStringFound",
    "maxPredictedTokensReached",
    "contextLengthReached",
    "toolCalls",
    "userStopped",
    "failed",
}
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(http) -> str:
    return http.get("/api/v0/models").json()["data"][0]["id"]


def assert_lmstudio_blocks(payload: dict, completion_tokens: int) -> None:
    stats = payload["stats"]
    assert stats["stop_reason"] in STOP_REASONS
    assert 0 < stats["time_to_first_token"]
    assert 0 < stats["generation_time"]
    assert stats["tokens_per_second"] == pytest.approx(completion_tokens / stats["generation_time"])
    assert payload["model_info"] == {"arch": "qwen2", "quant": "F32", "format": "safetensors", "context_length": 2048}
    runtime = payload["runtime"]
    assert runtime["name"] == "ember" and "gguf" in runtime["supported_formats"] and runtime["version"]


def sse_events(http, path: str, body: dict) -> list:
    with http.stream("POST", path, json=body) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


# ---- models ---------------------------------------------------------------------------------------


def test_models_list_has_lmstudio_fields(http):
    listing = http.get("/api/v0/models").json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    card = listing["data"][0]
    assert card["object"] == "model" and card["type"] == "llm" and card["state"] == "loaded"
    assert card["arch"] == "qwen2" and card["compatibility_type"] == "safetensors"
    assert card["quantization"] == "F32" and card["publisher"]
    assert card["max_context_length"] == 32768  # what the model was trained for
    assert card["loaded_context_length"] == 2048  # what this server accepts
    assert http.get(f"/api/v0/models/{card['id']}").json() == card


def test_unknown_model_is_404_in_openai_shape(http):
    reply = http.get("/api/v0/models/no-such-model")
    assert reply.status_code == 404
    assert reply.json()["error"]["type"] == "not_found_error"
    reply = http.post("/api/v0/chat/completions", json={"model": "no-such-model", "messages": HELLO})
    assert reply.status_code == 404 and "no-such-model" in reply.json()["error"]["message"]


def test_embeddings_are_openais_shape(http, model_id):
    reply = http.post("/api/v0/embeddings", json={"model": model_id, "input": "x"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "list" and len(reply.json()["data"][0]["embedding"]) == 64


# ---- chat completions -------------------------------------------------------------------------------


def test_chat_completion_has_stats_model_info_and_runtime(http, model_id):
    reply = http.post(
        "/api/v0/chat/completions", json={"model": model_id, "messages": HELLO, "max_tokens": 5, "temperature": 0}
    )
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert payload["object"] == "chat.completion" and payload["model"] == model_id
    choice = payload["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    usage = payload["usage"]
    assert 1 <= usage["completion_tokens"] <= 5
    assert_lmstudio_blocks(payload, usage["completion_tokens"])
    expected = "maxPredictedTokensReached" if choice["finish_reason"] == "length" else "eosFound"
    assert payload["stats"]["stop_reason"] == expected


def test_chat_stream_carries_the_blocks_on_its_last_chunk(http, model_id):
    body = {"model": model_id, "messages": HELLO, "max_tokens": 6, "temperature": 0, "stream": True}
    chunks = sse_events(http, "/api/v0/chat/completions", body)
    assert all("stats" not in chunk for chunk in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == [] and "usage" in last  # the usage chunk is last by default
    assert_lmstudio_blocks(last, last["usage"]["completion_tokens"])
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = http.post("/api/v0/chat/completions", json={**body, "stream": False}).json()
    assert streamed == whole["choices"][0]["message"]["content"]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == [whole["choices"][0]["finish_reason"]]


def test_chat_stream_without_usage_puts_the_blocks_on_the_finish_chunk(http, model_id):
    body = {
        "model": model_id,
        "messages": HELLO,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": False},
    }
    chunks = sse_events(http, "/api/v0/chat/completions", body)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["stats"]["stop_reason"] in STOP_REASONS
    assert sum(1 for chunk in chunks if "stats" in chunk) == 1


def test_context_length_reached(http, model_id):
    prompt = "hello" + " hello" * 2039  # 2040 tokens of the 2048-token context
    reply = http.post("/api/v0/completions", json={"model": model_id, "prompt": prompt, "max_tokens": 8}).json()
    if reply["choices"][0]["finish_reason"] == "length":
        assert reply["stats"]["stop_reason"] == "contextLengthReached"
    assert reply["usage"]["prompt_tokens"] == 2040


# ---- completions --------------------------------------------------------------------------------------


def test_completion_has_stats(http, model_id):
    reply = http.post(
        "/api/v0/completions",
        json={"model": model_id, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 1},
    )
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert payload["object"] == "text_completion"
    choice = payload["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == payload["usage"]["completion_tokens"]
    assert_lmstudio_blocks(payload, payload["usage"]["completion_tokens"])


def test_completion_stream_matches_and_ends_with_stats(http, model_id):
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": True}
    chunks = sse_events(http, "/api/v0/completions", body)
    last = chunks[-1]
    assert_lmstudio_blocks(last, last["usage"]["completion_tokens"])
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    whole = http.post("/api/v0/completions", json={**body, "stream": False}).json()
    assert streamed == whole["choices"][0]["text"]


def test_bad_requests_are_400_in_openai_shape(http, model_id):
    reply = http.post("/api/v0/chat/completions", json={"model": model_id, "messages": HELLO, "temperature": -1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "temperature"
    reply = http.post("/api/v0/completions", json={"model": model_id, "prompt": "x", "suffix": 5})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "suffix"


# ---- stop reasons ------------------------------------------------------------------------------------


class _Service:
    context_length = 100


@pytest.mark.parametrize(
    "finish, stop, tokens, expected",
    [
        ("stop", None, 5, "eosFound"),
        ("stop", 151645, 5, "eosFound"),
        ("stop", "END", 5, "stopStringFound"),
        ("length", None, 5, "maxPredictedTokensReached"),
        ("length", None, 90, "contextLengthReached"),
        ("tool_calls", None, 5, "toolCalls"),
        ("abort", None, 5, "userStopped"),
        ("error", None, 5, "failed"),
    ],
)
def test_stop_reason_names(finish, stop, tokens, expected):
    usage = Usage(
        prompt_tokens=10, completion_tokens=tokens, cached_tokens=0, queue_s=0, ttft_s=0.1, decode_s=0.2, e2e_s=0.3
    )
    assert _stop_reason(_Service(), usage, finish, stop) == expected
