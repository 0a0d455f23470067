"""One engine step on device: the plan's forward and the sampler in a single jitted executable.

No host round trip inside a step: logits never leave the device; only the sampled tokens, their
logprobs and the top-K alternatives come back. Shapes are static per (StepShape, history bucket).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.batch import StepBatch
from ...compiler.kernels.sampling import GREEDY_EPSILON, SampleResult, SamplingBatch, sample
from ...compiler.kernels.speculative.reference import verify
from ..sampling.params import MAX_TOP_LOGPROBS, RowState, history_length_needed, pack_batch
from ..scheduling.scheduled_step import bucket
from .step_io import IoLayout, pack_arrays, pack_result, unpack_arrays, unpack_result

# History slots for penalties: one slot when no row in the step uses a penalty, else the smallest of
# these that fits (few shapes to compile).
HISTORY_BUCKETS = (1, 1024, 4096, 16384, 65536)
SUPPRESS_SLOTS = 32  # eos ids + up to 16 stop token ids while min_tokens is in force


def history_bucket(rows: list[RowState]) -> int:
    return bucket(max(history_length_needed(rows), 1), HISTORY_BUCKETS)


@dataclass(frozen=True)
class StepResult:
    tokens: np.ndarray  # int32 [R]
    logprob: np.ndarray  # float32 [R]
    top_ids: np.ndarray  # int32 [R, K]
    top_logprobs: np.ndarray  # float32 [R, K]


def top_logprobs_needed(rows: list[RowState]) -> int:
    """K for the step: the top-K alternatives are only computed when some row asks for them (a top-k
    over a 150k vocabulary was ~1 ms of a 3.5 ms batch-32 step on the H200: XLA sorts for k > 16)."""
    return MAX_TOP_LOGPROBS if any(row.params.logprobs for row in rows) else 0


def unpack_step(inputs, layout: IoLayout) -> tuple[StepBatch, SamplingBatch, list]:
    """Inside the executable: the StepBatch, the SamplingBatch and any extra arrays packed after them."""
    arrays = unpack_arrays(inputs, layout)
    n_batch, n_sampling = len(StepBatch._fields), len(SamplingBatch._fields)
    return (
        StepBatch(*arrays[:n_batch]),
        SamplingBatch(*arrays[n_batch : n_batch + n_sampling]),
        arrays[n_batch + n_sampling :],
    )


def make_step_fn(forward: Callable, with_hidden: bool = False, fixed_order: bool = False) -> Callable:
    """jit(forward + sample): (dims, layout, num_top, all_greedy, params, kv, inputs) -> (packed result, kv);
    kv is donated. with_hidden: `forward` is step_hidden.forward_with_hidden's and the packed result is the pair
    (packed result, hidden [N, d] of every row), see `split_hidden`.

    `inputs` is the step's StepBatch and SamplingBatch packed into one int32 buffer (`step_io`), unpacked
    inside the executable by the static `layout`; the result is pack_result's single int32 array with
    `num_top` (static: 0 or MAX_TOP_LOGPROBS) alternatives per row; `all_greedy` (static) selects the
    sampler's branch-free greedy path; `fixed_order` (deterministic steps) its sums in a fixed order."""

    def step(dims, layout: IoLayout, num_top: int, all_greedy: bool, params, kv, inputs):
        batch, sampling, _ = unpack_step(inputs, layout)
        params, batch = _step_inputs(params, batch, fixed_order)
        logits, hidden, kv = _forward(forward, with_hidden, dims, params, kv, batch)
        logits = logits.astype(jnp.float32)
        packed = pack_result(sample(logits, sampling, num_top, all_greedy=all_greedy, fixed_order=fixed_order))
        return _with(packed, hidden), kv

    return jax.jit(step, static_argnums=(0, 1, 2, 3), donate_argnums=5)


def _step_inputs(params, batch: StepBatch, fixed_order: bool):
    """A deterministic step's forward takes its weights and batch behind an optimization barrier, in a one-step
    call and inside a run-ahead call's loop alike: XLA then neither fuses the forward's first ops with how the
    inputs were made (unpacked from the input buffer, or carried from the previous step) nor hoists work on the
    weights out of the loop, so the step compiles the same way in both executables (docs/kernel_policy.md)."""
    return jax.lax.optimization_barrier((params, batch)) if fixed_order else (params, batch)


def _forward(forward: Callable, with_hidden: bool, dims, params, kv, batch):
    """(logits, hidden or None, kv) of the plan's forward, or of forward_with_hidden's."""
    if with_hidden:
        return forward(dims, params, kv, batch)
    logits, kv = forward(dims, params, kv, batch)
    return logits, None, kv


def _with(packed, hidden):
    return packed if hidden is None else (packed, hidden)


def split_hidden(packed) -> tuple[Any, Any]:
    """(packed result, hidden states or None) of a step function's first output."""
    return packed if isinstance(packed, tuple) else (packed, None)


def make_verify_step_fn(forward: Callable, with_hidden: bool = False, fixed_order: bool = False) -> Callable:
    """jit(forward + verify) of a verify step (StepShape.verify_width = W): (dims, layout, num_top, all_greedy,
    width, params, kv, inputs) -> (packed result, kv), kv donated. The inputs carry, after the StepBatch and the
    SamplingBatch (R * W rows, row-major), drafts int32 [R, W - 1] and num_drafts int32 [R], then, when some
    row's drafts came with their distributions (a sampling model drafter), draft_probs f32 [R, W - 1, V] and
    has_draft_probs bool [R] (the layout says which: a separate executable); the logits of the batch's R * W
    logit rows are verified as [R, W, V]. The packed result is pack_result's, one row per (verify row,
    position): the emitted tokens (-1 past each row's count), their logprobs and top alternatives; paired
    with every row's hidden state when with_hidden (as make_step_fn); fixed_order as make_step_fn's."""

    def step(dims, layout: IoLayout, num_top: int, all_greedy: bool, width: int, params, kv, inputs):
        batch, sampling, (drafts, num_drafts, *q) = unpack_step(inputs, layout)
        draft_probs, has_draft_probs = q if q else (None, None)
        params, batch = _step_inputs(params, batch, fixed_order)
        logits, hidden, kv = _forward(forward, with_hidden, dims, params, kv, batch)
        logits = logits.astype(jnp.float32).reshape(-1, width, logits.shape[-1])
        result = verify(
            logits,
            sampling,
            drafts,
            num_drafts,
            draft_probs,
            has_draft_probs,
            num_top,
            all_greedy=all_greedy,
            fixed_order=fixed_order,
        )
        rows = result.tokens.size
        flat = SampleResult(
            result.tokens.reshape(rows),
            result.logprob.reshape(rows),
            result.top_ids.reshape(rows, num_top),
            result.top_logprobs.reshape(rows, num_top),
        )
        return _with(pack_result(flat), hidden), kv

    return jax.jit(step, static_argnums=(0, 1, 2, 3, 4), donate_argnums=6)


def make_multi_step_fn(forward: Callable, steps: int, fixed_order: bool = False) -> Callable:
    """jit of `steps` decode steps in one executable, each step's sampled tokens fed to the next on the
    device: (dims, layout, num_top, all_greedy, params, kv, inputs, carried) -> (packed results
    [steps, R, 2 + 2K], kv, carried). The inputs are a decode-only step (C = 0) plus `slots_ahead` int32
    [steps, K, B] (the last array packed): step i runs the rows at positions + i, writing slots_ahead[i],
    and samples with the rows' step counters + i. A lax.scan (trip count static: no host sync per step)
    over the same forward, so the executable is compiled once per decode bucket. Host overhead is paid
    once per `steps` tokens.

    `carried` int32 [B + 1] chains calls without a host round trip: when carried[B] is 1 the first step's
    tokens are carried[:B] instead of the batch's, and every call returns its last step's tokens in that
    form (flag 1), so the next call of the same rows can be dispatched before this one's results are read
    (runtime/scheduling/run_ahead.py); no_carry(B) is the form that keeps the batch's tokens. fixed_order
    (deterministic steps): each step as make_step_fn's, its inputs behind the same barrier (_step_inputs)."""

    def multi(dims, layout: IoLayout, num_top: int, all_greedy: bool, params, kv, inputs, carried):
        batch, sampling, (slots_ahead,) = unpack_step(inputs, layout)
        rows = batch.num_decode
        tokens_in = jnp.where(carried[rows] == 1, carried[:rows], batch.tokens)  # decode-only: N == B tokens

        def one(carry, i):
            tokens, kv = carry
            step_batch = batch._replace(
                tokens=tokens, positions=batch.positions + i, slots=slots_ahead[i], dec_ctx_lens=batch.dec_ctx_lens + i
            )
            step_params, step_batch = _step_inputs(params, step_batch, fixed_order)
            logits, kv = forward(dims, step_params, kv, step_batch)
            result = sample(
                logits.astype(jnp.float32),
                sampling._replace(step=sampling.step + i),
                num_top,
                all_greedy=all_greedy,
                fixed_order=fixed_order,
            )
            return (result.tokens[:rows], kv), pack_result(result)

        (last, kv), packed = jax.lax.scan(one, (tokens_in, kv), jnp.arange(steps, dtype=jnp.int32))
        return packed, kv, jnp.concatenate([last, jnp.ones((1,), jnp.int32)])

    return jax.jit(multi, static_argnums=(0, 1, 2, 3), donate_argnums=5)


@dataclass(frozen=True)
class StepInputs:
    buffer: np.ndarray  # int32 words of the StepBatch and SamplingBatch
    layout: IoLayout
    num_top: int  # top-K alternatives to compute
    all_greedy: bool

    def static_args(self) -> tuple[IoLayout, int, bool]:
        return self.layout, self.num_top, self.all_greedy


def pack_step_inputs(
    batch: StepBatch, rows: list[RowState], *, vocab_size: int, num_rows: int, extra: tuple[np.ndarray, ...] = ()
) -> StepInputs:
    """extra: arrays packed after the batch and sampling arrays (a multi-step call's slots_ahead)."""
    sampling = pack_batch(
        rows,
        vocab_size=vocab_size,
        history_bucket=history_bucket(rows),
        suppress_slots=SUPPRESS_SLOTS,
        num_rows=num_rows,
    )
    buffer, layout = pack_arrays([*batch, *sampling, *extra])
    return StepInputs(buffer, layout, top_logprobs_needed(rows), bool(np.all(sampling.temperature < GREEDY_EPSILON)))


def run_step(
    step_fn: Callable,
    dims: Any,
    params: Any,
    kv: Any,
    batch: StepBatch,
    rows: list[RowState],
    *,
    vocab_size: int,
    num_rows: int,
    all_greedy: bool | None = None,
) -> tuple[StepResult, Any]:
    packed, kv = launch_step(
        step_fn, dims, params, kv, batch, rows, vocab_size=vocab_size, num_rows=num_rows, all_greedy=all_greedy
    )
    return collect_step(packed), kv


def launch_step(
    step_fn: Callable,
    dims: Any,
    params: Any,
    kv: Any,
    batch: StepBatch,
    rows: list[RowState],
    *,
    vocab_size: int,
    num_rows: int,
    all_greedy: bool | None = None,
) -> tuple[Any, Any]:
    """Dispatch one step without waiting for it: (packed result on the device, new kv). collect_step reads it.
    all_greedy False runs an all-greedy step on the sampling executable (the same tokens); None: the rows'."""
    inputs = pack_step_inputs(batch, rows, vocab_size=vocab_size, num_rows=num_rows)
    layout, num_top, greedy = inputs.static_args()
    greedy = greedy if all_greedy is None else all_greedy
    return step_fn(dims, layout, num_top, greedy, params, kv, inputs.buffer)


def collect_step(packed) -> StepResult:
    return StepResult(*unpack_result(np.asarray(split_hidden(packed)[0])))


def no_carry(decode_rows: int) -> np.ndarray:
    """make_multi_step_fn's `carried` for a call whose tokens are the batch's own."""
    return np.zeros(decode_rows + 1, np.int32)


@functools.partial(jax.jit, static_argnums=(1, 2))
def carry_from_step(packed, sampled_rows: int, decode_rows: int):
    """make_multi_step_fn's `carried` from a single step's packed result (pack_result's [R, 2 + 2K]): the
    tokens of its first `sampled_rows` logit rows as the first rows of a decode batch of `decode_rows`, so a
    run-ahead call is dispatched behind the step before its tokens are read (Scheduler.chain_after_prefill)."""
    tokens = packed[:sampled_rows, 0]
    return jnp.concatenate([tokens, jnp.zeros((decode_rows - sampled_rows,), jnp.int32), jnp.ones((1,), jnp.int32)])


def run_multi_step(
    multi_fn: Callable,
    dims: Any,
    params: Any,
    kv: Any,
    batch: StepBatch,
    slots_ahead: np.ndarray,
    rows: list[RowState],
    *,
    vocab_size: int,
    num_rows: int,
) -> tuple[list[StepResult], Any]:
    """make_multi_step_fn's executable on a decode-only batch: one StepResult per step."""
    packed, kv, _ = launch_multi_step(
        multi_fn, dims, params, kv, batch, slots_ahead, rows, vocab_size=vocab_size, num_rows=num_rows
    )
    return collect_multi_step(packed), kv


def launch_multi_step(
    multi_fn: Callable,
    dims: Any,
    params: Any,
    kv: Any,
    batch: StepBatch,
    slots_ahead: np.ndarray,
    rows: list[RowState],
    *,
    vocab_size: int,
    num_rows: int,
    carried=None,
) -> tuple[Any, Any, Any]:
    """Dispatch without waiting: (packed results, kv, carried for a chained next call) on the device.
    carried: the previous call's, to take its last tokens as this call's inputs (None: the batch's)."""
    inputs = pack_step_inputs(batch, rows, vocab_size=vocab_size, num_rows=num_rows, extra=(slots_ahead,))
    if carried is None:
        carried = no_carry(len(batch.positions))
    return multi_fn(dims, *inputs.static_args(), params, kv, inputs.buffer, carried)


def collect_multi_step(packed) -> list[StepResult]:
    return [StepResult(*unpack_result(step)) for step in np.asarray(packed)]
