"""The engine's API: submit, abort, snapshot, precompile, close. It builds the parts — the KV pools, the
Scheduler, the StepExecutor, the OpenRequests (streams and output processing) — and the EngineLoop, the one
thread that owns the device and runs them (runtime/engine/loop.py).

Callers (the CLI, the server, tests) submit requests from any thread or event loop and read a
RequestStream; abort() ends a request and frees its KV at once. What the engine needs from a model
comes from its plan and checkpoint (buckets, stop tokens, defaults): it knows no model names.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

from ..execution.background_compile import BackgroundCompiler
from ..execution.deterministic_tiles import fixed_tiles
from ..execution.step_executor import StepExecutor
from ..loading.model import Model
from ..sampling.guided import GrammarTokenizer, GuidedMatcher
from ..sampling.params import SamplingParams, choice_seed, resolve_seed
from ..scheduling.prefix_snapshots import snapshot_planner
from ..scheduling.requests import Request
from ..scheduling.scheduler import Scheduler
from ..speculative.stats import AcceptanceStats
from ..state.host_tier import HostTier
from ..state.kinds import engine_pool_blocks, engine_slots
from ..state.kv_cache import KVCache
from ..state.slot_pool import SlotPool
from .config import (
    EngineConfig,
    _deterministic_from_env,
    host_tier_refusal,
    kv_bytes_per_block,
    prefill_shapes,
    sized_config,
)
from .loop import EngineLoop
from .open_requests import Choice, EngineCounters, OpenRequests, RequestGroup
from .output_processor import OutputProcessor
from .speculation import (
    attach_step_hidden_states,
    check_speculation,
    engine_draft_source,
    make_drafter,
    verify_rollback,
)
from .streams import RequestStream

# the configuration and sizing helpers (runtime/engine/config.py) are part of the engine's API
__all__ = ["Engine", "EngineConfig", "EngineCounters", "kv_bytes_per_block", "sized_config"]


class EngineFailedError(RuntimeError):
    """The engine thread stopped on an internal error: every request it held was ended with that error and
    no new request is taken (a server reports 503 and needs a restart)."""


class Engine:
    def __init__(
        self,
        model: Model,
        tokenizer,
        config: EngineConfig | None = None,
        *,
        stop_token_ids: frozenset[int] = frozenset(),
        group=None,
        drafter=None,
    ):
        """group: process 0's LeaderGroup when several processes serve the model (runtime/multihost/mirror.py):
        every device call of the executor is sent to the other processes too, and the group breaking fails
        every request. drafter: a Drafter built by the caller instead of the one config.speculative's method
        names (a benchmark's replay drafter, tools/dev/spec_replay.py); config.speculative still sets k, the
        adaptive plan and its cost model."""
        config = config if config is not None else EngineConfig()
        if _deterministic_from_env():
            config = replace(config, deterministic=True)
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.eos_token_ids = stop_token_ids
        # one block pool per paged KV state kind (full attention; each sliding window, sized to its window), and
        # the prefix cache's host tier below them where one is asked for and the plan allows it (for a plan with
        # slot state, its snapshots' too: they spill there from the snapshot store, snapshot_planner)
        self.host_tier = None
        if config.prefix_cache_host_bytes > 0 and host_tier_refusal(model, config) is None:
            per_block = kv_bytes_per_block(model, config.block_size, None, config.kv_cache_dtype)
            per_snapshot = model.slot_bytes() if model.slot_kinds else 0
            self.host_tier = HostTier(config.prefix_cache_host_bytes, per_block, config.block_size, per_snapshot)
        pool_blocks = engine_pool_blocks(model.paged_kinds, config)
        self.kv = KVCache.of(model.paged_kinds, pool_blocks, config.block_size, self.host_tier)
        self.pool = self.kv.primary
        tiled = fixed_tiles(model.policy.deterministic, config.deterministic) is not None
        prefill = prefill_shapes(model.plan.manifest["entries"]["forward"], config, tiled)
        spec = config.speculative
        if spec is not None:
            check_speculation(model, spec, config.deterministic)
        if drafter is not None and spec is None:
            raise ValueError("a drafter needs config.speculative (k, the adaptive plan)")
        if drafter is None and spec is not None:
            drafter = make_drafter(spec, model, config)
        self.drafter = drafter
        self.executor = StepExecutor(model, config, prefill)
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            config.max_batched_tokens,
            config.max_queue_depth,
            prefill.buckets,
            enable_prefix_caching=config.enable_prefix_caching,
            prefill_shapes=prefill,
            # one slot pool per slot state kind (recurrent layers): a running request holds one slot of each
            extra_state={k.name: SlotPool(engine_slots(config), k.name) for k in model.slot_kinds},
            snapshots=snapshot_planner(model, config, self.kv),
            draft_source=(
                engine_draft_source(spec, self.drafter, model.plan.target, self.executor.decode_steps)
                if spec is not None
                else None
            ),
            num_speculative_tokens=spec.num_speculative_tokens if spec is not None else 0,
            rollback=verify_rollback(model, config),
        )
        if spec is not None:  # a model drafter's KV (and the request's acceptance) goes back with the request's
            self.scheduler.on_release = self.scheduler.draft_source.release
        attach_step_hidden_states(self.drafter, self.executor)
        if self.host_tier is not None:
            self.executor.attach_host_tier(self.host_tier)
        self.group = group
        if group is not None:
            group.attach(self.executor, config)
        self.counters = EngineCounters()
        self.requests = OpenRequests(self.scheduler, self.counters)
        if spec is not None:  # a sampling model drafter draws as each row samples (its settings, seed, step)
            self.scheduler.draft_source.row_state = self.requests.row_state
        # one lock over the scheduler and the open requests, shared with the loop thread: the API and the
        # loop take it for every change to either, and the loop waits on it for work
        self._lock = threading.Condition()
        self._ids = itertools.count()
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first guided request
        self._grammar_lock = threading.Lock()
        self._background: BackgroundCompiler | None = None  # compile_in_background()
        self.loop = EngineLoop(
            self.scheduler, self.executor, self.requests, self.counters, self._lock, config.max_queue_wait_s
        )
        self.loop.start()
        if group is not None:
            group.on_failure(self._group_failed)

    @property
    def failure(self) -> str | None:
        """Why the engine thread died, if it did (EngineFailedError)."""
        return self.loop.failure

    # ---- the API ---------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        prediction_ids: tuple[int, ...] = (),
    ) -> RequestStream:
        """Queue a request. Raises ValueError for bad input, QueueFullError when overloaded.
        prediction_ids: a Predicted Output's tokens, drafted from when the engine speculates."""
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
        group = RequestGroup(request_id, stream, params, [], time.monotonic())
        base_seed = resolve_seed(params)
        matcher = self._new_matcher(params)  # ValueError for a grammar this tokenizer refuses
        for index in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{index}"
            request = Request(rid, list(prompt_ids), max_tokens, params=params, prediction_ids=tuple(prediction_ids))
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
                Choice(
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
            self.requests.add(group)
            self._lock.notify()
        return stream

    def abort(self, request_id: str) -> bool:
        """End a request now (client gone, deadline); its KV is freed before the next step."""
        with self._lock:
            return self.requests.abort(request_id)

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
                # the prefix cache's host tier (runtime/state/host_tier.py): None when the engine keeps none
                "host_tier": self.host_tier.counters() if self.host_tier is not None else None,
            }

    def prefill_progress(self) -> dict[str, tuple[int, int]]:
        """Running requests whose prompt is not all in the KV cache yet: request id -> (prompt tokens computed,
        prompt tokens); n > 1 choices report under the request's id (the furthest-behind choice). Queued
        requests are not listed: nothing of theirs is being read yet."""
        with self._lock:
            out: dict[str, tuple[int, int]] = {}
            for request in self.scheduler.running:
                total = request.num_prompt_tokens
                done = min(request.num_computed_tokens, total)
                if done < total:
                    rid = request.request_id.split("#")[0]
                    out[rid] = min(out.get(rid, (done, total)), (done, total))
            return out

    def speculation_stats(self) -> AcceptanceStats:
        """A copy of the verify steps' acceptance counts (runtime/speculative/stats.py)."""
        with self._lock:
            stats = AcceptanceStats()
            stats.merge(self.counters.speculation)
            return stats

    def default_params(self, **overrides) -> SamplingParams:
        """Sampling settings for a request that omits some: the checkpoint's generation_config defaults."""
        return SamplingParams.from_generation_config(self.model.checkpoint.generation_config, **overrides)

    def precompile(self, progress: bool = False, ready_only: bool = False) -> float:
        """Compile (or load from the persistent cache) every step shape this engine may run; ready_only: only
        those a first request takes (the target's ready_shapes), compile_in_background() then does the rest."""
        with self._lock:
            seconds = self.executor.precompile(progress, ready_only=ready_only)
            # a draft model's own calls (ready_only: they compile at their first use, as before; ~20 executables)
            if not ready_only and hasattr(self.drafter, "precompile"):
                started = time.perf_counter()
                self.drafter.precompile(self.config.speculative.num_speculative_tokens)
                seconds += time.perf_counter() - started
            return seconds

    def compile_in_background(self) -> BackgroundCompiler:
        """Compile the step shapes precompile(ready_only=True) left on a thread of their own, whenever the
        engine has no request (a step that needs one first compiles it itself); close() stops it."""
        self._background = self.executor.compile_later(busy=lambda: self.scheduler.has_work)
        return self._background

    def close(self) -> None:
        if self._background is not None:
            # wait for a compile under way: a process that exits beside XLA compiling on another thread crashes
            self._background.stop()
        # a broken group may have left the engine thread inside a collective that never returns
        self.loop.stop(timeout=None if self.group is None or self.group.failure is None else 1.0)
        if self.group is not None:
            self.group.close()

    def _group_failed(self, reason: str) -> None:
        """A process of the group died or hung: no step can run again; every open request ends with why."""
        with self._lock:
            if self.loop.failure is None:
                self.loop.failure = f"the process group broke: {reason}"
            self.requests.fail_all(self.loop.failure)
            self.loop.halt()

    # ---- guided decoding -------------------------------------------------------------------------

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
