"""Runs a ScheduledStep on the device: pads it to a compiled shape, runs forward + sampling.

A step runs as one call of the smallest bucket that fits. Deterministic mode runs the plan's deterministic
variant, whose kernels compute each row the same way whatever else is in the step (docs/kernel_policy.md,
"Batch invariance"): same tokens and logprobs alone or under load. Where the target's kernel policy says
those kernels are batch-invariant at every bucket (`deterministic.bucketed`), deterministic steps take the
default buckets, raised to `deterministic.min_rows` rows; otherwise every step runs in tiles of one fixed
shape (runtime/execution/deterministic_tiles.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from ...compiler.targets import get_target
from ..loading.model import Model
from ..sampling.params import RowState
from ..scheduling.scheduled_step import PrefillShapes, ScheduledStep
from ..state.host_tier import HostTier
from ..state.kinds import engine_pool_blocks, engine_slots, engine_snapshot_slots, engine_verify_scratch_slots
from ..state.kv_dtypes import kv_dtype
from .background_compile import (
    compiled_stand_in,
)
from .block_copies import BlockCopier
from .compiled_steps import CompiledSteps
from .deterministic_tiles import fixed_tiles, step_tiles, tile_shape
from .engine_step import (
    carry_from_step,
    collect_multi_step,
    collect_step,
    launch_multi_step,
    launch_step,
    make_multi_step_fn,
    make_step_fn,
    make_verify_step_fn,
    no_carry,
    pack_step_inputs,
    run_multi_step,
    run_step,
    split_hidden,
)
from .executable_cache import AHEAD_PLATFORMS, cached_step, executor_identity, step_store
from .slot_copies import SlotCopier
from .snapshot_copies import SnapshotCopier
from .step_hidden import forward_with_hidden
from .step_inputs import (
    StepShape,
    all_step_shapes,
    build_step_batch,
    step_shape,
    verify_draft_probs,
    verify_drafts,
)
from .step_precompile import StepPrecompiler
from .verify_rows import verify_results, verify_row_batch


def slot_extras(config) -> int:
    """Slots of each slot kind after the live ones: the prefix cache's snapshots, then the verify scratch."""
    return engine_snapshot_slots(config) + engine_verify_scratch_slots(config)


@dataclass(frozen=True)
class Sampled:
    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray


@dataclass(frozen=True)
class InFlightStep:
    """A device call launched and not yet collected: what StepExecutor.launch returns, and what collect() and a
    run-ahead call chained behind it (launch(..., after=)) read. Its arrays stay on the device until collected."""

    step: ScheduledStep
    rows: tuple[RowState, ...]  # one per step.logit_request_ids entry
    steps: int  # decode steps in the call (1: a single step)
    packed: Any = None  # the call's packed results (engine_step.pack_result layout; [steps, ...] when steps > 1)
    carried: Any = None  # a run-ahead call's last tokens, int32 [decode rows + 1] (make_multi_step_fn)
    results: tuple[dict[str, Sampled], ...] | None = None  # already on the host (deterministic tiles)
    verify_shape: StepShape | None = None  # a verify step's shape (its results: a tuple of Sampled per row)
    num_drafts: dict[str, int] | None = None  # a verify step's drafts per verify segment, as verified
    shape: StepShape | None = None  # a single step's shape (where its rows' hidden states are, when returned)


class StepExecutor(StepPrecompiler):
    def __init__(self, model: Model, config, prefill: PrefillShapes):
        self.model, self.config = model, config
        entry = model.plan.manifest["entries"]["forward"]
        self.deterministic = config.deterministic
        determinism = model.policy.deterministic
        # deterministic steps in fixed tiles, or (bucketed) no step runs a matmul on fewer rows than min_rows
        self.tiles = fixed_tiles(determinism, self.deterministic)
        self.min_rows = determinism.min_rows if self.deterministic else 1
        self.decode_buckets = tuple(
            sorted(
                {max(b, self.min_rows) for b in entry["decode_buckets"] if b < config.max_num_seqs}
                | {max(config.max_num_seqs, self.min_rows)}
            )
        )
        self.prefill = prefill
        self.table_blocks = math.ceil(config.max_model_len / config.block_size)
        plan = model.deterministic_plan() if self.deterministic else model.plan
        # each layer's pool is sized by its state kind (the engine's KVCache uses the same sizes)
        # and each slot kind's arrays hold engine_slots(config) slots (the engine's SlotPools hand them out), then
        # the prefix cache's recurrent-state snapshots (runtime/state/snapshot_store.py)
        self.kv = model.new_kv(
            engine_pool_blocks(model.paged_kinds, config),
            config.block_size,
            kv_dtype(model.dtype, config.kv_cache_dtype),
            num_slots=engine_slots(config) + (slot_extras(config) if model.slot_kinds else 0),
        )
        self.slot_copier = SlotCopier(model.layer_state_kinds, [k.name for k in model.slot_kinds])
        # the prefix cache's host tier (runtime/state/host_tier.py), when the engine keeps one (attach_host_tier)
        self.host_tier: HostTier | None = None
        self.block_copier: BlockCopier | None = None
        self.snapshot_copier: SnapshotCopier | None = None  # its recurrent-state snapshots (hybrid plans)
        # the step functions' executables are also kept on disk (runtime/execution/executable_cache.py): a warm start
        # neither traces nor lowers them
        # (not for a model on a device mesh: the identity does not see how its arrays are split)
        keep = config.keep_executables and model.placement is None
        identity = executor_identity(plan.module, model.policy, (model.params, self.kv)) if keep else None
        # where executables are compiled ahead (CompiledSteps), the step's own are kept on the AHEAD_PLATFORMS
        ahead = (
            executor_identity(plan.module, model.policy, (model.params, self.kv), AHEAD_PLATFORMS)
            if keep and identity is None
            else None
        )
        # traced inside the model's kernel policy: which kernels and configs the step launches
        forward = model.traced(plan.module.forward)
        self.forward = forward  # the traced forward (a model drafter's own steps: runtime/execution/draft_steps.py)
        # the MTP drafter reads the target's hidden states: every single step and verify step returns its rows'
        # (runtime/execution/step_hidden.py), handed to hidden_sink(step, shape, hidden [N, d]) when collected
        spec = getattr(config, "speculative", None)
        self.with_hidden = spec is not None and spec.method == "mtp" and self.tiles is None
        self.hidden_sink = None
        stepped = model.traced(forward_with_hidden(plan.module)) if self.with_hidden else forward
        tag = "+hidden" if self.with_hidden else ""
        # without executables on disk (the cpu backend), still through executables compiled ahead: a step shape
        # compiles without running a padding batch, and from a background thread (compiled_steps.py)
        self.step_fn = (
            cached_step(
                make_step_fn(stepped, self.with_hidden, fixed_order=config.deterministic), 4, identity, "step" + tag
            )
            if identity is not None
            else CompiledSteps(
                make_step_fn(stepped, self.with_hidden, fixed_order=config.deterministic),
                4,
                store=step_store(ahead, "step" + tag),
            )
        )
        self.verify_fn = cached_step(
            make_verify_step_fn(stepped, self.with_hidden, fixed_order=config.deterministic),
            5,
            identity,
            "verify" + tag,
        )
        # decode steps per device call when the engine runs ahead (1 = never): see runtime/scheduling/lookahead.py
        steps = config.decode_steps if config.decode_steps is not None else get_target(model.plan.target).decode_steps
        # run-ahead chains decode steps without the scheduler; slot state is carried in self.kv from one to the next
        # (a row's steps past its request's end advance a slot nobody reads again before a fresh start or a restore)
        # deterministic: where the kernel policy says so (`deterministic.run_ahead`), run-ahead calls compile each
        # step as a one-step call does (engine_step._step_inputs); otherwise one step per call, since which calls
        # run ahead depends on the load and a loop's step may fuse otherwise (docs/kernel_policy.md)
        # with hidden states: one step per call (every step's rows' hidden states reach the drafter)
        runs_ahead = not config.deterministic or (self.tiles is None and determinism.run_ahead)
        self.decode_steps = max(1, steps) if runs_ahead and not self.with_hidden else 1
        self.multi_step_fn = (
            cached_step(
                make_multi_step_fn(forward, self.decode_steps, fixed_order=config.deterministic),
                4,
                identity,
                f"run-ahead {self.decode_steps}",
            )
            if self.decode_steps > 1
            else None
        )
        self.num_kinds = len(model.paged_kinds)
        self.num_slot_kinds = len(model.slot_kinds)
        self.vocab = int(model.dims.vocab)
        # (shape, all_greedy) compiled by compile_ahead: a step whose own is not yet runs padded to one of them
        self.compiled_ahead: set[tuple[StepShape, bool]] = set()
        self._no_carry: dict[int, object] = {}  # decode rows -> no_carry() on the device, made once

    def attach_host_tier(self, tier: HostTier) -> None:
        """Issue `tier`'s queued copies before every step's forward: blocks over the paged layers' pools, snapshots
        (a tier that keeps them) over the slot layers' arrays."""
        kinds = self.model.layer_state_kinds
        paged, slots = {k.name for k in self.model.paged_kinds}, {k.name for k in self.model.slot_kinds}
        self.host_tier = tier
        self.block_copier = BlockCopier([i for i, k in enumerate(kinds) if k in paged])
        if tier.keeps_snapshots:
            self.snapshot_copier = SnapshotCopier([i for i, k in enumerate(kinds) if k in slots])

    def shapes(self) -> list[StepShape]:
        if self.tiles is not None:
            return [tile_shape(self.tiles, self.table_blocks, self.num_kinds, self.num_slot_kinds)]
        shapes = all_step_shapes(
            self.decode_buckets, self.prefill, self.table_blocks, self.num_kinds, self.num_slot_kinds
        )
        return [replace(shape, min_logit_rows=self.min_rows) for shape in shapes]

    def shape_of(self, step: ScheduledStep) -> StepShape:
        shape = step_shape(step, self.decode_buckets, self.prefill, self.table_blocks)
        return replace(shape, min_logit_rows=self.min_rows)

    def _stand_in(self, step: ScheduledStep, rows: list[RowState]) -> tuple[StepShape, bool | None]:
        """The step's shape and the sampler variant to force (None: the rows' own), from the executables
        compiled ahead while others are not yet (compiled_stand_in); deterministic steps take their own."""
        shape = self.shape_of(step)
        if self.deterministic or any(row.params.has_penalties or row.params.logprobs for row in rows):
            return shape, None  # their own executable: another sampler layout than the ones compiled ahead
        greedy = all(row.params.is_greedy for row in rows)
        shape, variant = compiled_stand_in(shape, greedy, self.compiled_ahead)
        return shape, None if variant == greedy else variant

    def run(self, step: ScheduledStep, rows: list[RowState]) -> dict[str, Sampled]:
        """Run one step and wait for it: {request id: Sampled}."""
        if self.tiles is None:
            shape, variant = self._stand_in(step, rows)
            return self._sampled(step, self._run(build_step_batch(step, shape), rows, shape, variant))
        row_of = dict(zip(step.logit_request_ids, rows))
        results: dict[str, Sampled] = {}
        shape = tile_shape(self.tiles, self.table_blocks, self.num_kinds, self.num_slot_kinds)
        for tile in step_tiles(step, self.tiles):
            tile_rows = [row_of[rid] for rid in tile.logit_request_ids]
            results.update(self._sampled(tile, self._run(build_step_batch(tile, shape), tile_rows, shape)))
        return results

    def launch(
        self, step: ScheduledStep, rows: list[RowState], steps: int, *, after: InFlightStep | None = None
    ) -> InFlightStep:
        """_launch between the step's recurrent-state snapshot copies: restores before its forward, saves after;
        first the prefix cache's host tier copies (blocks the scheduler evicted or restored for this step)."""
        if self.host_tier is not None:
            self.kv = self.host_tier.dispatch(self.kv, self.block_copier, self.snapshot_copier)
        self.kv = self.slot_copier.apply(self.kv, step.slot_copies.before)
        in_flight = self._launch(step, rows, steps, after=after)
        self.kv = self.slot_copier.apply(self.kv, step.slot_copies.after)
        return in_flight

    def _launch(
        self, step: ScheduledStep, rows: list[RowState], steps: int, *, after: InFlightStep | None = None
    ) -> InFlightStep:
        """Dispatch `step` (steps > 1: a run-ahead step, Scheduler.extend_decodes) on the executable of its
        bucket and return at once, before the device is done: collect() waits for it. The host may work
        meanwhile (the engine streams the previous call's tokens). Deterministic tiles run here.
        after: the call still in flight whose last sampled tokens, on the device, are this run-ahead call's
        inputs — the previous run-ahead call of the same rows (Scheduler.chain_decodes), or the single step
        whose prefill chunks these rows complete (Scheduler.chain_after_prefill)."""
        if self.tiles is not None:  # tiles of one fixed shape, run one after another
            return InFlightStep(step, tuple(rows), steps, results=(self.run(step, rows),))
        shape, variant = self._stand_in(step, rows)
        batch = build_step_batch(step, shape)
        if shape.verify_width:
            return self._launch_verify(step, rows, shape, batch)
        args = (self.model.dims, self.model.params, self.kv)
        if steps == 1:
            packed, self.kv = launch_step(
                self.step_fn, *args, batch, rows, vocab_size=self.vocab, num_rows=shape.logit_rows, all_greedy=variant
            )
            return InFlightStep(step, tuple(rows), 1, packed, shape=shape)
        if steps != self.decode_steps:
            raise ValueError(f"a call runs 1 or {self.decode_steps} steps, not {steps}")
        slots = np.zeros((steps, shape.num_kinds, shape.decode_rows), np.int32)
        slots[:, :, : step.num_decode] = step.decode_slots_ahead(steps, self.config.block_size)
        carried = self._no_carry_for(shape.decode_rows) if after is None else self._carried_from(after, shape)
        packed, self.kv, carried = launch_multi_step(
            self.multi_step_fn,
            *args,
            batch,
            slots,
            rows,
            vocab_size=self.vocab,
            num_rows=shape.logit_rows,
            carried=carried,
        )
        return InFlightStep(step, tuple(rows), steps, packed, carried)

    def _launch_verify(self, step: ScheduledStep, rows: list[RowState], shape: StepShape, batch) -> InFlightStep:
        """A verify step (runtime/scheduling/speculation.py): each logit row's W positions sampled as the
        drafts before them had been emitted; a draft the grammar refuses ends its row's drafts."""
        flat, num_drafts = verify_row_batch(step, rows, shape)
        extra = (*verify_drafts(step, shape, num_drafts), *verify_draft_probs(step, shape, num_drafts, self.vocab))
        inputs = pack_step_inputs(batch, flat, vocab_size=self.vocab, num_rows=shape.logit_rows, extra=extra)
        layout, num_top, all_greedy = inputs.static_args()
        packed, self.kv = self.verify_fn(
            self.model.dims, layout, num_top, all_greedy, shape.verify_width, self.model.params, self.kv, inputs.buffer
        )
        return InFlightStep(step, tuple(rows), 1, packed, verify_shape=shape, num_drafts=num_drafts)

    def collect(self, in_flight: InFlightStep) -> list[dict[str, Sampled]]:
        """Wait for a launched call: one {request id: Sampled} per decode step it ran (a verify step: one
        {request id: tuple of the Sampled it emitted})."""
        if in_flight.results is not None:
            return list(in_flight.results)
        if self.with_hidden:
            self._hand_hidden(in_flight)
        if in_flight.verify_shape is not None:
            return [verify_results(in_flight.step, in_flight.verify_shape, collect_step(in_flight.packed), Sampled)]
        if in_flight.steps == 1:
            return [self._sampled(in_flight.step, collect_step(in_flight.packed))]
        return [self._sampled(in_flight.step, result) for result in collect_multi_step(in_flight.packed)]

    def _hand_hidden(self, in_flight: InFlightStep) -> None:
        """The call's rows' hidden states to hidden_sink (with the step and its shape, which say whose they are)."""
        packed, hidden = split_hidden(in_flight.packed)
        shape = in_flight.verify_shape or in_flight.shape
        if hidden is not None and self.hidden_sink is not None and shape is not None:
            self.hidden_sink(in_flight.step, shape, np.asarray(hidden, np.float32))

    def _carried_from(self, after: InFlightStep, shape: StepShape):
        """make_multi_step_fn's `carried` for a call chained behind `after`: a run-ahead call's own, or a single
        step's sampled tokens in this call's row order (they are its first logit rows)."""
        carried = after.carried
        if after.steps == 1 and after.packed is not None:
            carried = carry_from_step(after.packed, len(after.step.logit_request_ids), shape.decode_rows)
        if carried is None or carried.shape != (shape.decode_rows + 1,):
            raise RuntimeError("a chained call needs the previous run-ahead call of the same rows")
        return carried

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

    def _run(self, batch, rows: list[RowState], shape: StepShape, all_greedy: bool | None = None):
        result, self.kv = run_step(
            self.step_fn,
            self.model.dims,
            self.model.params,
            self.kv,
            batch,
            rows,
            vocab_size=self.vocab,
            num_rows=shape.logit_rows,
            all_greedy=all_greedy,
        )
        return result

    @staticmethod
    def _sampled(step: ScheduledStep, result) -> dict[str, Sampled]:
        return {
            rid: Sampled(int(result.tokens[i]), float(result.logprob[i]), result.top_ids[i], result.top_logprobs[i])
            for i, rid in enumerate(step.logit_request_ids)
        }
