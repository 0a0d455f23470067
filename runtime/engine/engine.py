"""The engine: one thread owns the device and loops schedule → run one step → sample → stream.

Callers (the CLI, the server, tests) submit requests from any thread or event loop and read a
RequestStream; abort() ends a request and frees its KV at once. What the engine needs from a model
comes from its plan and checkpoint (buckets, stop tokens, defaults): it knows no model names.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field, replace

from ..execution.step_executor import StepExecutor
from ..loading.model import Model
from ..sampling.guided import GrammarTokenizer, GuidedMatcher
from ..sampling.params import RowState, SamplingParams, choice_seed, resolve_seed
from ..scheduling.requests import Request, RequestStatus
from ..scheduling.scheduler import Scheduler
from ..state.kinds import engine_pool_blocks
from ..state.kv_cache import KVCache
from .config import EngineConfig, _deterministic_from_env, kv_bytes_per_block, prefill_shapes, sized_config
from .loop import EngineLoop
from .output_processor import OutputProcessor, merge_deltas
from .streams import RequestOutput, RequestStream, TokenLogprob, Usage

# the configuration and sizing helpers (runtime/engine/config.py) are part of the engine's API
__all__ = ["Engine", "EngineConfig", "EngineCounters", "kv_bytes_per_block", "sized_config"]


@dataclass
class EngineCounters:
    requests_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    device_calls: int = 0  # steps run ahead several at a time count once here (runtime/scheduling/lookahead.py)
    chained_calls: int = 0  # of those, dispatched before the previous call's results were read


@dataclass
class _Choice:
    index: int
    request: Request
    processor: OutputProcessor
    seed: int
    finish_reason: str | None = None
    matcher: GuidedMatcher | None = None  # params.guided: the grammar's state, advanced by each token


@dataclass
class _Group:
    request_id: str
    stream: RequestStream
    params: SamplingParams
    choices: list[_Choice]
    arrival: float
    scheduled_at: float | None = None
    first_token_at: float | None = None


class EngineFailedError(RuntimeError):
    """The engine thread stopped on an internal error: every request it held was ended with that error and
    no new request is taken (a server reports 503 and needs a restart)."""


class Engine(EngineLoop):
    def __init__(
        self,
        model: Model,
        tokenizer,
        config: EngineConfig | None = None,
        *,
        stop_token_ids: frozenset[int] = frozenset(),
    ):
        config = config if config is not None else EngineConfig()
        if _deterministic_from_env():
            config = replace(config, deterministic=True)
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.eos_token_ids = stop_token_ids
        # one block pool per paged KV state kind (full attention; each sliding window, sized to its window)
        self.kv = KVCache.of(model.paged_kinds, engine_pool_blocks(model.paged_kinds, config), config.block_size)
        self.pool = self.kv.primary
        prefill = prefill_shapes(model.plan.manifest["entries"]["forward"], config)
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            config.max_batched_tokens,
            config.max_queue_depth,
            prefill.buckets,
            enable_prefix_caching=config.enable_prefix_caching,
            prefill_shapes=prefill,
        )
        self.executor = StepExecutor(model, config, prefill)
        self.counters = EngineCounters()
        self._groups: dict[str, _Group] = {}
        self._choice_of: dict[str, _Choice] = {}  # scheduler request id -> choice
        self._group_of: dict[str, _Group] = {}
        self._lock = threading.Condition()
        self._ids = itertools.count()
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first guided request
        self._grammar_lock = threading.Lock()
        self._stopping = False
        self.failure: str | None = None  # set when the engine thread died (EngineFailedError)
        self._thread = threading.Thread(target=self._run, name="ember-engine", daemon=True)
        self._thread.start()

    # ---- the API ---------------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str | None = None) -> RequestStream:
        """Queue a request. Raises ValueError for bad input, QueueFullError when overloaded."""
        params.validate(int(self.model.dims.vocab))
        request_id = request_id or f"req-{next(self._ids)}"
        scoring = params.forced_token_ids is not None  # teacher-forced: no stop strings, stop ids or eos
        max_tokens = (
            len(params.forced_token_ids)
            if scoring
            else params.max_tokens or (self.config.max_model_len - len(prompt_ids))
        )
        if len(prompt_ids) + max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceed the "
                f"context limit of {self.config.max_model_len} tokens"
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        stream = RequestStream(request_id, loop)
        group = _Group(request_id, stream, params, [], time.monotonic())
        base_seed = resolve_seed(params)
        matcher = self._new_matcher(params)  # ValueError for a grammar this tokenizer refuses
        for index in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{index}"
            request = Request(rid, list(prompt_ids), max_tokens, params=params)
            processor = OutputProcessor(
                self.tokenizer,
                prompt_ids,
                stop=() if scoring else params.stop,
                stop_token_ids=() if scoring else params.stop_token_ids,
                eos_token_ids=self.eos_token_ids,
                ignore_eos=params.ignore_eos or scoring,
                min_tokens=0 if scoring else params.min_tokens,
                max_tokens=max_tokens,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
            )
            group.choices.append(
                _Choice(
                    index,
                    request,
                    processor,
                    choice_seed(base_seed, index),
                    matcher=matcher.copy() if matcher is not None and index else matcher,
                )
            )
        with self._lock:
            if self.failure is not None:
                raise EngineFailedError(f"the engine stopped after an internal error: {self.failure}")
            if request_id in self._groups:
                raise ValueError(f"request id {request_id!r} is already in use")
            added = []
            try:
                for choice in group.choices:
                    self.scheduler.add(choice.request)
                    added.append(choice)
            except Exception:
                for choice in added:
                    self.scheduler.abort(choice.request.request_id)
                raise
            self._groups[request_id] = group
            for choice in group.choices:
                self._choice_of[choice.request.request_id] = choice
                self._group_of[choice.request.request_id] = group
            self._lock.notify()
        return stream

    def abort(self, request_id: str) -> bool:
        """End a request now (client gone, deadline); its KV is freed before the next step."""
        with self._lock:
            group = self._groups.get(request_id)
            if group is None:
                return False
            for choice in group.choices:
                if choice.finish_reason is None:
                    self.scheduler.abort(choice.request.request_id)
                    self._emit(group, choice, choice.processor.finish("abort"))
            return True

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting),
                "free_kv_blocks": self.pool.free_blocks,
                "total_kv_blocks": self.pool.num_usable_blocks,
                "accepting": len(self.scheduler.waiting) < self.config.max_queue_depth,
                "kv": self.pool.counters(),
                "preemptions": self.scheduler.num_preemptions,
                # every KV state kind's pool (a sliding-window kind's is sized to its window)
                "kv_kinds": {
                    name: {"free_blocks": p.free_blocks, "total_blocks": p.num_usable_blocks}
                    for name, p in self.kv.pools.items()
                },
            }

    def default_params(self, **overrides) -> SamplingParams:
        """Sampling settings for a request that omits some: the checkpoint's generation_config defaults."""
        return SamplingParams.from_generation_config(self.model.checkpoint.generation_config, **overrides)

    def precompile(self, progress: bool = False) -> float:
        """Compile (or load from the persistent cache) every step shape this engine may run."""
        with self._lock:
            return self.executor.precompile(progress)

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join()

    # ---- streaming (the engine thread, runtime/engine/loop.py, calls these) ---------------------------

    def _stream(self, plan, per_step: list) -> None:
        """Hand the steps' tokens to their choices, one output per choice for all the steps (a device call's
        tokens arrive together: one stream push each, not one per token); the caller holds the lock."""
        for rid in plan.logit_request_ids:
            choice = self._choice_of.get(rid)
            if choice is None or choice.finish_reason is not None:
                continue  # aborted while the step ran, or finished at an earlier step
            self._advance(rid, choice, [results[rid] for results in per_step])

    def _advance(self, rid: str, choice: _Choice, samples: list) -> None:
        """Stream a choice's sampled tokens (one per step, in order) as one output; a choice following a
        grammar also advances it, and ends when it does."""
        group = self._group_of[rid]
        deltas = []
        for sampled in samples:
            if choice.matcher is not None:
                try:
                    error = choice.matcher.accept(sampled.token)
                except Exception as exc:  # a matcher failure ends its choice, never the engine thread
                    error = f"{type(exc).__name__}: {exc}"
                if error is not None:
                    if deltas:
                        self._emit(group, choice, merge_deltas(deltas))
                    self.scheduler.abort(rid)
                    self._emit(group, choice, choice.processor.finish("abort"), error=f"grammar: {error}")
                    return
            deltas.append(choice.processor.push(sampled.token, self._logprob(choice, sampled)))
            if deltas[-1].finished:
                break
            if choice.matcher is not None and choice.matcher.finished:
                deltas.append(choice.processor.finish("stop"))  # the output is complete
                break
        self._emit(group, choice, merge_deltas(deltas))

    def grammar_tokenizer(self) -> GrammarTokenizer:
        """llguidance's view of the tokenizer, built on first use (~1 s for a 150k vocabulary: a server
        calls this once at startup, off its event loop). Raises ValueError if the tokenizer cannot drive one."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                eos = list(dict.fromkeys([*getattr(self.tokenizer, "eos_token_ids", ()), *sorted(self.eos_token_ids)]))
                self._grammar_tokenizer = GrammarTokenizer(self.tokenizer, int(self.model.dims.vocab), eos)
            return self._grammar_tokenizer

    def _new_matcher(self, params: SamplingParams) -> GuidedMatcher | None:
        return None if params.guided is None else self.grammar_tokenizer().matcher(params.guided)

    def _row_state(self, scheduler_id: str) -> RowState:
        choice = self._choice_of[scheduler_id]
        request = choice.request
        return RowState(
            request.params,
            choice.seed,
            request.prompt_token_ids,
            request.output_token_ids,
            choice.processor.suppressed_token_ids(),
            matcher=choice.matcher,
        )

    def _logprob(self, choice: _Choice, sampled) -> TokenLogprob | None:
        k = choice.request.params.logprobs
        if k is None:
            return None
        top = tuple((int(i), float(lp)) for i, lp in zip(sampled.top_ids[:k], sampled.top_logprobs[:k]))
        return TokenLogprob(int(sampled.token), float(sampled.logprob), top)

    def _emit(self, group: _Group, choice: _Choice, delta, error: str | None = None) -> None:
        now = time.monotonic()
        if delta.token_ids and group.first_token_at is None:
            group.first_token_at = now
        if delta.finish_reason is not None and choice.finish_reason is None:
            choice.finish_reason = delta.finish_reason
            if choice.request.status is RequestStatus.RUNNING or not choice.request.is_finished:
                status = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH}.get(
                    delta.finish_reason, RequestStatus.FINISHED_ABORTED
                )
                self.scheduler.finish_request(choice.request.request_id, status)
            self.counters.generation_tokens += choice.processor.num_output_tokens
            self.counters.requests_finished[delta.finish_reason] = (
                self.counters.requests_finished.get(delta.finish_reason, 0) + 1
            )
        usage = None
        if all(c.finish_reason is not None for c in group.choices):
            usage = self._close_group(group, now)
        if delta.text or delta.token_ids or delta.finish_reason is not None or usage is not None:
            group.stream.push(
                RequestOutput(
                    group.request_id,
                    choice.index,
                    delta.text,
                    tuple(delta.token_ids),
                    tuple(delta.logprobs) if delta.logprobs is not None else None,
                    delta.finish_reason,
                    delta.stop_reason,
                    usage,
                    error,
                )
            )

    def _close_group(self, group: _Group, now: float) -> Usage:
        del self._groups[group.request_id]
        for choice in group.choices:
            self._choice_of.pop(choice.request.request_id, None)
            self._group_of.pop(choice.request.request_id, None)
        prompt = group.choices[0].request.num_prompt_tokens
        self.counters.prompt_tokens += prompt
        first = group.first_token_at or now
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=sum(c.processor.num_output_tokens for c in group.choices),
            cached_tokens=max(c.request.cached_tokens for c in group.choices),
            queue_s=(group.scheduled_at or now) - group.arrival,
            ttft_s=first - group.arrival,
            decode_s=now - first,
            e2e_s=now - group.arrival,
        )

    def _refuse_stale_waiting(self) -> None:
        """The bounded wait for KV capacity: a request never admitted within max_queue_wait_s ends."""
        deadline = time.monotonic() - self.config.max_queue_wait_s
        for request in list(self.scheduler.waiting):
            group = self._group_of.get(request.request_id)
            short_of_kv = not self.kv.has_room_for(request.num_prompt_tokens)
            if group is not None and group.scheduled_at is None and group.arrival < deadline and short_of_kv:
                for choice in group.choices:
                    if choice.finish_reason is None:
                        self.scheduler.abort(choice.request.request_id)
                        delta = choice.processor.finish("abort")
                        self._emit(group, choice, delta)
