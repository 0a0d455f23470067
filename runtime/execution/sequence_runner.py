"""Run one sequence through a model step by step (prefill in chunks, then decode) over a paged pool.

This is the single-request path (`ember generate`, reference tests). Block 0 of the pool is reserved
for padding writes; the sequence owns blocks 1..n of every KV state kind's pool (a sliding-window kind
keeps every block here too: this is the untrimmed reference the engine is checked against).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ...compiler.batch import StepBatch
from ..loading.model import Model
from ..scheduling.scheduled_step import bucket

MIN_BLOCKS = 16  # short sequences share one table shape (one compiled plan) up to 256 tokens


class SequenceRunner:
    def __init__(
        self,
        model: Model,
        max_tokens_in_context: int,
        *,
        block_size: int = 16,
        prefill_chunk: int | None = None,
        kv_dtype=None,
    ):
        # kv_dtype: the pools' element type (default: the activation dtype; EngineConfig.kv_cache_dtype's)
        self.model = model
        self.block_size = block_size
        blocks = max(math.ceil(max_tokens_in_context / block_size), MIN_BLOCKS)
        self.max_blocks = 1 << max(0, (blocks - 1).bit_length())  # power of two: few distinct shapes
        self.kv = model.new_kv(self.max_blocks + 1, block_size, kv_dtype, num_slots=1)
        self.num_slot_kinds = len(model.slot_kinds)  # the sequence holds slot 0 of each
        self.num_kinds = len(model.paged_kinds)  # one table per kind: the same blocks in each kind's pool
        self.block_table = np.arange(1, self.max_blocks + 1, dtype=np.int32)
        buckets = tuple(model.plan.manifest["entries"]["forward"]["prefill_buckets"])
        self.prefill_buckets = buckets
        self.chunk = prefill_chunk or buckets[-1]
        self.length = 0  # tokens already in the KV cache

    @property
    def capacity(self) -> int:
        return self.max_blocks * self.block_size

    def prefill(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray:
        """Feed tokens (chunked). Returns logits of the last token [vocab], or of every token [T, vocab]."""
        if self.length + len(tokens) > self.capacity:
            raise ValueError(f"{self.length + len(tokens)} tokens exceed the runner's capacity {self.capacity}")
        outputs = []
        for start in range(0, len(tokens), self.chunk):
            chunk = tokens[start : start + self.chunk]
            last_chunk = start + self.chunk >= len(tokens)
            rows = list(range(len(chunk))) if all_logits else ([len(chunk) - 1] if last_chunk else [0])
            logits = self._step_prefill(chunk, rows)
            if all_logits or last_chunk:
                outputs.append(logits)
        out = np.concatenate(outputs, axis=0)
        return out if all_logits else out[-1]

    def _step_prefill(self, chunk: list[int], rows: list[int]) -> np.ndarray:
        n = bucket(len(chunk), self.prefill_buckets)
        pad = n - len(chunk)
        positions = np.arange(self.length, self.length + len(chunk), dtype=np.int32)
        slots = self.block_table[positions // self.block_size] * self.block_size + positions % self.block_size
        batch = StepBatch(
            tokens=jnp.asarray(np.pad(np.asarray(chunk, np.int32), (0, pad))),
            positions=jnp.asarray(np.pad(positions, (0, pad))),
            slots=jnp.asarray(self._per_kind(np.pad(slots.astype(np.int32), (0, pad)))),
            dec_block_tables=jnp.zeros((self.num_kinds, 0, self.max_blocks), jnp.int32),
            dec_ctx_lens=jnp.zeros((0,), jnp.int32),
            pre_block_table=jnp.asarray(self._per_kind(self.block_table[None])),  # one segment
            logit_rows=jnp.asarray(np.asarray(rows, np.int32)),
            state_slots=self._state_slots(len(chunk), n),
        )
        logits, self.kv = self.model.forward(self.kv, batch)
        self.length += len(chunk)
        return np.asarray(logits)

    def decode(self, token: int) -> np.ndarray:
        """Feed one token; returns the next-token logits [vocab]."""
        if self.length + 1 > self.capacity:
            raise ValueError(f"context is full ({self.capacity} tokens)")
        pos = self.length
        slot = self.block_table[pos // self.block_size] * self.block_size + pos % self.block_size
        batch = StepBatch(
            tokens=jnp.asarray([token], jnp.int32),
            positions=jnp.asarray([pos], jnp.int32),
            slots=jnp.asarray(self._per_kind(np.asarray([slot], np.int32))),
            dec_block_tables=jnp.asarray(self._per_kind(self.block_table[None])),
            dec_ctx_lens=jnp.asarray([pos + 1], jnp.int32),
            pre_block_table=jnp.zeros((self.num_kinds, 1, self.max_blocks), jnp.int32),
            logit_rows=jnp.asarray([0], jnp.int32),
            state_slots=self._state_slots(1, 1),
        )
        logits, self.kv = self.model.forward(self.kv, batch)
        self.length += 1
        return np.asarray(logits)[0]

    def _state_slots(self, real: int, rows: int):
        """[S, rows]: slot 0 for the sequence's tokens, -1 for padding (None without slot state)."""
        if not self.num_slot_kinds:
            return None
        slots = np.where(np.arange(rows) < real, 0, -1).astype(np.int32)
        return jnp.asarray(np.broadcast_to(slots, (self.num_slot_kinds, rows)).copy())

    def _per_kind(self, a: np.ndarray) -> np.ndarray:  # [...] -> [K, ...]: the same table / slots for every kind
        return np.broadcast_to(a, (self.num_kinds, *a.shape)).copy()
