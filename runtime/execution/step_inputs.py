"""Turn a ScheduledStep into the padded, static-shape StepBatch one compiled step shape (a bucket) runs.

Shapes are bucketed so few executables are compiled: decode rows B to a decode bucket; the prefill chunks to
P segments (a segment bucket >= the chunk count) of L tokens (a prefill bucket >= the longest chunk), C =
P * L; logit rows to B + P. Block tables have one width per engine (its longest possible context), and
slots and tables one row per paged KV state kind (K). Padding rows write to block 0 (reserved) of every
kind and read only block 0; their logits are never used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...compiler.batch import StepBatch
from ..scheduling.scheduled_step import PrefillShapes, ScheduledStep, bucket

# a verify step's width W (tokens per verify segment, = its segment length L): k + 1 rounded up to one of these
# (dense at small k: on the CPU every padding token costs nearly what a real one does)
VERIFY_WIDTHS = (2, 3, 4, 5, 6, 8, 12, 16)


@dataclass(frozen=True)
class StepShape:
    decode_rows: int  # B (padded)
    prefill_tokens: int  # C = P * L (padded), 0 when the step has no chunk
    table_blocks: int  # width of every block table
    num_kinds: int = 1  # K: paged KV state kinds (one block table and slot per kind)
    segments: int = 1  # P: prefill chunks of C / P tokens each
    min_logit_rows: int = 1  # deterministic mode's floor (no one-row LM head matmul: DeterministicPolicy)
    num_slot_kinds: int = 0  # S: slot state kinds (each token names its request's slot of each; -1: padding)
    # W > 0: a verify step (runtime/scheduling/speculation.py): P verify segments of L = W tokens; every decode
    # row and segment is a verify row of W logit rows (a decode row's W rows all read its one row)
    verify_width: int = 0

    @property
    def segment_tokens(self) -> int:  # L
        return self.prefill_tokens // self.segments

    @property
    def verify_rows(self) -> int:  # R of a verify step: decode rows, then segments
        return self.decode_rows + self.segments

    @property
    def logit_rows(self) -> int:
        if self.verify_width:
            return self.verify_rows * self.verify_width
        # a row per decode row and per chunk that may complete; a decode-only step has no chunk (a padding
        # row there would double the LM head's activation rows at batch 1: 2 rows take a slower GEMV)
        return max(self.min_logit_rows, self.decode_rows + (self.segments if self.prefill_tokens else 0))


def step_shape(
    step: ScheduledStep, decode_buckets: tuple[int, ...], prefill: PrefillShapes, table_blocks: int
) -> StepShape:  # K follows the step
    """Decode-only and prefill-only steps take their smallest bucket; a mixed step pads its decode rows
    to the largest decode bucket, so mixed shapes number one per prefill layout (few executables to compile).
    A verify step (decode rows and verify segments, no chunk) takes P from the decode buckets and L = W."""
    if step.verifies:
        if step.prefills:
            raise ValueError("a verify step carries no prefill chunk")
        width = bucket(max(v.num_tokens for v in step.verifies), VERIFY_WIDTHS)
        p = bucket(len(step.verifies), decode_buckets)
        b = bucket(step.num_decode, decode_buckets) if step.num_decode else 0
        return StepShape(
            b, p * width, table_blocks, step.num_kinds, p, num_slot_kinds=step.num_slot_kinds, verify_width=width
        )
    p, length = 1, 0
    if step.prefills:
        count, longest = len(step.prefills), max(ch.num_tokens for ch in step.prefills)
        layout = prefill.layout(count, longest)
        if layout is None:
            raise ValueError(f"{count} prefill chunks of up to {longest} tokens have no compiled layout")
        p, length = layout
    c = p * length
    if not step.num_decode:
        b = 0
    elif c:
        b = decode_buckets[-1]
    else:
        b = bucket(step.num_decode, decode_buckets)
    return StepShape(b, c, table_blocks, step.num_kinds, p, num_slot_kinds=step.num_slot_kinds)


def all_step_shapes(
    decode_buckets: tuple[int, ...],
    prefill: PrefillShapes,
    table_blocks: int,
    num_kinds: int = 1,
    num_slot_kinds: int = 0,
) -> list[StepShape]:
    """Every shape step_shape can return: decode-only, prefill-only and mixed steps."""
    shapes = [StepShape(b, 0, table_blocks, num_kinds, num_slot_kinds=num_slot_kinds) for b in decode_buckets]
    shapes += [
        StepShape(b, p * c, table_blocks, num_kinds, p, num_slot_kinds=num_slot_kinds)
        for p, c in prefill.layouts()
        for b in (0, decode_buckets[-1])
    ]
    return shapes


def _no_slots(shape: StepShape, n: int) -> np.ndarray | None:
    """[S, n] of -1 (every row padding), or None for a plan without slot state."""
    return np.full((shape.num_slot_kinds, n), -1, np.int32) if shape.num_slot_kinds else None


def padding_batch(shape: StepShape) -> StepBatch:
    """A batch of only padding rows (writes go to block 0): runs a shape once to compile it."""
    n, k = shape.decode_rows + shape.prefill_tokens, shape.num_kinds
    zeros = np.zeros(n, np.int32)
    return StepBatch(
        tokens=zeros,
        positions=zeros,
        slots=np.zeros((k, n), np.int32),
        dec_block_tables=np.zeros((k, shape.decode_rows, shape.table_blocks), np.int32),
        dec_ctx_lens=np.ones(shape.decode_rows, np.int32),
        pre_block_table=np.zeros((k, shape.segments, shape.table_blocks), np.int32),
        logit_rows=np.zeros(shape.logit_rows, np.int32),
        state_slots=_no_slots(shape, n),
    )


def build_step_batch(step: ScheduledStep, shape: StepShape) -> StepBatch:
    """numpy StepBatch for `step` padded to `shape` (the caller moves it to the device): decode rows at
    [0, B), chunk s at [B + s * L, B + s * L + its tokens), padding (token 0, position 0, slot 0) elsewhere."""
    b_real, b, k = step.num_decode, shape.decode_rows, shape.num_kinds
    if step.num_kinds != k or step.num_slot_kinds != shape.num_slot_kinds:
        raise ValueError(
            f"the step has {step.num_kinds} KV and {step.num_slot_kinds} slot state kinds, "
            f"the shape {k} and {shape.num_slot_kinds}"
        )
    if len(step.segments) > shape.segments or any(ch.num_tokens > shape.segment_tokens for ch in step.segments):
        raise ValueError(f"the step's chunks do not fit the shape's {shape.segments} x {shape.segment_tokens}")
    n = b + shape.prefill_tokens
    tokens, positions, slots = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((k, n), np.int32)
    tokens[:b_real], positions[:b_real] = step.decode_token_ids(), step.decode_positions()
    state_slots = _no_slots(shape, n)
    if b_real:
        slots[:, :b_real] = step.decode_slots()
        if state_slots is not None:
            state_slots[:, :b_real] = np.asarray([step.state_slots[r.request_id] for r in step.decodes], np.int32).T
    logit_rows = np.zeros(shape.logit_rows, np.int32)
    logit_rows[:b_real] = np.arange(b_real)
    completed = b_real
    for s, chunk in enumerate(step.segments):
        lo = b + s * shape.segment_tokens
        hi = lo + chunk.num_tokens
        tokens[lo:hi] = chunk.token_ids
        positions[lo:hi] = np.arange(chunk.start, chunk.start + chunk.num_tokens)
        slots[:, lo:hi] = np.asarray(chunk.slots, np.int32).reshape(chunk.num_tokens, k).T
        if state_slots is not None:
            state_slots[:, lo:hi] = np.asarray(step.state_slots[chunk.request_id], np.int32)[:, None]
        if chunk.completes:
            logit_rows[completed] = hi - 1
            completed += 1
    if shape.verify_width:
        logit_rows = verify_logit_rows(step, shape)
    tables = np.zeros((k, b, shape.table_blocks), np.int32)
    if b_real:
        tables[:, :b_real] = step.decode_block_tables(shape.table_blocks)
    ctx = np.ones(b, np.int32)
    ctx[:b_real] = step.decode_context_lens()
    return StepBatch(
        tokens=tokens,
        positions=positions,
        slots=slots,
        dec_block_tables=tables,
        dec_ctx_lens=ctx,
        pre_block_table=step.prefill_block_tables(shape.segments, shape.table_blocks),
        logit_rows=logit_rows,
        state_slots=state_slots,
    )


def verify_logit_rows(step: ScheduledStep, shape: StepShape) -> np.ndarray:
    """int32 [R * W] of a verify step: verify row r's W logit rows, row-major. A decode row's are its own row W
    times (its one real position, no drafts); segment s's are its L = W rows; padding rows read row 0."""
    width = shape.verify_width
    rows = np.zeros((shape.verify_rows, width), np.int32)
    rows[: step.num_decode] = np.arange(step.num_decode)[:, None]
    for s in range(len(step.verifies)):
        start = shape.decode_rows + s * width
        rows[shape.decode_rows + s] = np.arange(start, start + width)
    return rows.reshape(-1)


def verify_drafts(step: ScheduledStep, shape: StepShape, num_drafts: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(drafts int32 [R, W - 1], -1 past each row's count; num_drafts int32 [R]) of a verify step: decode rows
    and padding have none; segment s (verify row B + s) has num_drafts[its request] (the drafts the grammar
    kept, runtime/speculative/rows.py)."""
    drafts = np.full((shape.verify_rows, shape.verify_width - 1), -1, np.int32)
    counts = np.zeros(shape.verify_rows, np.int32)
    for s, segment in enumerate(step.verifies):
        n = num_drafts[segment.request_id]
        drafts[shape.decode_rows + s, :n] = segment.drafts[:n]
        counts[shape.decode_rows + s] = n
    return drafts, counts


def verify_draft_probs(step: ScheduledStep, shape: StepShape, num_drafts: dict[str, int], vocab: int) -> tuple:
    """() when no verify segment carries its drafts' distributions (every q is a point mass), else (draft_probs
    f32 [R, W - 1, V], zero where a row has none; has_draft_probs bool [R]): segment s's kept drafts' q rows,
    zero-padded past the draft model's vocabulary (it may be smaller than the target's)."""
    with_q = [(s, v) for s, v in enumerate(step.verifies) if v.draft_probs is not None]
    if not with_q:
        return ()
    probs = np.zeros((shape.verify_rows, shape.verify_width - 1, vocab), np.float32)
    flags = np.zeros(shape.verify_rows, bool)
    for s, segment in with_q:
        n, q = num_drafts[segment.request_id], segment.draft_probs
        probs[shape.decode_rows + s, :n, : q.shape[1]] = q[:n]
        flags[shape.decode_rows + s] = True
    return probs, flags
