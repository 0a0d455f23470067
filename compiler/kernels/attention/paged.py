"""The h200 attention entry: same signature, pool layout and return value as the reference
`attention.paged_attention`, with decode rows on the split-K Triton kernel (decode.py).

  paged_attention           decode rows through the Triton kernel (NVIDIA GPU + Triton); traced for
                            another backend, through the emulation
  paged_attention_emulated  decode rows through the jnp emulation of the same algorithm (runs anywhere:
                            what the CPU tests compare with the reference op)
  rope_paged_attention      rope_apply + paged_attention as one op: RoPE and the K/V write in one kernel
                            (rope/kv_write.py), then the same attention kernels; a step of decode rows only
                            does both inside the split partials kernel (decode.rope_decode_attention;
                            attention.fused_rope_decode off keeps rope_write)
  rope_paged_attention_to_proj  the same, also writing the output as the int8 activations of the one
                            projection reading it (decode steps; the combine kernel quantizes as it merges)

The step's K/V is written first, exactly as the reference does (its `_write`: an in-place scatter into
the donated pool). Rows past batch.num_decode (the prefill segments) go through `attend_prefill_chunk`:
prefill.py's flash-attention kernel over the paged pool (or its jnp emulation, by the same backend switch).

Decode rows read `batch.dec_ctx_lens` for the extent of the walk and `batch.positions` for the causal
and window masks; batch.py's contract (ctx_len == position + 1 for a decode row, padding rows 1 and 0)
makes that the reference's mask exactly.
"""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.batch import StepBatch, kind_view
from ember.compiler.kernels.attention.decode import paged_decode_attention, rope_decode_attention
from ember.compiler.kernels.attention.prefill import prefill_attention, prefill_attention_emulated
from ember.compiler.kernels.attention.reference import _write
from ember.compiler.kernels.rope.kv_write import rope_write
from ember.compiler.kernels.rope.reference import rope
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy


def paged_attention(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # q [N, hq, dh], k/v [N, hkv, dh], window: int32 scalar (0 = unlimited), state: int32 scalar (kind index);
    # k_pool, v_pool: this layer's pool [num_blocks, block_size, hkv, dh] -> (out [N, hq * dh], k_pool, v_pool)
    # Traced for a GPU: the Triton kernels. Traced for anything else (CI runs the h200 plans on CPU): their jnp
    # emulation, the same algorithm step for step.
    backend = "triton" if triton_available() else "emulate"
    return _paged_attention(q, k, v, window, state, k_pool, v_pool, batch, scale=scale, backend=backend)


def paged_attention_emulated(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # the same, decode rows through decode.split_k_partials_jnp + combine_partials
    return _paged_attention(q, k, v, window, state, k_pool, v_pool, batch, scale=scale, backend="emulate")


def attend_prefill_chunk(q, k_pool, v_pool, tables, positions, window, *, scale, backend: str):
    """The prefill segments: q [C, hq, dh], P runs of C / P tokens, run s one sequence's chunk at its
    `positions` (padding rows hold position 0); tables [P, W] their blocks; the chunks' own K/V already
    written -> [C, hq, dh] in q's dtype. backend: "triton" (prefill.py's flash-attention kernel, one launch
    for every segment) or "emulate" (its jnp twin)."""
    fn = prefill_attention if backend == "triton" else prefill_attention_emulated
    return fn(q, k_pool, v_pool, tables, positions, None, window, scale=scale)


def rope_paged_attention(
    q,
    k,
    v,
    positions,
    inv_freq,
    window,
    state,
    k_pool,
    v_pool,
    batch: StepBatch,
    *,
    style,
    scale,
    activations_for: str | None = None,
):
    # rope_apply then paged_attention as one op (the fuse_rope_attention pass): on a GPU, q and k rotated and
    # k/v written by ONE kernel (rope/kv_write.py); traced for anything else, rope.py's reference then the
    # emulation. Same arguments as the two ops together, same results. The kernel policy's attention.fused_rope
    # off traces the unfused ops on a GPU too: the side-by-side measurement. attention.fused_rope_decode off: a
    # step whose rows all decode runs rope_write before the split partials instead of rotating q / k and writing
    # K / V inside them. activations_for: see _attend_written.
    backend = "triton" if triton_available() else "emulate"
    policy = kernel_policy().attention
    partial = 2 * inv_freq.shape[-1] < q.shape[-1]  # partial rotary: the fused kernels rotate whole heads
    if backend == "triton" and policy.fused_rope and not partial:
        write_slots, dec_tables, pre_tables = kind_view(batch, state)
        if batch.num_decode == q.shape[0] and policy.fused_rope_decode:
            fused = rope_decode_attention(
                q,
                k,
                v,
                positions,
                inv_freq,
                write_slots,
                k_pool,
                v_pool,
                dec_tables,
                batch.dec_ctx_lens,
                window,
                style=style,
                scale=scale,
                activations_for=activations_for,
            )
            if fused is not None:
                out, activations, k_pool, v_pool = fused
                return _with_activations(out, activations, activations_for), k_pool, v_pool
        q, k_pool, v_pool = rope_write(q, k, v, positions, inv_freq, write_slots, k_pool, v_pool, style=style)
        return _attend_written(
            q,
            dec_tables,
            pre_tables,
            window,
            k_pool,
            v_pool,
            batch,
            scale=scale,
            backend=backend,
            activations_for=activations_for,
        )
    q, k = rope(q, k, positions, inv_freq, style=style)
    return _paged_attention(q, k, v, window, state, k_pool, v_pool, batch, scale=scale, backend=backend)


def rope_paged_attention_to_proj(
    q, k, v, positions, inv_freq, window, state, reader, k_pool, v_pool, batch: StepBatch, *, style, scale
):
    # rope_paged_attention whose output only the projection with weight `reader` reads (the
    # fuse_norm_into_projection pass): where that projection's decode GEMV takes int8 activations and every row
    # decodes, the attention's combine kernel also writes them (a linear_quant.QuantizedInput), so the
    # projection launches no quantizer. Same arguments otherwise, same output values. On by default (its GPU
    # test passed; plan alone at 65 splits: 1.5B Q4_K_M 382 -> 354 kernels, 1.174 -> 1.153 ms/step;
    # 8B 452 -> 420, 2.434 -> 2.397 ms: docs/results/h200_attention_quant_e027e08.json); the kernel policy's
    # attention.fused_combine_quant off turns it off.
    from ember.compiler.kernels.gguf_gemv.linear import dp4a_input_order

    fused = kernel_policy().attention.fused_combine_quant
    return rope_paged_attention(
        q,
        k,
        v,
        positions,
        inv_freq,
        window,
        state,
        k_pool,
        v_pool,
        batch,
        style=style,
        scale=scale,
        activations_for=dp4a_input_order(reader, q.shape[0]) if fused else None,
    )


def _paged_attention(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale, backend: str):
    write_slots, dec_tables, pre_tables = kind_view(batch, state)
    k_pool = _write(k_pool, write_slots, k)
    v_pool = _write(v_pool, write_slots, v)
    return _attend_written(q, dec_tables, pre_tables, window, k_pool, v_pool, batch, scale=scale, backend=backend)


def _attend_written(
    q,
    dec_tables,
    pre_tables,
    window,
    k_pool,
    v_pool,
    batch: StepBatch,
    *,
    scale,
    backend: str,
    activations_for: str | None = None,
):
    """Attention of q over pools that already hold the step's K/V (the state kind's block tables
    dec_tables [B, max_blocks], pre_tables [P, max_blocks]) -> (out [N, hq * dh], k_pool, v_pool).
    activations_for ("q4_k" / "q6_k"): where every row decodes and the combine kernel can, out is a
    linear_quant.QuantizedInput carrying the reading projection's int8 activations too."""
    n_dec = batch.num_decode
    if activations_for is not None and n_dec == q.shape[0]:
        out, activations = paged_decode_attention(
            q,
            k_pool,
            v_pool,
            dec_tables,
            batch.dec_ctx_lens,
            batch.positions,
            window,
            scale=scale,
            backend=backend,
            activations_for=activations_for,
        )
        return _with_activations(out, activations, activations_for), k_pool, v_pool
    parts = []
    if n_dec:  # B rows of one token each
        parts.append(
            paged_decode_attention(
                q[:n_dec],
                k_pool,
                v_pool,
                dec_tables,
                batch.dec_ctx_lens,
                batch.positions[:n_dec],
                window,
                scale=scale,
                backend=backend,
            )
        )
    if q.shape[0] > n_dec:  # P segments of C / P tokens (the prefill chunks)
        parts.append(
            attend_prefill_chunk(
                q[n_dec:], k_pool, v_pool, pre_tables, batch.positions[n_dec:], window, scale=scale, backend=backend
            )
        )
    out = jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return out.reshape(out.shape[0], -1), k_pool, v_pool


def _with_activations(out, activations, activations_for):
    # decode attention's out [B, hq, dh] -> [B, hq * dh], as a linear_quant.QuantizedInput where the combine
    # kernel also wrote the reading projection's int8 activations (qa, da)
    from ember.compiler.kernels.gguf_gemv.linear import QuantizedInput

    out = out.reshape(out.shape[0], -1)
    return out if activations is None else QuantizedInput(out, *activations, activations_for)
