"""The MTP module's forward (runtime/loading/mtp.py says what it computes) and one sequence's MTP KV.

Built from Ember's op references for the parts only the MTP has (the two pre-fc norms, the concatenation, fc,
the MTP's own final norm) around the target plan's **generated** layer body for the decoder layer
(`plan.module.LAYER_BODIES['full_attention+moe']` etc.): the attention, its per-head gate, partial RoPE and the
MoE or dense MLP are exactly the code the target's own full-attention layers run, under the model's kernel
policy. A separate `[mtp]` body compiled from the spec would need a second entry point through the compiler,
codegen and manifest for three ops; reusing the compiled body gets the same kernels without it.

KV: each sequence owns a contiguous cache laid out as a private paged pool (blocks 1..n in order, block 0
reserved for padding writes), so the plan's paged attention serves it unchanged. Position p of the MTP's
cache holds the MTP layer's K/V for input (h_p, token_{p+1}); a query at position p reads positions <= p,
and every call rewrites the positions it computes, so entries written by earlier drafts past the accepted
point are overwritten before they could be read: rolling back is only moving `computed` back.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ...compiler.batch import StepBatch
from ...compiler.kernels.dense_gemv.reference import linear
from ...compiler.kernels.embedding import add, embedding, select_rows
from ...compiler.kernels.norm.reference import rms_norm
from ..loading.model import Model

MIN_ROWS = 1  # row buckets: powers of two (a draft step is one row), so few shapes compile


def mtp_forward(body, dims, mtp_globals, layer, constants, target_globals, kv, batch: StepBatch, hidden):
    """One MTP pass over batch's rows. hidden [N, d]: the target's final-norm hidden state at each row's
    position (or the MTP's own output for a draft continuing a draft). Returns (logits [R, vocab] of the rows
    in batch.logit_rows, their final-norm MTP hidden states [R, d] (the next draft's `hidden`), kv)."""
    e = rms_norm(
        embedding(batch.tokens, target_globals["token_embd.weight"]), mtp_globals["enorm.weight"], eps=dims.eps
    )
    h = rms_norm(hidden.astype(e.dtype), mtp_globals["hnorm.weight"], eps=dims.eps)
    x = linear(jnp.concatenate([e, h], axis=-1), mtp_globals["fc.weight"])
    x, x_add, kv = body(dims, layer, constants, x, None, kv, batch)
    out = rms_norm(select_rows(add(x, x_add), batch.logit_rows), mtp_globals["norm.weight"], eps=dims.eps)
    return linear(out, target_globals["output.weight"]), out, kv


class MtpSequence:
    """One sequence's MTP cache and the calls that extend it (MTP layer 0: the one every draft step uses)."""

    def __init__(self, model: Model, max_tokens: int, block_size: int = 16):
        if not model.has_mtp:
            raise ValueError(f"{model.checkpoint.path} carries no MTP module")
        self.model = model
        self.block_size = block_size
        blocks = max(1, math.ceil(max_tokens / block_size))
        self.max_blocks = 1 << (blocks - 1).bit_length()
        self.capacity = self.max_blocks * block_size
        d = model.dims
        shape = (self.max_blocks + 1, block_size, d.hkv, d.dh)  # block 0: padding writes
        self.kv = (jnp.zeros(shape, model.dtype), jnp.zeros(shape, model.dtype))
        self.table = np.arange(1, self.max_blocks + 1, dtype=np.int32)
        self.step = _jitted_step(model)

    def run(self, tokens, start: int, hidden) -> tuple[np.ndarray, np.ndarray]:
        """Compute MTP positions start .. start + T - 1 from tokens [T] (token_{p+1} at position p) and hidden
        [T, d]; returns every row's (logits [T, vocab], MTP hidden [T, d]) as float32."""
        count = len(tokens)
        if count == 0 or start + count > self.capacity:
            raise ValueError(f"MTP positions {start}..{start + count - 1} outside 0..{self.capacity - 1}")
        rows = max(MIN_ROWS, 1 << (count - 1).bit_length())
        kinds = len(self.model.paged_kinds)
        ids = np.zeros(rows, np.int32)
        ids[:count] = tokens
        positions = np.zeros(rows, np.int32)
        positions[:count] = np.arange(start, start + count)
        slots = np.zeros(rows, np.int32)  # padding rows write slot 0 of reserved block 0
        p = positions[:count]
        slots[:count] = self.table[p // self.block_size] * self.block_size + p % self.block_size
        states = np.zeros((rows, int(self.model.dims.d)), np.float32)
        states[:count] = np.asarray(hidden, np.float32)
        batch = StepBatch(
            tokens=jnp.asarray(ids),
            positions=jnp.asarray(positions),
            slots=jnp.asarray(np.broadcast_to(slots, (kinds, rows)).copy()),
            dec_block_tables=jnp.zeros((kinds, 0, self.max_blocks), jnp.int32),
            dec_ctx_lens=jnp.zeros((0,), jnp.int32),
            pre_block_table=jnp.asarray(np.broadcast_to(self.table, (kinds, 1, self.max_blocks)).copy()),
            logit_rows=jnp.arange(count, dtype=jnp.int32),
            state_slots=None,
        )
        logits, out, self.kv = self.step(self.kv, batch, jnp.asarray(states))
        return np.asarray(logits, np.float32), np.asarray(out, np.float32)


_STEPS: dict[int, object] = {}


def _jitted_step(model: Model):
    """The model's jitted MTP step (kv, batch, hidden) -> (logits, hidden, kv); one per model, kv donated."""
    key = id(model)
    if key not in _STEPS:
        mtp = model.mtp
        body = model.plan.module.LAYER_BODIES[mtp.bodies[0]]
        forward = model.traced(partial(mtp_forward, body, model.dims))
        jitted = jax.jit(forward, donate_argnums=4)
        globals_ = model.params.globals
        target = {"token_embd.weight": globals_["token_embd.weight"], "output.weight": globals_["output.weight"]}
        _STEPS[key] = lambda kv, batch, hidden: jitted(
            mtp.globals, mtp.layers[0], mtp.constants[0], target, kv, batch, hidden
        )
    return _STEPS[key]
