"""The `gated_delta` and `gated_rms_norm` ops for GPU targets: op.py's signatures, Triton kernels inside.

Traced for a non-GPU backend (or without Triton, or with the policy's gated_delta.triton off) they are op.py's
references, so CI runs the h200 plans on CPU. The kernels rely on the step layout of compiler/batch.py (B decode
rows, then P segments of L tokens); a batch without it (no decode / segment arrays) takes the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

from . import op


def use_kernel() -> bool:
    return kernel_policy().gated_delta.triton and triton_available()


def step_layout(batch: StepBatch, tokens: int) -> tuple[int, int, int] | None:
    """(decode rows B, segments P, segment length L) of a step of `tokens` rows, or None when the batch
    does not say (then the reference runs). P is 0 when the step has no prefill tokens."""
    if batch.dec_ctx_lens is None or batch.pre_block_table is None:
        return None
    b, p = batch.num_decode, batch.num_segments
    rest = tokens - b
    if rest < 0 or (rest and (p == 0 or rest % p)):
        return None
    return (b, p, rest // p) if rest else (b, 0, 0)


def gated_delta(
    qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch: StepBatch, *, hk, hv, dk, dv, kernel
):
    return _gated_delta(
        qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch,
        hk=hk, hv=hv, dk=dk, dv=dv, kernel=kernel, chunked=True,
    )  # fmt: skip


def gated_delta_invariant(
    qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch: StepBatch, *, hk, hv, dk, dv, kernel
):
    """The deterministic plans' op: every token through the recurrent kernel, so a prompt token's arithmetic is a
    decode row's, whatever the chunking (the chunked form's sums differ from the recurrence's)."""
    return _gated_delta(
        qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch,
        hk=hk, hv=hv, dk=dk, dv=dv, kernel=kernel, chunked=False,
    )  # fmt: skip


def _gated_delta(
    qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch, *, hk, hv, dk, dv, kernel, chunked
):
    layout = step_layout(batch, qkv.shape[0])
    if not use_kernel() or layout is None or qkv.shape[0] == 0:
        return op.gated_delta(
            qkv, b, a, state, conv_weight, a_neg, dt_bias, conv_state, delta_state, batch,
            hk=hk, hv=hv, dk=dk, dv=dv, kernel=kernel,
        )  # fmt: skip
    slots = jax.lax.dynamic_index_in_dim(batch.state_slots, jnp.asarray(state, jnp.int32), 0, keepdims=False)
    return gated_delta_triton(
        qkv, b, a, conv_weight, a_neg, dt_bias, conv_state, delta_state, slots, batch.positions, layout,
        hk=hk, hv=hv, dk=dk, dv=dv, chunked=chunked,
    )  # fmt: skip


def gated_delta_triton(
    qkv, b, a, conv_weight, a_neg, dt_bias, conv_state, delta_state, slots, positions, layout, *, hk, hv, dk, dv,
    chunked=True,
):  # fmt: skip
    """The kernels' launches, whatever the backend being traced for: slots, positions [N] int32; layout (B, P, L)
    -> (out [N, hv * dv], conv_state, delta_state). Decode rows (and prefill segments shorter than the policy's
    gated_delta.chunked_min_tokens, or every segment when not `chunked`) take the fused recurrent kernel, longer
    segments the chunked one."""
    decode_rows, segments, segment_len = layout
    channels = qkv.shape[1]
    weight = conv_weight.reshape(channels, -1)
    dims = dict(hk=hk, hv=hv, dk=dk, dv=dv)
    delta_state = delta_state.astype(jnp.float32)
    chunked = chunked and segments and segment_len >= kernel_policy().gated_delta.chunked_min_tokens
    if not chunked:
        out, windows, delta_state = _launch(
            "recurrent", (qkv, b, a), weight, a_neg, dt_bias, (slots, positions), conv_state, delta_state, layout, dims
        )
        return out, scatter_windows(conv_state, windows, slots, layout), delta_state
    parts = [(0, decode_rows, "recurrent", (decode_rows, 0, 0))] if decode_rows else []
    parts.append((decode_rows, qkv.shape[0], "chunked", (0, segments, segment_len)))
    outs, all_windows = [], []
    for lo, hi, form, part_layout in parts:  # each continues from the delta pool the previous one wrote
        rows = tuple(x[lo:hi] for x in (qkv, b, a))
        ints = (slots[lo:hi], positions[lo:hi])
        out, windows, delta_state = _launch(
            form, rows, weight, a_neg, dt_bias, ints, conv_state, delta_state, part_layout, dims
        )
        outs.append(out)
        all_windows.append(windows)
    out = jnp.concatenate(outs) if len(outs) > 1 else outs[0]
    windows = jnp.concatenate(all_windows) if len(all_windows) > 1 else all_windows[0]
    return out, scatter_windows(conv_state, windows, slots, layout), delta_state


def _launch(form, rows, weight, a_neg, dt_bias, ints, conv_state, delta_state, layout, dims):
    """One kernel over `rows` (qkv, b, a of the part's tokens) -> (out, windows [segments, W - 1, C], delta)."""
    from ember.compiler.kernels.triton.launch import triton_call

    from . import chunked_kernel, recurrent_kernel

    qkv = rows[0]
    n, channels = qkv.shape
    width = weight.shape[1]
    decode_rows, segments, segment_len = layout
    if form == "recurrent":
        kernel = recurrent_kernel.gated_delta_recurrent_kernel
        plan = recurrent_kernel.launch_plan(
            decode_rows=decode_rows, segments=segments, segment_len=segment_len, width=width, **dims
        )
    else:
        kernel = chunked_kernel.gated_delta_chunked_kernel
        policy = kernel_policy().gated_delta
        plan = chunked_kernel.launch_plan(
            segments=segments, segment_len=segment_len, width=width, chunk=policy.chunk,
            precision=policy.chunked_precision, **dims,
        )  # fmt: skip
    hv, dv = dims["hv"], dims["dv"]
    return triton_call(
        *rows, weight, a_neg, dt_bias, *(x.astype(jnp.int32) for x in ints), conv_state, delta_state,
        kernel=kernel,
        out_shape=(
            jax.ShapeDtypeStruct((n, hv * dv), qkv.dtype),
            jax.ShapeDtypeStruct((decode_rows + segments, width - 1, channels), conv_state.dtype),
            jax.ShapeDtypeStruct(delta_state.shape, jnp.float32),
        ),
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        input_output_aliases={9: 2},
        **plan["meta"],
    )  # fmt: skip


def segment_starts(layout) -> jnp.ndarray:
    """[B + P] int32: each decode row's index, then each segment's first token's."""
    decode_rows, segments, segment_len = layout
    return jnp.concatenate(
        [jnp.arange(decode_rows, dtype=jnp.int32), decode_rows + segment_len * jnp.arange(segments, dtype=jnp.int32)]
    )


def scatter_windows(conv_state, windows, slots, layout):
    """conv_state with each segment's new window [W - 1, C] at its slot (padding segments dropped)."""
    seg_slots = slots[segment_starts(layout)]
    index = jnp.where(seg_slots >= 0, seg_slots, conv_state.shape[0])  # out of range: dropped
    return conv_state.at[index].set(windows.astype(conv_state.dtype), mode="drop")


def gated_rms_norm_heads(x, gate, weight, *, eps, heads):
    """op.gated_rms_norm_heads: x, gate [N, heads * n], weight [n] -> [N, heads * n]."""
    if not use_kernel() or x.shape[0] == 0 or gate.shape != x.shape:
        return op.gated_rms_norm_heads(x, gate, weight, eps=eps, heads=heads)
    return gated_rms_norm_triton(x, gate, weight, eps=eps, heads=heads)


def gated_rms_norm_triton(x, gate, weight, *, eps, heads):
    """The gated norm kernel's launch, whatever the backend being traced for."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .norm_kernel import gated_rms_norm_kernel, launch_plan

    rows, n = x.shape[0] * heads, x.shape[1] // heads
    plan = launch_plan(rows, n)
    round_wn = jnp.result_type(weight.dtype, x.dtype) == x.dtype
    out = triton_call(
        x.reshape(rows, n), gate.reshape(rows, n), weight,
        kernel=gated_rms_norm_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, n), x.dtype),
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        EPS=float(eps),
        ROUND_WN=bool(round_wn),
        **plan["meta"],
    )  # fmt: skip
    return out.reshape(x.shape)
