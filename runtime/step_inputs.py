"""Turn a scheduler StepPlan into the padded, static-shape StepBatch a plan bucket runs.

Shapes are bucketed so few plans are compiled: decode rows B to a decode bucket, the prefill chunk C
to a prefill bucket (or 0), logit rows to B + 1; block tables have one width per engine (its longest
possible context), and slots and tables one row per paged KV state kind (K). Padding rows write to
block 0 (reserved) of every kind and read only block 0; their logits are never used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiler.batch import StepBatch
from .step_plan import StepPlan


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class StepShape:
    decode_rows: int  # B (padded)
    prefill_tokens: int  # C (padded), 0 when the step has no chunk
    table_blocks: int  # width of every block table
    num_kinds: int = 1  # K: paged KV state kinds (one block table and slot per kind)

    @property
    def logit_rows(self) -> int:
        return self.decode_rows + 1


def step_shape(plan: StepPlan, decode_buckets: tuple[int, ...], prefill_buckets: tuple[int, ...],
               table_blocks: int) -> StepShape:  # K follows the plan
    """Decode-only and prefill-only steps take their smallest bucket; a mixed step pads its decode rows
    to the largest decode bucket, so mixed shapes number one per prefill bucket (few plans to compile)."""
    c = bucket(plan.prefill.num_tokens, prefill_buckets) if plan.prefill is not None else 0
    if not plan.num_decode:
        b = 0
    elif c:
        b = decode_buckets[-1]
    else:
        b = bucket(plan.num_decode, decode_buckets)
    return StepShape(b, c, table_blocks, plan.num_kinds)


def all_step_shapes(decode_buckets: tuple[int, ...], prefill_buckets: tuple[int, ...],
                    table_blocks: int, num_kinds: int = 1) -> list[StepShape]:
    """Every shape step_shape can return: decode-only, prefill-only and mixed steps."""
    shapes = [StepShape(b, 0, table_blocks, num_kinds) for b in decode_buckets]
    shapes += [StepShape(b, c, table_blocks, num_kinds) for c in prefill_buckets for b in (0, decode_buckets[-1])]
    return shapes


def padding_batch(shape: StepShape) -> StepBatch:
    """A batch of only padding rows (writes go to block 0): runs a shape once to compile it."""
    n, k = shape.decode_rows + shape.prefill_tokens, shape.num_kinds
    zeros = np.zeros(n, np.int32)
    return StepBatch(tokens=zeros, positions=zeros, slots=np.zeros((k, n), np.int32),
                     dec_block_tables=np.zeros((k, shape.decode_rows, shape.table_blocks), np.int32),
                     dec_ctx_lens=np.ones(shape.decode_rows, np.int32),
                     pre_block_table=np.zeros((k, shape.table_blocks), np.int32),
                     logit_rows=np.zeros(shape.logit_rows, np.int32))


def build_step_batch(plan: StepPlan, shape: StepShape) -> StepBatch:
    """numpy StepBatch for `plan` padded to `shape` (the caller moves it to the device)."""
    b_real, b = plan.num_decode, shape.decode_rows
    c_real = plan.prefill.num_tokens if plan.prefill is not None else 0
    c, k = shape.prefill_tokens, shape.num_kinds
    if plan.num_kinds != k:
        raise ValueError(f"the plan has {plan.num_kinds} KV state kinds, the shape {k}")

    def rows(values: np.ndarray) -> np.ndarray:  # [..., b_real + c_real] -> [..., b + c], padding with 0
        out = np.zeros(values.shape[:-1] + (b + c,), np.int32)
        out[..., :b_real] = values[..., :b_real]
        out[..., b:b + c_real] = values[..., b_real:]
        return out

    tables = np.zeros((k, b, shape.table_blocks), np.int32)
    if b_real:
        tables[:, :b_real] = plan.decode_block_tables(shape.table_blocks)
    ctx = np.ones(b, np.int32)
    if b_real:
        ctx[:b_real] = plan.decode_context_lens()
    prefill_table = plan.prefill_block_table(shape.table_blocks)  # [K, W]; all block 0 without a chunk
    logit_rows = np.zeros(shape.logit_rows, np.int32)
    logit_rows[:b_real] = np.arange(b_real)
    if plan.prefill is not None and plan.prefill.completes:
        logit_rows[b_real] = b + c_real - 1
    return StepBatch(
        tokens=rows(plan.token_ids()), positions=rows(plan.positions()), slots=rows(plan.slots()),
        dec_block_tables=tables, dec_ctx_lens=ctx, pre_block_table=prefill_table, logit_rows=logit_rows,
    )

