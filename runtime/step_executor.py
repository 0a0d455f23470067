"""Runs a scheduler StepPlan on the device: pads it to a compiled shape, runs forward + sampling.

Default mode runs the whole plan as one step of the smallest bucket that fits. Deterministic mode
runs every step in tiles of one fixed shape (DECODE_TILE rows + PREFILL_TILE tokens) through the
plan's deterministic variant (batch-invariant attention), so a token's computation never depends on
what else is in the batch: same tokens and logprobs alone or under load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import numpy as np

from ..compiler.targets import get_target
from .engine_config import kv_dtype
from .engine_step import (
    carry_from_step,
    collect_multi_step,
    collect_step,
    launch_multi_step,
    launch_step,
    make_multi_step_fn,
    make_step_fn,
    no_carry,
    run_multi_step,
    run_step,
)
from .executable_cache import cached_step, executor_identity
from .model import Model
from .sampling_params import RowState
from .scheduler import PrefillChunk, StepPlan
from .state_kinds import engine_pool_blocks
from .step_inputs import PrefillShapes, StepShape, all_step_shapes, build_step_batch, padding_batch, step_shape

DECODE_TILE = 16
PREFILL_TILE = 64


@dataclass(frozen=True)
class Sampled:
    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray


class StepExecutor:
    def __init__(self, model: Model, config, prefill: PrefillShapes):
        self.model, self.config = model, config
        entry = model.plan.manifest["entries"]["forward"]
        self.decode_buckets = tuple(b for b in entry["decode_buckets"] if b < config.max_num_seqs) + (
            config.max_num_seqs,
        )
        self.prefill = prefill
        self.table_blocks = math.ceil(config.max_model_len / config.block_size)
        self.deterministic = config.deterministic
        plan = model.deterministic_plan() if self.deterministic else model.plan
        # each layer's pool is sized by its state kind (the engine's KVCache uses the same sizes)
        self.kv = model.new_kv(
            engine_pool_blocks(model.paged_kinds, config), config.block_size, kv_dtype(model, config.kv_cache_dtype)
        )
        # the step functions' executables are also kept on disk (runtime/executable_cache.py): a warm start
        # neither traces nor lowers them
        identity = (
            executor_identity(plan.module, model.policy, (model.params, self.kv)) if config.keep_executables else None
        )
        # traced inside the model's kernel policy: which kernels and configs the step launches
        forward = model.traced(plan.module.forward)
        self.step_fn = cached_step(make_step_fn(forward), 4, identity, "step")
        # decode steps per device call when the engine runs ahead (1 = never): see runtime/lookahead.py
        steps = config.decode_steps if config.decode_steps is not None else get_target(model.plan.target).decode_steps
        self.decode_steps = 1 if self.deterministic else max(1, steps)
        self.multi_step_fn = (
            cached_step(
                make_multi_step_fn(forward, self.decode_steps),
                4,
                identity,
                f"run-ahead {self.decode_steps}",
            )
            if self.decode_steps > 1
            else None
        )
        self.num_kinds = len(model.paged_kinds)
        self.vocab = int(model.dims.vocab)
        self._carried = None  # the last run-ahead call's last tokens, on the device (make_multi_step_fn)
        self._step_packed = None  # the last single step's (packed result, sampled rows), while it may be chained
        self._no_carry: dict[int, object] = {}  # decode rows -> no_carry() on the device, made once

    def shapes(self) -> list[StepShape]:
        if self.deterministic:
            return [StepShape(DECODE_TILE, PREFILL_TILE, self.table_blocks, self.num_kinds)]
        return all_step_shapes(self.decode_buckets, self.prefill, self.table_blocks, self.num_kinds)

    def precompile(self, progress: bool = False) -> float:
        start = time.perf_counter()
        shapes = self.shapes()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(shapes), desc="compiling plans", unit="plan")
        for shape in shapes:
            self._run(padding_batch(shape), [], shape)
            if self.multi_step_fn is not None and shape.prefill_tokens == 0:
                self._run_ahead(
                    padding_batch(shape),
                    np.zeros((self.decode_steps, shape.num_kinds, shape.decode_rows), np.int32),
                    [],
                    shape,
                )
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return time.perf_counter() - start

    def run(self, plan: StepPlan, rows: list[RowState]) -> dict[str, Sampled]:
        row_of = dict(zip(plan.logit_request_ids, rows))
        if not self.deterministic:
            shape = step_shape(plan, self.decode_buckets, self.prefill, self.table_blocks)
            return self._sampled(plan, self._run(build_step_batch(plan, shape), rows, shape))
        results: dict[str, Sampled] = {}
        for tile in _tiles(plan):
            shape = StepShape(DECODE_TILE, PREFILL_TILE, self.table_blocks, self.num_kinds)
            tile_rows = [row_of[rid] for rid in tile.logit_request_ids]
            results.update(self._sampled(tile, self._run(build_step_batch(tile, shape), tile_rows, shape)))
        return results

    def run_ahead(self, plan: StepPlan, rows: list[RowState]) -> list[dict[str, Sampled]]:
        """A decode-only plan extended by Scheduler.extend_decodes(plan, self.decode_steps): that many
        steps in one device call; one {request id: Sampled} per step."""
        return self.launch(plan, rows, self.decode_steps)()

    def launch(
        self, plan: StepPlan, rows: list[RowState], steps: int, *, chained: bool = False
    ) -> Callable[[], list[dict[str, Sampled]]]:
        """Dispatch `plan` (steps > 1: an extended plan, as run_ahead) and return at once, before the device
        is done: calling the result waits for it and gives one {request id: Sampled} per step. The host may
        work meanwhile (the engine streams the previous call's tokens). Deterministic tiles run here.
        chained: `plan` is Scheduler.chain_decodes of the previous call (same rows, in order), whose last
        tokens, still on the device, are this call's inputs — or Scheduler.chain_after_prefill of the previous
        single step, whose sampled tokens are."""
        if self.deterministic:  # tiles of one fixed shape, run one after another
            results = [self.run(plan, rows)]
            return lambda: results
        shape = step_shape(plan, self.decode_buckets, self.prefill, self.table_blocks)
        batch = build_step_batch(plan, shape)
        args = (self.model.dims, self.model.params, self.kv)
        if steps == 1:
            packed, self.kv = launch_step(
                self.step_fn, *args, batch, rows, vocab_size=self.vocab, num_rows=shape.logit_rows
            )
            # what a run-ahead call chained behind this step (Scheduler.chain_after_prefill) starts from
            self._carried, self._step_packed = None, (packed, len(plan.logit_request_ids))
            return lambda: [self._sampled(plan, collect_step(packed))]
        if steps != self.decode_steps:
            raise ValueError(f"a call runs 1 or {self.decode_steps} steps, not {steps}")
        slots = np.zeros((steps, shape.num_kinds, shape.decode_rows), np.int32)
        slots[:, :, : plan.num_decode] = plan.decode_slots_ahead(steps, self.config.block_size)
        if chained and self._carried is None and self._step_packed is not None:
            packed, sampled_rows = self._step_packed  # the step's sampled tokens, in this plan's row order
            self._carried = carry_from_step(packed, sampled_rows, shape.decode_rows)
        self._step_packed = None
        carried = self._carried if chained else self._no_carry_for(shape.decode_rows)
        if carried is None or carried.shape != (shape.decode_rows + 1,):
            raise RuntimeError("a chained call needs the previous run-ahead call of the same rows")
        packed, self.kv, self._carried = launch_multi_step(
            self.multi_step_fn,
            *args,
            batch,
            slots,
            rows,
            vocab_size=self.vocab,
            num_rows=shape.logit_rows,
            carried=carried,
        )
        return lambda: [self._sampled(plan, result) for result in collect_multi_step(packed)]

    def _no_carry_for(self, decode_rows: int):
        if decode_rows not in self._no_carry:
            self._no_carry[decode_rows] = jax.device_put(no_carry(decode_rows))
        return self._no_carry[decode_rows]

    def _run_ahead(self, batch, slots_ahead: np.ndarray, rows: list[RowState], shape: StepShape):
        results, self.kv = run_multi_step(
            self.multi_step_fn,
            self.model.dims,
            self.model.params,
            self.kv,
            batch,
            slots_ahead,
            rows,
            vocab_size=self.vocab,
            num_rows=shape.logit_rows,
        )
        return results

    def _run(self, batch, rows: list[RowState], shape: StepShape):
        result, self.kv = run_step(
            self.step_fn,
            self.model.dims,
            self.model.params,
            self.kv,
            batch,
            rows,
            vocab_size=self.vocab,
            num_rows=shape.logit_rows,
        )
        return result

    @staticmethod
    def _sampled(plan: StepPlan, result) -> dict[str, Sampled]:
        return {
            rid: Sampled(int(result.tokens[i]), float(result.logprob[i]), result.top_ids[i], result.top_logprobs[i])
            for i, rid in enumerate(plan.logit_request_ids)
        }


def _tiles(plan: StepPlan) -> list[StepPlan]:
    """Split a plan into sub-plans of at most DECODE_TILE decode rows and PREFILL_TILE chunk tokens, in
    order (a chunk's earlier tiles write their KV before later tiles attend to it). Deterministic engines
    schedule one chunk per step (engine_config.prefill_shapes)."""
    if len(plan.prefills) > 1:
        raise ValueError("deterministic mode runs one prefill chunk per step")
    chunk = plan.prefills[0] if plan.prefills else None
    n_chunk_tiles = math.ceil(chunk.num_tokens / PREFILL_TILE) if chunk is not None else 0
    count = max(math.ceil(len(plan.decodes) / DECODE_TILE), n_chunk_tiles, 1)
    tiles = []
    for i in range(count):
        piece = None
        if chunk is not None and i < n_chunk_tiles:
            lo, hi = i * PREFILL_TILE, min((i + 1) * PREFILL_TILE, chunk.num_tokens)
            piece = PrefillChunk(
                chunk.request_id,
                chunk.start + lo,
                chunk.token_ids[lo:hi],
                chunk.slots[lo:hi],
                chunk.completes and hi == chunk.num_tokens,
            )
        tiles.append(
            replace(
                plan,
                decodes=plan.decodes[i * DECODE_TILE : (i + 1) * DECODE_TILE],
                prefills=(piece,) if piece is not None else (),
            )
        )
    return tiles
