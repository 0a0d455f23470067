"""What the scheduler hands the engine for one step: decode rows, prefill chunks (one per sequence), and the
block tables and slots of every request in it — one of each per paged KV state kind (full attention,
sliding window; kinds in the plan's state index order), since each kind has its own pool. And which sets of
prefill chunks one step may carry: the layouts the target compiles (PrefillShapes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def slots_at(tables: Sequence[Sequence[int]], position: int, block_size: int) -> tuple[int, ...]:
    """The flat KV slot (block * block_size + offset) of `position` in each kind's block table; a position
    past a table (a run-ahead step after its request's end, discarded) gets its slot in reserved block 0."""
    block, offset = divmod(position, block_size)
    return tuple((table[block] if block < len(table) else 0) * block_size + offset for table in tables)


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest of the ascending `buckets` that holds n."""
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class PrefillShapes:
    """Which chunk layouts a target compiles: `buckets` (L, tokens per segment) for one chunk, and for
    several chunks in one step `segments` (P > 1, ascending) of L <= `segment_max_tokens` with P * L at
    most the largest bucket (a step with many chunks costs no more than one long chunk)."""

    buckets: tuple[int, ...]
    segments: tuple[int, ...] = (1,)
    segment_max_tokens: int = 512

    @property
    def max_segments(self) -> int:
        return max(self.segments)

    def layout(self, count: int, longest: int) -> tuple[int, int] | None:
        """(P, L) of `count` chunks, the longest of `longest` tokens; None when no compiled layout holds them."""
        if count <= 1:
            return (1, bucket(longest, self.buckets)) if longest <= self.buckets[-1] else None
        if count > self.max_segments or longest > self.segment_max_tokens:
            return None
        p, length = bucket(count, self.segments), bucket(longest, self.buckets)
        return (p, length) if p * length <= self.buckets[-1] else None

    def fits(self, count: int, longest: int) -> bool:
        """Whether `count` chunks, the longest of `longest` tokens, have a layout."""
        return self.layout(count, longest) is not None

    def layouts(self) -> list[tuple[int, int]]:
        """Every (P, L) a step may take."""
        out = [(1, c) for c in self.buckets]
        out += [
            (p, c)
            for p in self.segments
            if p > 1
            for c in self.buckets
            if c <= self.segment_max_tokens and p * c <= self.buckets[-1]
        ]
        return out


def state_slots_of(requests, kinds: tuple[str, ...]) -> tuple[dict[str, tuple[int, ...]], int]:
    """(request id -> its slot of each slot state kind, the number of such kinds): a ScheduledStep's state_slots
    and num_slot_kinds (runtime/state/slot_pool.py)."""
    return {r.request_id: tuple(r.state[k].slot for k in kinds) for r in requests}, len(kinds)


@dataclass(frozen=True)
class SlotCopy:
    """Copy one slot of a slot state kind into another (every layer of the kind): a recurrent-state snapshot
    saved or restored (runtime/scheduling/prefix_snapshots.py)."""

    kind: int  # index among the plan's slot state kinds
    src: int
    dst: int


@dataclass(frozen=True)
class SlotCopies:
    before: tuple[SlotCopy, ...] = ()  # applied before the step's forward (restores)
    after: tuple[SlotCopy, ...] = ()  # applied after it (saves)


@dataclass(frozen=True)
class DecodeRow:
    request_id: str
    token_id: int  # the request's token at `position` (its last known one)
    position: int
    slots: tuple[int, ...]  # per kind: the flat KV slot it writes, block * block_size + offset


@dataclass(frozen=True)
class PrefillChunk:
    request_id: str
    start: int  # position of the first token (the request's computed count when scheduled)
    token_ids: tuple[int, ...]
    slots: tuple[tuple[int, ...], ...]  # per token: its flat KV slot in each kind's pool
    completes: bool  # reaches the request's last known token: its last row gives logits

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class VerifySegment:
    """A decode row with drafts: its last known token then the drafts, at positions start .. start + k, every
    one a logit row (position i's logits verify draft i; the last one gives the bonus token)."""

    request_id: str
    start: int  # the request's computed count: the position of its last known token
    token_ids: tuple[int, ...]  # (last known token, *drafts)
    slots: tuple[tuple[int, ...], ...]  # per token: its flat KV slot in each kind's pool
    # the drafts' distributions q, f32 [k, V'] (a sampling model drafter), or None: point masses
    draft_probs: Any = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def drafts(self) -> tuple[int, ...]:
        return self.token_ids[1:]

    @property
    def completes(self) -> bool:
        """Not a prefill chunk's last-row logits: every row of a verify segment is a logit row (laid out by
        runtime/execution/step_inputs.py's verify_logit_rows)."""
        return False


@dataclass(frozen=True)
class ScheduledStep:
    """One step: rows [0, B) are decode rows, then the verify segments (decode rows with drafts), then the
    prefill chunks in order (each one sequence's; every chunk but the last completes its prompt); segments are
    laid out verify segments first. Block tables are snapshots (tuples), valid for this step.
    preempted: requests sent back to the queue this step."""

    decodes: tuple[DecodeRow, ...]
    prefills: tuple[PrefillChunk, ...]
    # request id -> its block table of each kind, for every request in the step (RESERVED_BLOCK 0 where a
    # sliding kind dropped a block)
    block_tables: Mapping[str, tuple[tuple[int, ...], ...]]
    preempted: tuple[str, ...] = ()
    num_kinds: int = 1  # K: paged KV state kinds
    # request id -> its slot of each slot state kind (recurrent state), for every request in the step
    state_slots: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    num_slot_kinds: int = 0  # S: slot state kinds
    slot_copies: SlotCopies = SlotCopies()  # recurrent-state snapshots restored before / saved after the step
    verifies: tuple[VerifySegment, ...] = ()

    @property
    def segments(self) -> tuple[VerifySegment | PrefillChunk, ...]:
        """The step's segments in layout order: verify segments, then prefill chunks."""
        return (*self.verifies, *self.prefills)

    @property
    def num_decode(self) -> int:
        return len(self.decodes)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + self.prefill_tokens + sum(v.num_tokens for v in self.verifies)

    @property
    def is_empty(self) -> bool:
        return self.num_tokens == 0

    @property
    def logit_rows(self) -> tuple[int, ...]:
        """Rows whose logits are sampled (unpadded, decodes then segments back to back): every decode row,
        every row of a verify segment, and the last row of each chunk that completes its prompt."""
        rows, end = list(range(len(self.decodes))), len(self.decodes)
        for segment in self.verifies:
            rows += range(end, end + segment.num_tokens)
            end += segment.num_tokens
        for chunk in self.prefills:
            end += chunk.num_tokens
            if chunk.completes:
                rows.append(end - 1)
        return tuple(rows)

    @property
    def logit_request_ids(self) -> tuple[str, ...]:
        """The requests whose logits the step samples (or verifies), in row order: decode rows, verify
        segments, chunks that complete their prompt."""
        ids = tuple(row.request_id for row in self.decodes) + tuple(v.request_id for v in self.verifies)
        return ids + tuple(c.request_id for c in self.prefills if c.completes)

    # numpy views of the decode rows (the chunks are laid out per segment by runtime/execution/step_inputs.py)
    def decode_token_ids(self) -> np.ndarray:  # int32 [B]
        return np.asarray([r.token_id for r in self.decodes], np.int32)

    def decode_positions(self) -> np.ndarray:  # int32 [B]
        return np.asarray([r.position for r in self.decodes], np.int32)

    def decode_slots(self) -> np.ndarray:  # int32 [K, B]
        return np.asarray([r.slots for r in self.decodes], np.int32).reshape(-1, self.num_kinds).T.copy()

    def decode_context_lens(self) -> np.ndarray:  # int32 [B]: context of each decode row, its own token included
        return np.asarray([r.position + 1 for r in self.decodes], np.int32)

    def decode_slots_ahead(self, steps: int, block_size: int) -> np.ndarray:  # int32 [steps, K, B]
        """The slot each decode row writes at each of `steps` consecutive steps (positions p .. p+steps-1),
        from its block tables (Scheduler.extend_decodes grew them up to the row's last position). A position
        past a kind's table (after the request's end: its tokens are discarded) writes to reserved block 0."""
        out = np.zeros((steps, self.num_kinds, len(self.decodes)), np.int32)
        for b, row in enumerate(self.decodes):
            tables = self.block_tables[row.request_id]
            for i in range(steps):
                out[i, :, b] = slots_at(tables, row.position + i, block_size)
        return out

    def decode_block_tables(self, max_blocks: int) -> np.ndarray:  # int32 [K, B, max_blocks], padded with block 0
        return np.stack(
            [
                _padded([self.block_tables[r.request_id][k] for r in self.decodes], max_blocks)
                for k in range(self.num_kinds)
            ]
        )

    def prefill_block_tables(self, segments: int, max_blocks: int) -> np.ndarray:
        """int32 [K, segments, max_blocks]: segment s's tables in row s, padded with block 0 (rows past the
        chunks: all block 0)."""
        out = np.zeros((self.num_kinds, segments, max_blocks), np.int32)
        for s, chunk in enumerate(self.segments):
            out[:, s] = _padded(self.block_tables[chunk.request_id], max_blocks)
        return out


def _padded(tables: Sequence[Sequence[int]], max_blocks: int) -> np.ndarray:
    out = np.zeros((len(tables), max_blocks), np.int32)
    for i, table in enumerate(tables):
        if len(table) > max_blocks:
            raise ValueError(f"a block table of {len(table)} blocks does not fit max_blocks={max_blocks}")
        out[i, : len(table)] = table
    return out
