"""One submitted request as a protocol handler sees it: outputs with heartbeats, a deadline, and abort on
every way out (client gone, deadline, error), so no request outlives its HTTP exchange.

    gen = Generation.start(service, prompt_ids, params, ...)
    async for item in gen.events():          # RequestOutput, or HEARTBEAT while nothing arrived
        ...
    result = await gen.collect()              # non-streaming: every choice's text, tokens, logprobs
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..runtime.engine.streams import RequestOutput, RequestStream, TokenLogprob, Usage
from ..runtime.sampling.params import SamplingParams
from .errors import ApiError
from .sse import HEARTBEAT_COMMENT

HEARTBEAT = object()  # yielded by Generation.events when no output came within the heartbeat interval


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class GenerationResult:
    choices: list[ChoiceResult]
    usage: Usage


class Generation:
    def __init__(
        self,
        service,
        stream: RequestStream,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        arrival: float,
    ):
        self.service, self.stream, self.request_id = service, stream, request_id
        self.prompt_ids, self.params = prompt_ids, params
        self.deadline = arrival + service.config.request_timeout
        self.usage: Usage | None = None
        self.endings: dict[int, tuple[str, str | int | None]] = {}  # choice -> (finish_reason, stop_reason)
        self._last_token_at: float | None = None
        self._done = False
        self._released = False

    @classmethod
    def start(
        cls,
        service,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        max_tokens_param: str = "max_tokens",
        prompt_param: str = "messages",
        prediction_ids: tuple[int, ...] = (),
    ) -> Generation:
        arrival = time.monotonic()
        request_id = request_id or new_id("req-")
        stream = service.submit(
            prompt_ids,
            params,
            request_id=request_id,
            max_tokens_param=max_tokens_param,
            prompt_param=prompt_param,
            prediction_ids=prediction_ids,
        )
        service.metrics.request_started()
        service.in_flight += 1
        return cls(service, stream, request_id, prompt_ids, params, arrival)

    async def events(self) -> AsyncIterator[RequestOutput | object]:
        """Outputs in order, HEARTBEAT every heartbeat interval without one. Raises ApiError(504) at the
        deadline and ApiError(500) for an engine error; the request is aborted whenever this ends early."""
        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise ApiError(504, f"the request took longer than {self.service.config.request_timeout:g} s")
                try:
                    output = await self.stream.next_output(min(left, self.service.config.heartbeat_s))
                except TimeoutError:
                    yield HEARTBEAT
                    continue
                if output is None:
                    self._done = True
                    return
                self._observe(output)
                if output.error is not None:
                    raise ApiError(500, f"generation failed: {output.error}")
                yield output
        finally:
            if not self._done:
                self._done = True
                self.service.abort(self.request_id)
                self.service.metrics.request_ended("abort", None)
            if not self._released:
                self._released = True
                self.service.in_flight -= 1

    def prefill_progress(self) -> tuple[int, int] | None:
        """(prompt tokens computed, prompt tokens) while the prompt is still being prefilled, else None."""
        engine = self.service.engine
        return engine.prefill_progress().get(self.request_id) if engine is not None else None

    def heartbeat_comment(self) -> str:
        """The SSE comment a stream sends when nothing came for a heartbeat interval: the prefill's progress
        (`: prefill 512/4096`) while the prompt is being read, else a plain ping."""
        progress = self.prefill_progress()
        return HEARTBEAT_COMMENT if progress is None else f": prefill {progress[0]}/{progress[1]}\n\n"

    async def collect(self) -> GenerationResult:
        choices = {i: ChoiceResult(i) for i in range(self.params.n)}
        async for output in self.events():
            if output is HEARTBEAT:
                continue
            choice = choices[output.index]
            choice.text += output.text
            choice.token_ids.extend(output.token_ids)
            if output.logprobs:
                choice.logprobs.extend(output.logprobs)
            if output.finish_reason is not None:
                choice.finish_reason, choice.stop_reason = output.finish_reason, output.stop_reason
        return GenerationResult([choices[i] for i in sorted(choices)], self.usage)

    def _observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        if output.finish_reason is not None:
            self.endings[output.index] = (output.finish_reason, output.stop_reason)
        metrics = self.service.metrics
        if output.token_ids:
            if self._last_token_at is not None:
                metrics.observe_inter_token(now - self._last_token_at)
            self._last_token_at = now
        if output.usage is not None:
            self.usage = output.usage
            self._done = True
            reasons = "error" if output.error else (output.finish_reason or "stop")
            metrics.request_ended(reasons, output.usage)
