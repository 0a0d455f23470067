"""Lifecycle of a live `ember serve`: SIGTERM drains in-flight streams, and a bounded soak of mixed
traffic (streams, tools, JSON mode, invalid bodies, disconnects) leaves no 5xx, no lost or doubled
answer, a full KV pool and flat memory."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from server_support import LiveServer

ARGS = ("--max-num-seqs", "4", "--max-batched-tokens", "128", "--ctx", "2048", "--heartbeat-s", "0.5")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def _stream_lines(client: httpx.AsyncClient, url: str, body: dict) -> list[str]:
    async with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        return [line async for line in resp.aiter_lines() if line]


def test_sigterm_lets_eight_streams_finish_then_exits(tiny_chat_model):
    live = LiveServer(tiny_chat_model, *ARGS, "--drain-grace-s", "60")
    try:

        async def run():
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"prompt": "go", "max_tokens": 24, "min_tokens": 24, "ignore_eos": True, "stream": True}
                streams = [
                    asyncio.create_task(_stream_lines(client, live.url + "/v1/completions", body)) for _ in range(8)
                ]
                while True:
                    cap = (await client.get(live.url + "/v1/capacity")).json()
                    if cap["active"] + cap["waiting"] == 8:
                        break
                    await asyncio.sleep(0.01)
                live.signal()
                await asyncio.sleep(0.2)
                refused = await client.post(live.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
                health = await client.get(live.url + "/health")
                return await asyncio.gather(*streams), refused, health

        results, refused, health = asyncio.run(run())
        assert refused.status_code == 503 and health.status_code == 503 and health.json()["status"] == "draining"
        for lines in results:
            assert lines[-1] == "data: [DONE]"
            finals = [json.loads(l[6:]) for l in lines if l.startswith("data: {")]
            assert finals[-1]["usage"]["completion_tokens"] == 24
        assert live.process.wait(timeout=30) == 0  # exits on its own once idle
    finally:
        live.stop()


def _soak_request(rng: random.Random, i: int) -> tuple[str, dict | bytes, str]:
    """(path, body, kind) of the i-th soak request."""
    weather = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
            },
        },
    }
    chat = {
        "messages": [{"role": "user", "content": f"request {i}: " + "word " * rng.randrange(1, 60)}],
        "max_tokens": rng.randrange(1, 12),
        "temperature": rng.choice([0, 0.8]),
        "seed": i,
    }
    kind = rng.choice(["chat", "stream", "completion", "tools", "json", "invalid", "disconnect", "anthropic"])
    if kind == "stream":
        return "/v1/chat/completions", {**chat, "stream": True}, kind
    if kind == "completion":
        return "/v1/completions", {"prompt": "x" * rng.randrange(1, 300), "max_tokens": chat["max_tokens"]}, kind
    if kind == "tools":
        return "/v1/chat/completions", {**chat, "max_tokens": 40, "tools": [weather], "tool_choice": "required"}, kind
    if kind == "json":
        return "/v1/chat/completions", {**chat, "max_tokens": 40, "response_format": {"type": "json_object"}}, kind
    if kind == "invalid":
        return (
            "/v1/chat/completions",
            rng.choice(
                [b"{broken", {"messages": []}, {**chat, "temperature": -1}, {**chat, "n": 99}, {"messages": "hi"}]
            ),
            kind,
        )
    if kind == "disconnect":
        return "/v1/chat/completions", {**chat, "max_tokens": 200, "min_tokens": 200, "stream": True}, kind
    return "/v1/messages", {"messages": chat["messages"], "max_tokens": chat["max_tokens"]}, kind


def test_soak_mixed_traffic(tiny_chat_model):
    live = LiveServer(tiny_chat_model, *ARGS)
    try:
        rng = random.Random(1234)
        plan = [_soak_request(rng, i) for i in range(300)]
        outcomes: dict[int, tuple[str, int, object]] = {}

        async def one(client: httpx.AsyncClient, i: int) -> None:
            path, body, kind = plan[i]
            url = live.url + path
            if kind == "disconnect":
                async with client.stream("POST", url, json=body) as resp:
                    status = resp.status_code
                    async for line in resp.aiter_lines():
                        if line.startswith("data: {"):
                            break  # the client goes away mid-stream
                outcomes[i] = (kind, status, None)
                return
            if kind == "stream":
                lines = await _stream_lines(client, url, body)
                outcomes[i] = (kind, 200, lines)
                return
            resp = await (client.post(url, content=body) if isinstance(body, bytes) else client.post(url, json=body))
            outcomes[i] = (kind, resp.status_code, resp.json())

        async def worker(client, queue: asyncio.Queue) -> None:
            while not queue.empty():
                await one(client, queue.get_nowait())

        async def run(indices) -> None:
            queue: asyncio.Queue = asyncio.Queue()
            for i in indices:
                queue.put_nowait(i)
            async with httpx.AsyncClient(timeout=120) as client:
                await asyncio.gather(*(worker(client, queue) for _ in range(32)))

        asyncio.run(run(range(60)))  # warm-up: every code path has run once
        rss_warm = _rss_bytes(live.process.pid)
        asyncio.run(run(range(60, 300)))
        rss_end = _rss_bytes(live.process.pid)

        assert sorted(outcomes) == list(range(300))  # every request answered exactly once (dict keys)
        for i, (kind, status, payload) in outcomes.items():
            assert status < 500, (i, kind, status, payload)
            if kind == "invalid":
                assert status == 400, (i, payload)
            elif kind == "stream":
                assert payload[-1] == "data: [DONE]" and sum(l == "data: [DONE]" for l in payload) == 1
            elif kind == "tools":
                assert payload["choices"][0]["finish_reason"] in ("tool_calls", "length"), payload
            elif kind == "json" and payload["choices"][0]["finish_reason"] == "stop":
                assert isinstance(json.loads(payload["choices"][0]["message"]["content"]), dict)
            elif kind != "disconnect":
                assert status == 200, (i, kind, payload)
        deadline = time.monotonic() + 10
        while True:
            cap = httpx.get(live.url + "/v1/capacity").json()
            if (cap["active"], cap["waiting"], cap["free_kv_blocks"]) == (0, 0, cap["total_kv_blocks"]):
                break
            assert time.monotonic() < deadline, cap
            time.sleep(0.05)
        assert rss_end - rss_warm < 150 * 2**20, (rss_warm, rss_end)  # memory flat after warm-up
    finally:
        live.stop()
