"""Deterministic steps in tiles of one fixed shape, for targets whose deterministic kernels are not
batch-invariant at every bucket (their kernel policy's `deterministic.bucketed` is false): every step is cut
into sub-steps of at most `tile_decode_rows` decode rows and `tile_prefill_tokens` tokens of one prefill
chunk, each run at that one padded shape, so a row's computation never depends on the step's size."""

from __future__ import annotations

import math
from dataclasses import replace

from ...compiler.targets.policy import DeterministicPolicy
from ..scheduling.scheduled_step import PrefillChunk, ScheduledStep
from .step_inputs import StepShape


def fixed_tiles(policy: DeterministicPolicy, deterministic: bool) -> DeterministicPolicy | None:
    """The tiling when an engine's steps run in fixed tiles (deterministic mode on a target whose
    deterministic kernels are not batch-invariant at every bucket), else None."""
    return policy if deterministic and not policy.bucketed else None


def tile_shape(policy: DeterministicPolicy, table_blocks: int, num_kinds: int, num_slot_kinds: int = 0) -> StepShape:
    return StepShape(
        policy.tile_decode_rows, policy.tile_prefill_tokens, table_blocks, num_kinds, num_slot_kinds=num_slot_kinds
    )


def step_tiles(step: ScheduledStep, policy: DeterministicPolicy) -> list[ScheduledStep]:
    """Split a step into sub-steps of at most tile_decode_rows decode rows and tile_prefill_tokens chunk tokens, in
    order (a chunk's earlier tiles write their KV before later tiles attend to it). Deterministic engines
    schedule one chunk per step (runtime/engine/config.py prefill_shapes)."""
    if len(step.prefills) > 1:
        raise ValueError("deterministic mode runs one prefill chunk per step")
    chunk = step.prefills[0] if step.prefills else None
    n_chunk_tiles = math.ceil(chunk.num_tokens / policy.tile_prefill_tokens) if chunk is not None else 0
    count = max(math.ceil(len(step.decodes) / policy.tile_decode_rows), n_chunk_tiles, 1)
    tiles = []
    for i in range(count):
        piece = None
        if chunk is not None and i < n_chunk_tiles:
            lo, hi = i * policy.tile_prefill_tokens, min((i + 1) * policy.tile_prefill_tokens, chunk.num_tokens)
            piece = PrefillChunk(
                chunk.request_id,
                chunk.start + lo,
                chunk.token_ids[lo:hi],
                chunk.slots[lo:hi],
                chunk.completes and hi == chunk.num_tokens,
            )
        tiles.append(
            replace(
                step,
                decodes=step.decodes[i * policy.tile_decode_rows : (i + 1) * policy.tile_decode_rows],
                prefills=(piece,) if piece is not None else (),
            )
        )
    return tiles
