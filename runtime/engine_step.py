"""One engine step on device: the plan's forward and the sampler in a single jitted executable.

No host round trip inside a step: logits never leave the device; only the sampled tokens, their
logprobs and the top-K alternatives come back. Shapes are static per (StepShape, history bucket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..compiler.batch import StepBatch
from ..compiler.ops.sampling import SampleResult, SamplingBatch, sample
from .sampling_params import MAX_TOP_LOGPROBS, RowState, history_length_needed, pack_batch
from .step_inputs import bucket

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


def make_step_fn(forward: Callable) -> Callable:
    """jit(forward + sample): (dims, params, kv, batch, sampling) -> (SampleResult, kv); kv is donated."""

    def step(dims, params, kv, batch: StepBatch, sampling: SamplingBatch):
        logits, kv = forward(dims, params, kv, batch)
        return sample(logits.astype(jnp.float32), sampling, MAX_TOP_LOGPROBS), kv

    return jax.jit(step, static_argnums=0, donate_argnums=2)


def run_step(step_fn: Callable, dims: Any, params: Any, kv: Any, batch: StepBatch, rows: list[RowState],
             *, vocab_size: int, num_rows: int) -> tuple[StepResult, Any]:
    sampling = pack_batch(rows, vocab_size=vocab_size, history_bucket=history_bucket(rows),
                          suppress_slots=SUPPRESS_SLOTS, num_rows=num_rows)
    device_batch = StepBatch(*(jnp.asarray(a) for a in batch))
    device_sampling = SamplingBatch(*(jnp.asarray(a) for a in sampling))
    result, kv = step_fn(dims, params, kv, device_batch, device_sampling)
    result: SampleResult = jax.device_get(result)
    return StepResult(np.asarray(result.tokens), np.asarray(result.logprob), np.asarray(result.top_ids),
                      np.asarray(result.top_logprobs)), kv
