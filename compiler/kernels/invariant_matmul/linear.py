"""The deterministic plans' projections on a GPU target (the h200 target's `deterministic_kernels`): the same
signatures as dense_gemv/reference.py, every weight form multiplied by invariant_matmul, so a token's projection
is the same bits whether it is a decode row, a prompt token, alone or among hundreds.

Weight forms: a plain [out, in] array as it is; a DenseBacked weight through its dense copy (made at load); a
GGUF QuantizedWeight or an Fp8Weight dequantized to the activation dtype inside the step (only where no dense copy
exists); a WeightGroup as its parts' dense rows side by side (one launch). The kept quantized GEMVs are not used
here: their int8 activations and per-row-count kernels compute a row differently from a GEMM
(docs/kernel_policy.md, "Batch invariance").
"""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight, dequantize_fp8
from ember.compiler.kernels.gguf_gemv.layout import DenseBacked, QuantizedWeight, WeightGroup
from ember.compiler.kernels.gguf_gemv.matmul import split_columns
from ember.compiler.kernels.gguf_gemv.reference import dequantize

from .matmul import invariant_matmul


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


def linear(x, weight, bias=None):
    # x [N, k], weight [n, k] in any form -> [N, n]
    y = invariant_matmul(x, dense_weight(weight, x.dtype))
    return y if bias is None else y + bias.astype(y.dtype)


def linear_split(x, weight, bias=None, *, sizes):
    # weight [sum(sizes), k] packs several projections of the same input; returns one output per size
    return split_columns(linear(x, weight, bias), sizes)
