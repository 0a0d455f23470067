"""Projections and embedding gathers of the cpu target over weights it keeps as int8 blocks (layout.py).
Same signatures as compiler/kernels/dense_gemv/reference.py and embedding.py; per call, at trace time:

  plain array        the reference op (fp32 weights: HF checkpoints, GGUF formats not kept)
  BlockQ8Weight      rows <= quant_gemv.gemv_max_rows: block_q8_matmul (int16 activations, the native kernel);
                     more rows: dequantized to float32 and the reference matmul (XLA's GEMM)
  split BlockQ8Weight the above on each device's blocks (kept_shards.per_shard: the native kernel is a custom
                     call XLA would otherwise run on the weight gathered whole)
  WeightGroup        one of the above per part (q/k beside a v of another format), outputs side by side

The deterministic plans take the `*_invariant` forms: the kernel at every row count, so a row's result is the
same in any step (the kernel is batch-invariant; switching to the GEMM at some row count would not be).
"""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.kernels import embedding as embedding_ref
from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight, dequantize, take_rows
from ember.compiler.kernels.cpu_gemv.matmul import block_q8_matmul
from ember.compiler.kernels.dense_gemv import reference as linear_ref
from ember.compiler.kernels.gguf_gemv.layout import WeightGroup
from ember.compiler.kernels.kept_shards import per_shard
from ember.compiler.targets.policy import kernel_policy


def _float_linear(x, w, bias, invariant: bool):
    # x [N, k] @ w.T (+ bias) -> [N, out], w a float [out, k] array
    if invariant and x.shape[0] == 1:
        # XLA:CPU runs a one-row float matmul as a GEMV whose sums round unlike its GEMM's (the same from two
        # rows up: tests/test_deterministic_cpu.py); a zero second row keeps the GEMM
        return linear_ref.linear(jnp.concatenate([x, jnp.zeros_like(x)]), w, bias)[:1]
    return linear_ref.linear(x, w, bias)


def _matmul(x, w, invariant: bool):
    # x [N, k] @ w.T -> [N, out]; w a BlockQ8Weight or a float [out, k] array
    if not isinstance(w, BlockQ8Weight):
        return _float_linear(x, w, None, invariant)
    if w.split is not None:  # split over a mesh: the same choice on each device's blocks
        return per_shard(lambda xs, ws: _matmul(xs, ws, invariant), x, w)
    if invariant or x.shape[0] <= kernel_policy().quant_gemv.gemv_max_rows:
        return block_q8_matmul(x, w)
    return linear_ref.linear(x, dequantize(w).astype(x.dtype))


def _linear(x, weight, bias, invariant: bool):
    if isinstance(weight, WeightGroup):
        y = jnp.concatenate([_matmul(x, part, invariant) for part in weight.parts], axis=-1)
    elif isinstance(weight, BlockQ8Weight):
        y = _matmul(x, weight, invariant)
    else:
        return _float_linear(x, weight, bias, invariant)
    return y if bias is None else y + bias.astype(y.dtype)


def _split(y, sizes):
    bounds, total = [], 0
    for size in sizes[:-1]:
        total += size
        bounds.append(total)
    return tuple(jnp.split(y, bounds, axis=-1))


def linear(x, weight, bias=None):
    # x [N, k], weight [n, k] (array, BlockQ8Weight or WeightGroup) -> [N, n]
    return _linear(x, weight, bias, invariant=False)


def linear_split(x, weight, bias=None, *, sizes):
    # weight [sum(sizes), k] packs several projections of the same input; returns one output per size
    return _split(linear(x, weight, bias), sizes)


def linear_invariant(x, weight, bias=None):
    return _linear(x, weight, bias, invariant=True)


def linear_split_invariant(x, weight, bias=None, *, sizes):
    return _split(linear_invariant(x, weight, bias), sizes)


def embedding(ids, table):
    # ids [N] int32, table [vocab, d] (array or BlockQ8Weight: only the gathered rows are dequantized) -> [N, d]
    if not isinstance(table, BlockQ8Weight):
        return embedding_ref.embedding(ids, table)
    return dequantize(take_rows(table, ids)).astype(table.dtype or jnp.float32)
