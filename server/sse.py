"""Server-sent events over Sanic's streaming response: data lines, comment heartbeats, [DONE]."""

from __future__ import annotations

import json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def event(name: str, payload: dict) -> str:
    """A named event (Anthropic's streaming format)."""
    return f"event: {name}\n{data(payload)}"


HEARTBEAT_COMMENT = ": ping\n\n"
DONE = "data: [DONE]\n\n"


async def open_stream(request):
    return await request.respond(content_type="text/event-stream; charset=utf-8", headers=dict(SSE_HEADERS))


async def open_ndjson(request):
    return await request.respond(content_type="application/x-ndjson")


def ndjson(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"
