"""What the engine hands back to callers: per-step outputs of a request, as a sync or async stream."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the request's top_logprobs alternatives, best first


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int  # over all choices
    cached_tokens: int  # prompt tokens served by the prefix cache
    queue_s: float  # arrival -> first scheduled
    ttft_s: float  # arrival -> first token
    decode_s: float  # first token -> last token
    e2e_s: float  # arrival -> finished
    # Predicted Outputs: drafted tokens of a request with a prediction that verify steps accepted / rejected
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    index: int  # choice index (n > 1)
    text: str  # new text of this choice (a delta)
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" when this choice ended
    stop_reason: str | int | None = None
    usage: Usage | None = None  # on the request's very last output (all choices done)
    error: str | None = None


_END = object()


class RequestStream:
    """Outputs of one request in order. Iterate with `for` (any thread) or `async for` (the event loop
    the request was submitted from). Iteration ends after the output that carries `usage`."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None):
        self.request_id = request_id
        self._loop = loop
        self._sync: queue.Queue = queue.Queue()
        self._async: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self.finished = False
        self._ended = False

    def push(self, output: RequestOutput) -> None:
        """Called by the engine thread."""
        items = [output, _END] if output.usage is not None else [output]
        if output.usage is not None:
            self.finished = True
        for item in items:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._async.put_nowait, item)
            else:
                self._sync.put(item)

    def __iter__(self) -> Iterator[RequestOutput]:
        if self._loop is not None:
            raise RuntimeError("this stream was submitted from an event loop: use `async for`")
        while (item := self._sync.get()) is not _END:
            yield item

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        if self._async is None:
            raise RuntimeError("this stream was submitted outside an event loop: use `for`")
        while (item := await self._async.get()) is not _END:
            yield item

    async def next_output(self, timeout: float | None = None) -> RequestOutput | None:
        """The next output, or None once the stream ended; asyncio.TimeoutError after `timeout` seconds
        without one (the stream stays usable: the server sends a heartbeat and asks again)."""
        if self._async is None:
            raise RuntimeError("this stream was submitted outside an event loop: use `for`")
        if self._ended:
            return None
        item = await asyncio.wait_for(self._async.get(), timeout)
        if item is _END:
            self._ended = True
            return None
        return item

    def collect(self) -> dict[int, list[RequestOutput]]:
        """All outputs by choice index (blocking)."""
        by_choice: dict[int, list[RequestOutput]] = {}
        for output in self:
            by_choice.setdefault(output.index, []).append(output)
        return by_choice
