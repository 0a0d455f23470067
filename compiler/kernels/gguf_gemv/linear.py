"""Projections and embedding gathers over weights that may stay GGUF-quantized (targets that keep
formats packed, e.g. h200). Same signatures as compiler/kernels/dense_gemv/reference.py and embedding.py, so a target
selects them in its `kernels`; the choice per call is made at trace time from the weight's type and
the (static) row count:

  plain array            the reference op (linear.py / embedding.py), unchanged
  QuantizedWeight, rows <= gemv_max_rows(format)
                         quant_matmul(x, w, backend=quant_backend()): the fused GEMV (decode)
  QuantizedWeight, more rows
                         dequantize to the activation dtype, then the reference XLA matmul (prefill,
                         mixed steps): compute-bound, so the one-off dequantization is amortised; or, with
                         the policy's quant_gemv.many_rows "gemm" (uses_gemm), the quantized GEMM of
                         compiler/kernels/gguf_gemm/, which reads only the packed blocks
  split QuantizedWeight / Fp8Weight (over a device mesh: compiler/kernels/kept_shards.py)
                         the above on each device's blocks inside shard_map (kept_shards.per_shard): the
                         kernels are custom calls XLA would run on the weight gathered whole
  WeightGroup            one of the above per part (parts of different formats), outputs side by side
  DenseBacked            a kept weight and its dense copy (made at load): the kept form up to
                         quant_gemv.dense_copy_gemv_max_rows rows, the copy's plain matmul above (no per-call dequantization)
  Nvfp4Weight            nvfp4_matmul (compiler/kernels/nvfp4/): the Triton kernel on the packed codes on a GPU,
                         the jnp reference elsewhere, any row count
  Fp8Weight              fp8_linear (dense_gemv/fp8.py): the Triton GEMV for few rows on a GPU (dense_gemv/kernel.py),
                         else written for XLA to fuse the fp8 operand into its GEMM
  plain array, one row on a GPU (dense_gemv.use_dense_gemv)
                         the same GEMV kernels on the unscaled matrix (dense_gemv/dispatch.py): q/k/v written
                         apart, silu(gate) * up in the gate/up epilogue, no split-K sums after them

Backend choice: the plan's calls carry no backend argument (generated code stays target-agnostic
beyond the kernel names), and a plan is traced on the device it runs on, so `quant_backend()` reads
that device at trace time: "triton" on a GPU (Triton importable), "reference" elsewhere (the CPU
tests, the cpu fallback). The kernel policy's quant_gemv.backend overrides it (compiler/targets/policy.py;
like every policy field it is read at trace time: jit caches traced code, so a new policy needs a new trace).

Embedding tables kept quantized are gathered as quantized rows (a take along the planes' `out` axis)
and only those rows are dequantized: the table costs its GGUF bytes once, where a bf16 copy would
add 2 bytes per weight (467 MB for a 151936 x 1536 table, 1 GB for a 128256 x 4096 one) for a gather
that reads a few KB per token either way. A tied LM head is the same quantized matrix, read by the
GEMV. The rows come out in the table's `dtype` (the activation dtype the loader tagged it with).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels import activation
from ember.compiler.kernels import embedding as embedding_ref
from ember.compiler.kernels.dense_gemv import reference as linear_ref
from ember.compiler.kernels.dense_gemv.dispatch import dense_gemv, dense_gemv_gate_up, dense_gemv_parts, use_dense_gemv
from ember.compiler.kernels.dense_gemv.fp8 import (
    Fp8Weight,
    fp8_linear,
    fp8_linear_gate_up_silu,
    fp8_linear_parts,
    fp8_rows,
)
from ember.compiler.kernels.gguf_gemm import PLANES as GEMM_PLANES
from ember.compiler.kernels.gguf_gemm import pick_gemm_config, quant_gemm
from ember.compiler.kernels.gguf_gemv import config as quant_config
from ember.compiler.kernels.gguf_gemv.act_quant import reads_packing
from ember.compiler.kernels.gguf_gemv.layout import DenseBacked, QuantizedWeight, WeightGroup
from ember.compiler.kernels.gguf_gemv.matmul import (
    BACKENDS,
    quant_matmul,
    quant_matmul_pair_parts,
    quant_matmul_parts,
    quant_matmul_silu_gated,
    split_columns,
)
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.kept_shards import per_shard
from ember.compiler.kernels.nvfp4 import Nvfp4Weight, nvfp4_matmul
from ember.compiler.kernels.split_columns.kernel import split_three
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy


def quant_backend() -> str:
    """The quant_matmul backend for the device being traced for (see module docstring)."""
    chosen = kernel_policy().quant_gemv.backend
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"unknown quant backend {chosen!r}; expected one of {BACKENDS}")
        return chosen
    return "triton" if triton_available() else "reference"


def _matmul(x, w):
    # x [N, k] (an array or a QuantizedInput) @ part.T -> [N, out]; w a QuantizedWeight, an Fp8Weight or a
    # float [out, k] array
    if _split(w):  # split over a mesh: the same choice on each device's blocks, its own activations made there
        return per_shard(_matmul, _array(x), w)
    rows = _rows(x)
    if isinstance(w, QuantizedWeight) and rows <= gemv_max_rows(w.format):
        return quant_matmul(_array(x), w, backend=quant_backend(), activations=_activations(x, w))
    x = _array(x)
    if isinstance(w, Fp8Weight):
        return fp8_linear(x, w)
    if isinstance(w, Nvfp4Weight):
        return nvfp4_matmul(x, w, backend=quant_backend())
    if not isinstance(w, QuantizedWeight):
        return linear_ref.linear(x, w)
    if uses_gemm(rows, w):
        return quant_gemm(x, w, pick_gemm_config(rows, kernel_policy().quant_gemv.gemm_config))
    return linear_ref.linear(x, dequantize(w).astype(x.dtype))


MANY_ROWS = ("dequantize", "gemm")


def uses_gemm(rows: int, w: QuantizedWeight) -> bool:
    """Whether a step of `rows` rows (more than the GEMV serves) multiplies the packed weight w by the quantized
    GEMM (compiler/kernels/gguf_gemm/) rather than dequantizing it whole: the policy's quant_gemv.many_rows,
    up to its gemm_max_rows, on the Triton backend."""
    policy = kernel_policy().quant_gemv
    if policy.many_rows not in MANY_ROWS:
        raise ValueError(f"quant_gemv.many_rows: unknown {policy.many_rows!r}; expected one of {MANY_ROWS}")
    return (
        policy.many_rows == "gemm"
        and rows <= policy.gemm_max_rows
        and w.format in GEMM_PLANES
        and quant_backend() == "triton"
    )


class QuantizedInput(NamedTuple):
    """A projection's input rows (x [N, k]) with their int8 activations already made by the op that
    produced them (norm/quant_kernel.py): qa [N, k/4], da [N, k/32, 4] packed for `order`'s weights
    (act_quant.quantize_activations), so the projection's dp4a GEMV launches no quantizer (Q4_K-packed ones
    serve a Q6_K part too). Parts of another format, and every other path, read x."""

    x: jax.Array
    qa: jax.Array
    da: jax.Array
    order: str


def _array(x):
    return x.x if isinstance(x, QuantizedInput) else x


def _rows(x) -> int:
    return int(_array(x).shape[0])


def _activations(x, w: QuantizedWeight):
    """x's ready-made int8 activations (qa, da, order) where w's GEMV reads their packing (w's format's, or
    Q4_K's for a Q6_K weight: the kernel permutes their bytes), else None."""
    if isinstance(x, QuantizedInput) and reads_packing(w.format, x.order):
        return x.qa, x.da, x.order
    return None


def dp4a_input_order(weight, rows: int) -> str | None:
    """The activation packing ("q4_k" / "q6_k") that `weight`'s decode GEMV reads at `rows` rows, for the
    first part that takes int8 activations: what a producer of its input may write for it. None where no
    part does (float or dense weights, more rows than the GEMV serves, the reference backend)."""
    if quant_backend() != "triton":
        return None
    weight = form_for_rows(rows, weight)
    for part in weight.parts if isinstance(weight, WeightGroup) else (weight,):
        if (
            isinstance(part, QuantizedWeight)
            and rows <= gemv_max_rows(part.format)
            and quant_config.pick_config(part.format, rows, *part.shape).variant == "dp4a"
        ):
            return part.format
    return None


def gemv_max_rows(fmt: str) -> int:
    """Activation rows up to which a `fmt` weight goes through the quantized GEMV (above: dequantize + matmul)."""
    rows = kernel_policy().quant_gemv
    return rows.dp4a_gemv_max_rows if quant_config.dp4a_for(fmt) else rows.gemv_max_rows


def _form(x, weight):
    """What a call with x's rows reads of `weight`: a DenseBacked weight's kept form for decode-sized row
    counts, its dense copy above; any other weight as it is."""
    return form_for_rows(_rows(x), weight)


def form_for_rows(rows: int, weight):
    """The form of `weight` a call with `rows` activation rows reads (see _form)."""
    if isinstance(weight, DenseBacked):
        return weight.kept if rows <= kernel_policy().quant_gemv.dense_copy_gemv_max_rows else weight.dense
    return weight


def _split(w) -> bool:
    """Whether w is a kept weight split over a device mesh (kept_shards.py): its kernels run per shard."""
    return isinstance(w, (QuantizedWeight, Fp8Weight)) and w.split is not None


def _add_bias(y, bias):
    return y if bias is None else y + bias.astype(y.dtype)


def linear(x, weight, bias=None):
    # x [N, k], weight [n, k] (array, QuantizedWeight, WeightGroup, Fp8Weight or DenseBacked) -> [N, n]
    weight = _form(x, weight)
    if isinstance(weight, WeightGroup):
        y = jnp.concatenate([_matmul(x, part) for part in weight.parts], axis=-1)
    elif isinstance(weight, (QuantizedWeight, Fp8Weight, Nvfp4Weight)):
        y = _matmul(x, weight)
    elif use_dense_gemv(_array(x), weight):
        y = dense_gemv(_array(x), weight)
    else:
        return linear_ref.linear(_array(x), weight, bias)
    return _add_bias(y, bias)


def linear_split(x, weight, bias=None, *, sizes):
    # weight [sum(sizes), k] packs several projections of the same input; returns one output per size
    weight = _form(x, weight)
    if not isinstance(weight, (WeightGroup, QuantizedWeight, Fp8Weight, Nvfp4Weight)):  # dense
        if bias is None and use_dense_gemv(_array(x), weight):  # one launch writes each projection
            return dense_gemv_parts(_array(x), weight, tuple(sizes))
        return split_three(linear_ref.linear(_array(x), weight, bias), sizes)  # the GEMM, then one split
    if _split(weight):  # per shard, then plain slices (a fused split would run on the gathered output)
        return tuple(jnp.split(linear(x, weight, bias), list(np.cumsum(sizes)[:-1]), axis=-1))
    parts = weight.parts if isinstance(weight, WeightGroup) else (weight,)
    runs = _sizes_per_part(parts, tuple(sizes))
    if runs is None:  # a part straddles two projections: the packed product, then slices
        return split_columns(linear(x, weight, bias), sizes)
    outs, start, rows = [], 0, _rows(x)
    if len(parts) == 2 and all(isinstance(p, QuantizedWeight) and rows <= gemv_max_rows(p.format) for p in parts):
        paired = quant_matmul_pair_parts(
            _array(x), tuple(parts), bias, tuple(runs), backend=quant_backend(), activations=_activations(x, parts[0])
        )
        if paired is not None:  # both parts in one launch (a Q4_K q+k beside a Q6_K v)
            return paired
    for part, run in zip(parts, runs):  # each part yields its projections (a group's parts: no concat)
        if isinstance(part, QuantizedWeight) and rows <= gemv_max_rows(part.format):
            outs.extend(
                quant_matmul_parts(
                    _array(x),
                    part,
                    bias,
                    run,
                    bias_offset=start,
                    backend=quant_backend(),
                    activations=_activations(x, part),
                )
            )
        elif isinstance(part, Fp8Weight) and bias is None:
            outs.extend(fp8_linear_parts(_array(x), part, run))
        else:
            part_bias = None if bias is None else bias[start : start + sum(run)]
            outs.extend(split_columns(_add_bias(_matmul(x, part), part_bias), run))
        start += sum(run)
    return tuple(outs)


def gated_linear(gate_up, weight, *, act, partials=False):
    # act(gate) * up @ weight.T: gate_up [N, 2 * ffn] (a packed gate/up output), weight [n, ffn] -> [N, n]
    # (the fuse_gated_linear pass); a silu-gated decode GEMV on int8 activations makes the activation inside
    # its quantizer, so it costs no kernel of its own. partials (carry_split_k_partials: the reader sums
    # them): a split-K GEMV's output may be a split_k.SplitKPartials (unless the policy's
    # quant_gemv.split_k_partials is off: summed here as before)
    partials = partials and kernel_policy().quant_gemv.split_k_partials
    kept = _form(gate_up, weight)
    if (
        act == "silu"
        and isinstance(kept, QuantizedWeight)
        and not _split(kept)
        and gate_up.shape[0] <= gemv_max_rows(kept.format)
    ):
        return quant_matmul_silu_gated(gate_up, kept, backend=quant_backend(), partials=partials)
    return linear(activation.gated_act_packed(gate_up, act=act), weight)


def gated_mlp(x, gate_up, down, *, act, partials=False):
    # act(gate) * up @ down.T of the packed gate/up projection x [N, k] @ gate_up.T (the fuse_gated_mlp pass):
    # FP8 weights (and plain ones at one row on a GPU) make act(gate) * up in the gate/up GEMV's epilogue (no
    # kernel between the two GEMVs); every other weight runs the two ops the pass replaced, linear then
    # gated_linear
    kept = _form(x, gate_up)
    if act == "silu" and isinstance(kept, Fp8Weight) and not _split(kept):
        return linear(fp8_linear_gate_up_silu(_array(x), kept), down)
    if act == "silu" and use_dense_gemv(_array(x), kept):  # (GGUF weights have no ndim: never taken)
        return linear(dense_gemv_gate_up(_array(x), kept), down)
    return gated_linear(linear(x, gate_up), down, act=act, partials=partials)


def _sizes_per_part(parts, sizes: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """The consecutive projections (sizes) each part's rows hold, e.g. a q+k part and a v part of sizes
    (q, k, v) -> [(q, k), (v,)]; None when a part's rows end inside a projection."""
    runs, i = [], 0
    for part in parts:
        rows, run = int(part.shape[0]), []
        while rows > 0 and i < len(sizes):
            run.append(sizes[i])
            rows -= sizes[i]
            i += 1
        if rows != 0 or not run:
            return None
        runs.append(tuple(run))
    return runs if i == len(sizes) else None


def embedding(ids, table):
    # ids [N] int32, table [vocab, d] (array, QuantizedWeight, Fp8Weight or DenseBacked) -> [N, d]
    if isinstance(table, DenseBacked):  # the copy's rows are the dequantized rows, gathered without work
        table = table.dense
    if isinstance(table, Fp8Weight):
        return fp8_rows(table, ids)
    if not isinstance(table, QuantizedWeight):
        return embedding_ref.embedding(ids, table)
    rows = QuantizedWeight(
        {name: jnp.take(plane, ids, axis=1) for name, plane in table.planes.items()},
        table.format,
        (ids.shape[0], table.shape[1]),
    )  # planes are [blocks, out, ...]
    return dequantize(rows).astype(table.dtype or jnp.float32)
