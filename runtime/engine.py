"""The engine: one thread owns the device and loops schedule → run the plan bucket → sample → update.

Callers submit requests from any thread and read their outputs from a per-request stream; abort()
frees a request's KV at the next step boundary. Sampling currently happens per logit row on the host
(runtime/sampler.py); moving it into the jitted step is the next step of the runtime issue.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import jax.numpy as jnp
import numpy as np

from ..compiler.batch import StepBatch
from .kv import BlockPool
from .model import Model
from .requests import Request, StepOutput
from .sampler import SamplingParams, choose
from .scheduler import Scheduler
from .step_inputs import build_step_batch, step_shape


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 16
    max_batched_tokens: int = 512
    max_queue_depth: int = 256


_DONE = object()


class RequestStream:
    """Outputs of one request, in order; iteration ends when the request finishes or is aborted."""

    def __init__(self, request: Request):
        self.request = request
        self._queue: queue.Queue = queue.Queue()
        self.finish_reason: str | None = None

    def _push(self, output: StepOutput) -> None:
        self._queue.put(output)
        if output.finish_reason is not None:
            self.finish_reason = output.finish_reason
            self._queue.put(_DONE)

    def __iter__(self) -> Iterator[StepOutput]:
        while (item := self._queue.get()) is not _DONE:
            yield item

    def token_ids(self) -> list[int]:
        return [t for output in self for t in output.new_token_ids]


class Engine:
    def __init__(self, model: Model, config: EngineConfig = EngineConfig()):
        self.model, self.config = model, config
        entry = model.plan.manifest["entries"]["forward"]
        self.decode_buckets = tuple(b for b in entry["decode_buckets"] if b <= config.max_num_seqs) or (1,)
        self.prefill_buckets = tuple(entry["prefill_buckets"])
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.pool, config.max_num_seqs, config.max_batched_tokens,
                                   config.max_queue_depth, self.prefill_buckets)
        self.kv = model.new_kv(config.num_blocks, config.block_size)
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Condition()
        self._ids = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="ember-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingParams = SamplingParams(),
               stop_token_ids: frozenset[int] = frozenset(), request_id: str | None = None) -> RequestStream:
        request = Request(request_id or f"req-{next(self._ids)}", list(prompt_ids), max_tokens,
                          stop_token_ids=stop_token_ids, params=sampling)
        stream = RequestStream(request)
        with self._lock:
            self.scheduler.add(request)  # raises QueueFullError / RequestTooLongError at once
            self._streams[request.request_id] = stream
            self._lock.notify()
        return stream

    def abort(self, request_id: str) -> bool:
        with self._lock:
            aborted = self.scheduler.abort(request_id)
            stream = self._streams.pop(request_id, None)
        if aborted and stream is not None:
            stream._push(StepOutput(request_id, [], "abort"))
        return aborted

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self.scheduler.has_work:
                    self._lock.wait()
                if self._stopping:
                    return
                plan = self.scheduler.schedule()
                if plan.is_empty:
                    continue
            shape = step_shape(plan, self.decode_buckets, self.prefill_buckets)
            batch = StepBatch(*(jnp.asarray(a) for a in build_step_batch(plan, shape)))
            logits, self.kv = self.model.forward(self.kv, batch)
            logits = np.asarray(logits)
            with self._lock:
                tokens = []
                for row, request_id in enumerate(plan.logit_request_ids):
                    request = self.scheduler.get(request_id)
                    params = request.params if request is not None else SamplingParams()
                    step = len(request.output_token_ids) if request is not None else 0
                    tokens.append(choose(logits[row], params, step))
                for output in self.scheduler.update(plan, tokens):
                    stream = self._streams.get(output.request_id)
                    if stream is not None:
                        stream._push(output)
                        if output.finish_reason is not None:
                            del self._streams[output.request_id]
