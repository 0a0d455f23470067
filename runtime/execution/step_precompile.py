"""Compiling a StepExecutor's executables before and after a server reports ready: the ready shapes, the rest
(in the background where the executor compiles ahead without running: runtime/execution/background_compile.py),
speculative verify steps and the host tier's block and snapshot copies. A mixin of StepExecutor (its attributes: model,
config, kv, step_fn, verify_fn, multi_step_fn, tiles, table_blocks, ...)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import jax
import numpy as np

from ...compiler.targets import get_target
from ..scheduling.scheduled_step import bucket
from ..state.host_tier import SNAPSHOTS
from ..state.kinds import engine_snapshot_slots
from .background_compile import BackgroundCompiler, CompileTask, compile_tasks, ready_first, report_compiled
from .compiled_steps import CompiledSteps, abstract_values
from .engine_step import pack_step_inputs
from .step_inputs import VERIFY_WIDTHS, StepShape, padding_batch


class StepPrecompiler:
    def ready_shapes(self) -> list[StepShape]:
        """The shapes compiled before a server reports ready (the target's ready_shapes; every shape in
        deterministic tiles or where the target names none)."""
        ready = get_target(self.model.plan.target).ready_shapes
        return ready_first(self.shapes(), None if self.tiles is not None else ready)

    def _ready_variants(self) -> tuple[bool, ...]:
        """The sampler variants compiled before ready: the sampling one serves greedy steps too (_stand_in),
        except in deterministic mode, where each step takes its own."""
        return (True, False) if self.deterministic else (False,)

    def compile_ahead(self, task: CompileTask) -> None:
        """Compile one step shape's executable without running it (CompiledSteps only)."""
        shape = task.shape
        inputs = pack_step_inputs(padding_batch(shape), [], vocab_size=self.vocab, num_rows=shape.logit_rows)
        layout, num_top, _ = inputs.static_args()
        fixed = abstract_values((self.model.params, self.kv))  # the KV arrays may be donated meanwhile
        self.step_fn.compile(self.model.dims, layout, num_top, task.all_greedy, *fixed, inputs.buffer)
        self.compiled_ahead.add((shape, task.all_greedy))

    def compile_later(self, busy: Callable[[], bool] = lambda: False) -> BackgroundCompiler:
        """A started BackgroundCompiler over the executables precompile(ready_only=True) left, each compiled
        when `busy()` (requests in the engine) is false."""
        ahead = isinstance(self.step_fn, CompiledSteps) and self.multi_step_fn is None
        tasks = compile_tasks(self.shapes()) if ahead else []
        tasks = [t for t in tasks if (t.shape, t.all_greedy) not in self.compiled_ahead]
        # shapes with no executable first; a ready shape's greedy variant (its sampling one serves it) last
        served = {shape for shape, _ in self.compiled_ahead}
        tasks.sort(key=lambda t: t.shape in served)
        return BackgroundCompiler(self.compile_ahead, tasks, busy).start()

    def precompile(self, progress: bool = False, ready_only: bool = False) -> float:
        """Compile every step shape's greedy executable, or (ready_only) both sampler variants of the shapes of
        ready_shapes(); where the executor compiles ahead (CompiledSteps) without running them, elsewhere by
        running each shape once on a padding batch (greedy). Then the verify steps of one speculating row and the
        host tier's block copies, in both cases."""
        start = time.perf_counter()
        shapes = self.ready_shapes() if ready_only else self.shapes()
        if isinstance(self.step_fn, CompiledSteps) and self.multi_step_fn is None:
            self._compile_steps_ahead(shapes, progress, ready_only)
        else:
            self._run_each_shape(shapes, progress)
        # a sampling model drafter's rows also bring their q: the sampled variant with draft_probs
        variants = [(True, False), (False, False)]  # (all_greedy, with_q)
        if getattr(getattr(self.config, "speculative", None), "method", None) == "draft":
            variants.append((False, True))
        for shape in self.verify_shapes_alone():
            for all_greedy, with_q in variants:
                self._precompile_verify(shape, all_greedy, with_q)
        if self.host_tier is not None:  # copies of up to the tier's blocks, and of its snapshots
            usable = self.kv[self.block_copier.layers[0]][0].shape[0] - 1  # one paged kind: [num_blocks, ...]
            self.block_copier.precompile(self.kv, min(self.host_tier.capacity_blocks, usable))
            if self.snapshot_copier is not None:
                held = self.host_tier.capacity_of(SNAPSHOTS)
                self.snapshot_copier.precompile(self.kv, min(held, engine_snapshot_slots(self.config)))
        return time.perf_counter() - start

    def _compile_steps_ahead(self, shapes: list[StepShape], progress: bool, ready_only: bool) -> None:
        tasks = compile_tasks(shapes, self._ready_variants() if ready_only else (True,))
        if progress:
            print(f"ember: compiling {len(tasks)} step shapes before serving", file=sys.stderr, flush=True)
        for index, task in enumerate(tasks):
            begun = time.perf_counter()
            self.compile_ahead(task)
            if progress:  # a line per shape, with its seconds: each may take tens of seconds on a small CPU
                report_compiled(index, len(tasks), task, time.perf_counter() - begun, "before serving")

    def _run_each_shape(self, shapes: list[StepShape], progress: bool) -> None:
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

    def verify_shapes_alone(self) -> list[StepShape]:
        """The verify steps of one speculating row (batch 1: no decode row, one segment), every width up to the
        engine's k + 1: compiled ahead; verify steps of several rows compile when first met."""
        spec = getattr(self.config, "speculative", None)
        if spec is None:
            return []
        widths = [w for w in VERIFY_WIDTHS if w <= bucket(spec.num_speculative_tokens + 1, VERIFY_WIDTHS)]
        kinds = (self.table_blocks, self.num_kinds, 1)
        return [StepShape(0, w, *kinds, num_slot_kinds=self.num_slot_kinds, verify_width=w) for w in widths]

    def _precompile_verify(self, shape: StepShape, all_greedy: bool, with_q: bool = False) -> None:
        drafts = np.full((shape.verify_rows, shape.verify_width - 1), -1, np.int32)
        counts = np.zeros(shape.verify_rows, np.int32)
        extra = (drafts, counts)
        if with_q:
            extra += (np.zeros((*drafts.shape, self.vocab), np.float32), np.zeros(shape.verify_rows, bool))
        inputs = pack_step_inputs(
            padding_batch(shape), [], vocab_size=self.vocab, num_rows=shape.logit_rows, extra=extra
        )
        packed, self.kv = self.verify_fn(
            self.model.dims, inputs.layout, 0, all_greedy, shape.verify_width, self.model.params, self.kv, inputs.buffer
        )
        jax.block_until_ready(packed)
