"""The deterministic plans' projections on a GPU target (the h200 target's `deterministic_kernels`): the same
signatures as dense_gemv/reference.py, every weight form multiplied by invariant_matmul, so a token's projection
is the same bits whether it is a decode row, a prompt token, alone or among hundreds.

Weight forms: a plain [out, in] array as it is; a GGUF QuantizedWeight (or a WeightGroup of them) from its packed
planes, decoded inside the kernel; a DenseBacked weight from its packed planes up to the policy's
`deterministic.packed_max_rows` rows and from its dense copy (made at load) above: both give the same bits
(invariant_matmul/kernel.py), so the choice by row count is a speed choice only; an Fp8Weight (or a weight the
kernel cannot decode) dequantized to the activation dtype inside the step. A WeightGroup's parts are multiplied
with the whole group's config, so each column's arithmetic is the one its dense concatenation would get. The
kept quantized GEMVs are not used here: their int8 activations and per-row-count kernels compute a row
differently from a GEMM (docs/kernel_policy.md, "Batch invariance").

With the policy's `deterministic.int8_blocks`, a weight whose kept parts are all Q4_K / Q6_K multiplies through
int_invariant/ instead, at every row count (its int8 activations round a row differently from the bf16 matmul,
so a weight takes one path or the other for every step, never both).
"""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight, dequantize_fp8
from ember.compiler.kernels.gguf_gemv.layout import DenseBacked, QuantizedWeight, WeightGroup
from ember.compiler.kernels.gguf_gemv.matmul import split_columns
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.int_invariant import config as int_config
from ember.compiler.kernels.int_invariant.matmul import int_invariant_parts, supported
from ember.compiler.targets.policy import kernel_policy

from .config import pick_config
from .matmul import invariant_matmul, packable


def dense_weight(weight, dtype):
    """[out, in] in `dtype` for any weight form (see the module docstring)."""
    if isinstance(weight, DenseBacked):
        return weight.dense.astype(dtype)
    if isinstance(weight, WeightGroup):
        return jnp.concatenate([dense_weight(part, dtype) for part in weight.parts], axis=0)
    if isinstance(weight, QuantizedWeight):
        return dequantize(weight).astype(dtype)
    if isinstance(weight, Fp8Weight):
        return dequantize_fp8(weight, dtype)
    return weight.astype(dtype)


def packed_parts(weight, rows: int, config) -> tuple | None:
    """The packed weights the kernel multiplies for a step of `rows` rows (a group's parts in order), or None
    where this step reads a dense form."""
    if isinstance(weight, DenseBacked):
        if rows > kernel_policy().deterministic.packed_max_rows:
            return None
        weight = weight.kept
    parts = weight.parts if isinstance(weight, WeightGroup) else (weight,)
    return parts if all(packable(part, config) for part in parts) else None


def int8_block_parts(weight) -> tuple | None:
    """The parts int_invariant multiplies (a group's in order) where the policy asks for it, else None."""
    if not kernel_policy().deterministic.int8_blocks:
        return None
    kept = weight.kept if isinstance(weight, DenseBacked) else weight
    parts = kept.parts if isinstance(kept, WeightGroup) else (kept,)
    return parts if all(supported(part) for part in parts) else None


def linear(x, weight, bias=None):
    # x [N, k], weight [n, k] in any form -> [N, n]
    int_parts = int8_block_parts(weight)
    if int_parts:  # the group's config for every part, as for its bf16 matmul; x quantized once
        ys = int_invariant_parts(x, int_parts, config=int_config.pick_config(*weight.shape))
    else:
        config = pick_config(*weight.shape)
        parts = packed_parts(weight, x.shape[0], config)
        if parts is None:
            ys = [invariant_matmul(x, dense_weight(weight, x.dtype), config=config)]
        else:
            ys = [invariant_matmul(x, part, config=config) for part in parts]
    y = ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=1)
    return y if bias is None else y + bias.astype(y.dtype)


def linear_split(x, weight, bias=None, *, sizes):
    # weight [sum(sizes), k] packs several projections of the same input; returns one output per size
    return split_columns(linear(x, weight, bias), sizes)
