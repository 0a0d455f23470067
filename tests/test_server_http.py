"""Raw-HTTP behaviour of a live `ember serve` started with an API key, CORS, a small queue, a short
request deadline and an output cap: auth, CORS, 429, 504, heartbeats, disconnects freeing KV."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

KEY = "sekrit-key"


@pytest.fixture(scope="module")
def strict(tiny_chat_model):
    from server_support import LiveServer

    live = LiveServer(
        tiny_chat_model,
        "--max-num-seqs",
        "4",
        "--max-batched-tokens",
        "128",
        "--ctx",
        "2048",
        "--heartbeat-s",
        "0.2",
        "--api-key",
        KEY,
        "--cors-origins",
        "https://app.example",
        "--max-queue-depth",
        "2",
        "--request-timeout",
        "4",
        "--max-output-tokens",
        "40",
    )
    yield live
    live.stop()


AUTH = {"Authorization": f"Bearer {KEY}"}


def _chat(max_tokens=4, **extra):
    return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, "temperature": 0, **extra}


def test_health_is_public_and_everything_else_needs_the_key(strict):
    assert httpx.get(strict.url + "/health").status_code == 200
    missing = httpx.post(strict.url + "/v1/chat/completions", json=_chat())
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    wrong = httpx.post(strict.url + "/v1/messages", json={}, headers={"x-api-key": "nope"})
    assert wrong.status_code == 401 and wrong.json()["type"] == "error"  # Anthropic's shape on its route
    assert httpx.get(strict.url + "/api/tags").json() == {"error": wrong.json()["error"]["message"]}
    assert httpx.post(strict.url + "/v1/chat/completions", json=_chat(), headers=AUTH).status_code == 200
    assert httpx.post(strict.url + "/v1/chat/completions", json=_chat(), headers={"x-api-key": KEY}).status_code == 200


def test_cors_only_for_configured_origins(strict):
    pre = httpx.options(
        strict.url + "/v1/chat/completions",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(strict.url + "/v1/chat/completions", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    ok = httpx.post(
        strict.url + "/v1/chat/completions", json=_chat(), headers={**AUTH, "Origin": "https://app.example"}
    )
    assert ok.headers["access-control-allow-origin"] == "https://app.example"


def test_absent_max_tokens_runs_to_the_configured_cap(strict):
    reply = httpx.post(
        strict.url + "/v1/completions",
        headers=AUTH,
        timeout=60,
        json={"prompt": "a", "temperature": 0, "ignore_eos": True},
    ).json()
    assert reply["usage"]["completion_tokens"] == 40 and reply["choices"][0]["finish_reason"] == "length"


def test_deadline_gives_504_and_frees_the_request(strict):
    started = time.monotonic()
    reply = httpx.post(
        strict.url + "/v1/completions",
        headers=AUTH,
        timeout=60,
        json={"prompt": "a", "max_tokens": 2000, "ignore_eos": True, "min_tokens": 2000},
    )
    assert reply.status_code == 504 and reply.json()["error"]["type"] == "timeout_error"
    assert time.monotonic() - started < 15
    _wait_idle(strict)


def _capacity(live) -> dict:
    return httpx.get(live.url + "/v1/capacity", headers=AUTH, timeout=10).json()


def _wait_idle(live, timeout=10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cap = _capacity(live)
        if (cap["active"], cap["waiting"], cap["free_kv_blocks"]) == (0, 0, cap["total_kv_blocks"]):
            return cap
        assert time.monotonic() < deadline, cap
        time.sleep(0.05)


def test_client_disconnect_mid_stream_frees_its_kv(strict):
    body = {"prompt": "count:", "max_tokens": 1000, "min_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", strict.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as resp:
        # progress comments and heartbeats may come first (the server's first request can take a second)
        lines = resp.iter_lines()  # kept: a closed line iterator would close the stream
        first = next(line for line in lines if line and not line.startswith(":"))
        assert first.startswith("data: ")
        cap = _capacity(strict)
        assert cap["active"] == 1, cap
    _wait_idle(strict)  # closing the connection aborted the generation


def test_queue_overflow_is_429_and_a_queued_stream_gets_heartbeats(strict):
    """Four streams hold every sequence slot; a fifth request queues (and its stream gets heartbeats), a
    sixth fills the queue (depth 2), a seventh is refused with 429. Closing the four streams lets the
    queued ones run."""
    long = {"prompt": "x", "max_tokens": 1500, "min_tokens": 1500, "ignore_eos": True, "stream": True}

    async def run():
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as client:
            holders = []
            for _ in range(4):
                holder = client.stream("POST", strict.url + "/v1/completions", json=long)
                resp = await holder.__aenter__()
                holders.append((holder, resp))
            await _until(lambda: _capacity(strict)["active"] == 4)
            lines: list[str] = []

            async def queued_stream():
                async with client.stream(
                    "POST", strict.url + "/v1/completions", json={"prompt": "y", "max_tokens": 2, "stream": True}
                ) as resp:
                    async for line in resp.aiter_lines():
                        lines.append(line)

            streamer = asyncio.create_task(queued_stream())
            second = asyncio.create_task(
                client.post(strict.url + "/v1/completions", json={"prompt": "z", "max_tokens": 2})
            )
            await _until(lambda: _capacity(strict)["waiting"] == 2)
            overflow = await client.post(strict.url + "/v1/completions", json={"prompt": "w", "max_tokens": 2})
            await _until(lambda: ": ping" in lines)
            for holder, _ in holders:  # the clients go away: their generations end, the queue moves
                await holder.__aexit__(None, None, None)
            second = await second
            await streamer
            return overflow, second, lines

    overflow, second, lines = asyncio.run(run())
    assert overflow.status_code == 429 and overflow.json()["error"]["type"] == "rate_limit_error"
    assert second.status_code == 200
    assert ": ping" in lines  # comment heartbeats while it waited its turn
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert payloads[-1]["usage"]["completion_tokens"] == 2
    _wait_idle(strict)


async def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_metrics_are_prometheus_text_with_vllm_style_names(strict):
    text = httpx.get(strict.url + "/metrics", headers=AUTH).text
    for name in (
        "ember:num_requests_running",
        "ember:num_requests_waiting",
        "ember:kv_cache_usage_perc",
        "ember:prompt_tokens_total",
        "ember:generation_tokens_total",
        "ember:time_to_first_token_seconds_bucket",
        "ember:inter_token_latency_seconds_bucket",
        "ember:e2e_request_latency_seconds_bucket",
        "ember:prefix_cache_hits_total",
        'ember:request_success_total{finished_reason="length"}',
    ):
        assert name in text, name


def test_the_chat_page_is_public_and_asks_for_the_key(strict):
    """The page and its files hold no secret; the API behind them still wants the key (the page asks)."""
    page = httpx.get(strict.url + "/", timeout=10)
    assert page.status_code == 200 and "key-dialog" in page.text
    assert httpx.get(strict.url + "/webui/app.js", timeout=10).status_code == 200
    assert httpx.get(strict.url + "/v1/info", timeout=10).status_code == 401
    assert httpx.get(strict.url + "/v1/info", headers=AUTH, timeout=10).status_code == 200
