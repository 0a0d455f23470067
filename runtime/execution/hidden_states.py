"""A model's final hidden states (after its last norm) for every prompt token, and sentence embeddings
from them (mean-pooled, L2-normalised): what `/v1/embeddings` and Ollama's `/api/embed` serve.

Every plan's epilogue ends `h = final_norm(x); logits = linear(h, output.weight)`. Running the plan with
`output.weight` swapped for the identity [d, d] makes that last projection return `h` itself, so hidden
states come from the same generated code the engine runs (no second forward to keep in step with it).
The pass uses its own small paged pool (a SequenceRunner's), apart from the engine's.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.batch import StepBatch
from ..loading.model import Model
from .sequence_runner import SequenceRunner

OUTPUT_WEIGHT = "output.weight"
MAX_SEGMENTS = 32  # inputs per step: bounds the scratch pool and the [P * L, d] output


def hidden_state_model(model: Model) -> Model:
    """The model with its output projection replaced by the identity: its 'logits' are the final-norm
    hidden states [R, d]."""
    d = model.dims.d
    identity = jnp.eye(d, dtype=model.dtype)
    params = model.params._replace(globals={**model.params.globals, OUTPUT_WEIGHT: identity})
    hidden = replace(model, params=params)
    # one jitted forward kept for the model's life (Model.forward wraps the plan afresh on each call)
    jitted = jax.jit(model.traced(model.plan.module.forward), static_argnums=0, donate_argnums=2)
    hidden.forward = lambda kv, batch: jitted(hidden.dims, hidden.params, kv, batch)
    return hidden


def mean_pooled(hidden: np.ndarray) -> np.ndarray:
    """[T, d] -> [d]: the mean over tokens, L2-normalised (float32)."""
    pooled = np.asarray(hidden, np.float32).mean(axis=0)
    norm = float(np.linalg.norm(pooled))
    return pooled / norm if norm > 0 else pooled


class Embedder:
    """Sentence embeddings of one served model; calls are serialised (one scratch pool at a time).

    Inputs that fit one prefill chunk run together in ONE step, one prefill segment each (StepBatch's P
    segments of L rows, L and P rounded up to powers of two so few shapes compile); a longer input runs
    alone, chunked, through a SequenceRunner."""

    def __init__(self, model: Model, block_size: int = 16):
        self.model = hidden_state_model(model)
        self.width = int(model.dims.d)
        self.block_size = block_size
        self.chunk = max(model.plan.manifest["entries"]["forward"]["prefill_buckets"])
        self._lock = threading.Lock()

    def hidden_states(self, tokens: list[int]) -> np.ndarray:
        """[T, d] final hidden states of `tokens`, one prefill pass (chunked at the plan's largest bucket)."""
        with self._lock:
            runner = SequenceRunner(self.model, len(tokens), block_size=self.block_size)
            return np.asarray(runner.prefill(list(tokens), all_logits=True), np.float32)

    def batch_hidden_states(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's [T_i, d] hidden states from one step (every input at most `chunk` tokens)."""
        assert inputs and all(0 < len(t) <= self.chunk for t in inputs)
        length = _power_of_two(max(len(t) for t in inputs), self.block_size)  # L rows per segment
        segments = _power_of_two(len(inputs), 1)  # P; the extra segments are all padding
        per_segment = -(-length // self.block_size)  # blocks each segment's sequence owns
        model = self.model
        kinds, slot_kinds = len(model.paged_kinds), len(model.slot_kinds)
        tokens = np.zeros((segments, length), np.int32)
        positions = np.zeros((segments, length), np.int32)
        slots = np.zeros((segments, length), np.int32)  # padding rows write slot 0 of reserved block 0
        state = np.full((segments, length), -1, np.int32)
        tables = np.zeros((segments, per_segment), np.int32)
        for s, ids in enumerate(inputs):
            n = len(ids)
            tables[s] = 1 + s * per_segment + np.arange(per_segment)
            tokens[s, :n] = ids
            positions[s, :n] = np.arange(n)
            slots[s, :n] = tables[s][np.arange(n) // self.block_size] * self.block_size + np.arange(n) % self.block_size
            state[s, :n] = s
        rows = segments * length
        batch = StepBatch(
            tokens=jnp.asarray(tokens.reshape(rows)),
            positions=jnp.asarray(positions.reshape(rows)),
            slots=jnp.asarray(np.broadcast_to(slots.reshape(rows), (kinds, rows)).copy()),
            dec_block_tables=jnp.zeros((kinds, 0, per_segment), jnp.int32),
            dec_ctx_lens=jnp.zeros((0,), jnp.int32),
            pre_block_table=jnp.asarray(np.broadcast_to(tables, (kinds, *tables.shape)).copy()),
            logit_rows=jnp.arange(rows, dtype=jnp.int32),
            state_slots=jnp.asarray(np.broadcast_to(state.reshape(rows), (slot_kinds, rows)).copy())
            if slot_kinds
            else None,
        )
        with self._lock:
            kv = model.new_kv(1 + segments * per_segment, self.block_size, num_slots=segments)
            hidden, _ = model.forward(kv, batch)
        hidden = np.asarray(hidden, np.float32).reshape(segments, length, -1)
        return [hidden[s, : len(ids)] for s, ids in enumerate(inputs)]

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """[len(inputs), d] mean-pooled, L2-normalised embeddings; the inputs that fit one chunk share a step."""
        out = np.zeros((len(inputs), self.width), np.float32)
        short = [i for i, ids in enumerate(inputs) if len(ids) <= self.chunk]
        for start in range(0, len(short), MAX_SEGMENTS):
            group = short[start : start + MAX_SEGMENTS]
            for i, hidden in zip(group, self.batch_hidden_states([inputs[i] for i in group]), strict=True):
                out[i] = mean_pooled(hidden)
        for i, ids in enumerate(inputs):
            if len(ids) > self.chunk:
                out[i] = mean_pooled(self.hidden_states(ids))
        return out


def _power_of_two(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, (n - 1).bit_length()))
