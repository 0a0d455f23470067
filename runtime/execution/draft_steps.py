"""A draft model's own device calls (runtime/speculative/model_drafter.py): the step that gives a draft from a
prefill chunk, and the k - 1 decodes after it as ONE call (a lax.scan feeding each draft to the next decode on
the device), so drafting k tokens costs two calls, not k.

Each draft is drawn by `draft_sample` (compiler/kernels/speculative/reference.py): from q, the draft model's
logits through the row's sampling settings at the draft's step (its own noise stream of the row's seed), or
the argmax for greedy rows (q one-hot). Inside the scan decode i samples with the row's step + i; its penalty
history stays the row's (the drafts before it are not added), so q may differ from the target's pipeline
there: verification stays exact, because it is handed the q each draft was drawn from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.kernels.speculative.reference import draft_sample
from ..sampling.params import RowState
from ..scheduling.scheduled_step import ScheduledStep
from .compiled_steps import CompiledSteps, abstract_values
from .engine_step import pack_step_inputs, unpack_step
from .step_executor import StepExecutor
from .step_inputs import StepShape, build_step_batch, padding_batch
from .step_io import IoLayout


def make_draft_step_fn(forward):
    """jit(forward + draft_sample): (dims, layout, with_probs, params, kv, inputs) -> (tokens int32 [R], q f32
    [R, V] or None, kv)."""

    def step(dims, layout: IoLayout, with_probs: bool, params, kv, inputs):
        batch, sampling, _ = unpack_step(inputs, layout)
        logits, kv = forward(dims, params, kv, batch)
        drafted = draft_sample(logits.astype(jnp.float32), sampling)
        return drafted.tokens, drafted.probs if with_probs else None, kv

    return jax.jit(step, static_argnums=(0, 1, 2), donate_argnums=4)


def make_draft_decodes_fn(forward):
    """jit of `steps` decode steps of a decode-only batch, each row's draft fed to its next step on the device:
    (dims, layout, steps, with_probs, params, kv, inputs) -> (tokens int32 [steps, B], q f32 [steps, B, V] or
    None, kv). The inputs carry slots_ahead int32 [steps, K, B] after the batch (decode i writes slots_ahead[i]
    at positions + i); the batch's tokens are the first decode's inputs."""

    def decodes(dims, layout: IoLayout, steps: int, with_probs: bool, params, kv, inputs):
        batch, sampling, (slots_ahead,) = unpack_step(inputs, layout)
        rows = batch.num_decode

        def one(carry, i):
            tokens, kv = carry
            step_batch = batch._replace(
                tokens=tokens, positions=batch.positions + i, slots=slots_ahead[i], dec_ctx_lens=batch.dec_ctx_lens + i
            )
            logits, kv = forward(dims, params, kv, step_batch)
            drafted = draft_sample(logits.astype(jnp.float32), sampling._replace(step=sampling.step + i))
            return (drafted.tokens[:rows], kv), (drafted.tokens, drafted.probs if with_probs else None)

        (_, kv), (tokens, probs) = jax.lax.scan(one, (batch.tokens, kv), jnp.arange(steps, dtype=jnp.int32))
        return tokens, probs, kv

    return jax.jit(decodes, static_argnums=(0, 1, 2, 3), donate_argnums=5)


class DraftSteps:
    """A draft model executor's drafting calls (its kv is the executor's, passed along), through executables
    compiled once per call signature: ahead by `precompile`, or at their first call."""

    def __init__(self, executor: StepExecutor):
        self.executor = executor
        self.step_fn = CompiledSteps(make_draft_step_fn(executor.forward), 3, name="draft step")
        self.decodes_fn = CompiledSteps(make_draft_decodes_fn(executor.forward), 4, name="draft decodes")

    def shape(self, decode_rows: int, prefill_tokens: int) -> StepShape:
        """The executor's step shape of that many decode rows and tokens of one prefill chunk."""
        ex = self.executor
        return StepShape(decode_rows, prefill_tokens, ex.table_blocks, ex.num_kinds, 1, ex.min_rows, ex.num_slot_kinds)

    def precompile(self, max_drafts: int) -> None:
        """Compile (nothing runs) the calls one request's drafts take: a catch-up chunk of each prefill bucket, and
        1 .. max_drafts - 1 chained decodes, each with and without q. A row whose sampling needs another input
        layout (penalties over a longer history) compiles its own when first met."""
        ex = self.executor
        fixed = abstract_values((ex.model.params, ex.kv))
        for tokens in ex.prefill.buckets:
            shape = self.shape(0, tokens)
            inputs = pack_step_inputs(padding_batch(shape), [], vocab_size=ex.vocab, num_rows=shape.logit_rows)
            for with_probs in (False, True):
                self.step_fn.compile(ex.model.dims, inputs.layout, with_probs, *fixed, inputs.buffer)
        shape = self.shape(ex.decode_buckets[0], 0)
        for steps in range(1, max_drafts):
            slots = np.zeros((steps, shape.num_kinds, shape.decode_rows), np.int32)
            batch = padding_batch(shape)
            inputs = pack_step_inputs(batch, [], vocab_size=ex.vocab, num_rows=shape.logit_rows, extra=(slots,))
            for with_probs in (False, True):
                self.decodes_fn.compile(ex.model.dims, inputs.layout, steps, with_probs, *fixed, inputs.buffer)

    def draw(self, step: ScheduledStep, rows: list[RowState], with_probs: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(tokens int32 [n], q f32 [n, V] or None) of the step's n logit rows (a chunk's last row, or decodes)."""
        ex = self.executor
        shape = ex.shape_of(step)
        inputs = pack_step_inputs(build_step_batch(step, shape), rows, vocab_size=ex.vocab, num_rows=shape.logit_rows)
        tokens, probs, ex.kv = self.step_fn(
            ex.model.dims, inputs.layout, with_probs, ex.model.params, ex.kv, inputs.buffer
        )
        n = len(step.logit_request_ids)
        return np.asarray(tokens)[:n], None if probs is None else np.asarray(probs)[:n]

    def draw_decodes(
        self, step: ScheduledStep, rows: list[RowState], steps: int, with_probs: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`steps` chained decodes of the decode-only `step` in one call: (tokens int32 [steps, n], q f32
        [steps, n, V] or None) of its n rows. Their block tables must already cover positions + steps - 1."""
        ex = self.executor
        shape = ex.shape_of(step)
        slots = np.zeros((steps, shape.num_kinds, shape.decode_rows), np.int32)
        slots[:, :, : step.num_decode] = step.decode_slots_ahead(steps, ex.config.block_size)
        batch = build_step_batch(step, shape)
        inputs = pack_step_inputs(batch, rows, vocab_size=ex.vocab, num_rows=shape.logit_rows, extra=(slots,))
        tokens, probs, ex.kv = self.decodes_fn(
            ex.model.dims, inputs.layout, steps, with_probs, ex.model.params, ex.kv, inputs.buffer
        )
        n = step.num_decode
        return np.asarray(tokens)[:, :n], None if probs is None else np.asarray(probs)[:, :n]
