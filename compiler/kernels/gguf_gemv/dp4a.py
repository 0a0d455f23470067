"""The "dp4a" variant of quant_matmul: Q4_K / Q6_K weights times int8 activations (gguf_gemv/act_quant.py).

Two launches per call: the activations quantized and packed for the weight's format (gguf_gemv/act_quant_kernel.py),
unless their producer wrote them (a Q6_K GEMV also reads Q4_K-packed ones, ACT_Q4), then the integer-dot
GEMV (gguf_gemv/dp4a_kernel.py); split-K partial sums are added by XLA as for the other variants, or by the
reader (split_k.py). Plans are pure functions of the shapes, testable on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.act_quant import FACTORS, packed_shapes, reads_packing
from ember.compiler.kernels.gguf_gemv.config import DP4A_FORMATS, QuantMatmulConfig
from ember.compiler.kernels.gguf_gemv.layout import QuantizedWeight

DP4A_MAX_ROWS = 8  # activation rows per program (one accumulator each)


def dp4a_plan(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    """The rows frame along `out` and `in` (matmul._rows_plan), each row tile's program repeated for the groups
    of R activation rows (grid axis 0 = tile * groups + group; R <= 8, the groups as even as can be: m = 12
    is 2 x 6); activations and outputs are padded to M_PAD rows. EXACT: every split is whole steps (no masks)."""
    from ember.compiler.kernels.gguf_gemv.matmul import _rows_plan, whole_steps

    if fmt not in DP4A_FORMATS:
        raise ValueError(f"the dp4a variant has no {fmt} kernel (it takes {', '.join(DP4A_FORMATS)})")
    if m < 1:
        raise ValueError(f"the dp4a variant takes >= 1 activation rows, got {m}")
    groups = -(-m // DP4A_MAX_ROWS)
    per_group = -(-m // groups)
    plan = _rows_plan(fmt, 1, out, inner, config)
    tiles, split_k, _ = plan["grid"]
    meta = {k: v for k, v in plan["meta"].items() if k != "M"}
    meta.update(
        M_PAD=groups * per_group,
        R=per_group,
        Q6=fmt == "q6_k",
        ACT_Q4=False,
        ASM=True,
        EXACT=whole_steps(inner // 256, meta["UNITS_PER_SPLIT"], split_k, meta["S"]),
    )
    return {"grid": (tiles * groups, split_k, 1), "split_k": split_k, "meta": meta}


def pad_rows(qa, da, rows: int):
    """(qa [m, terms k/4], da [m, k/32, 4 terms]) -> both padded with zero rows to `rows` (a plan's M_PAD): all-zero
    activations, whose outputs the caller drops."""
    pad = rows - qa.shape[0]
    if pad == 0:
        return qa, da
    return jnp.pad(qa, ((0, pad), (0, 0))), jnp.pad(da, ((0, pad), (0, 0), (0, 0)))


def quantize_activations_gpu(x: jax.Array, order: str, silu_gated: bool = False) -> tuple[jax.Array, jax.Array]:
    """act_quant.quantize_activations(x, order) in one Triton launch: x [m, k] -> (qa, da); with silu_gated,
    of silu(gate) * up for x = gate_up [m, 2k] (activation.gated_act_packed, computed inside the launch)."""
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel
    from ember.compiler.kernels.triton.launch import triton_call

    m, k = x.shape[0], x.shape[1] // 2 if silu_gated else x.shape[1]
    if k % 32:
        raise ValueError(f"activation length {k} is not a multiple of 32")
    plan = quantize_plan(m, k, order, silu_gated)
    return triton_call(
        x,
        kernel=quantize_rows_kernel,
        out_shape=packed_shapes(m, k, plan["meta"]["TERMS"]),
        grid=plan["grid"],
        num_warps=4,
        num_stages=1,
        ASM=True,
        **plan["meta"],
    )


def _quantized_inputs(
    x: jax.Array, w: QuantizedWeight, plan: dict, silu_gated: bool = False, activations: tuple | None = None
) -> tuple[tuple, dict]:
    """(x's int8 activations padded to the plan's rows, then w's planes: the launches' leading operands;
    the plan's constexprs for that packing). `activations`: (qa, da, order) where x's producer made them
    (order: their packing, w's format or Q4_K's, which a Q6_K kernel reads as ACT_Q4), else quantized here."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES

    if activations is None:
        activations = (*quantize_activations_gpu(x, w.format, silu_gated), w.format)
    qa, da, order = activations
    if not reads_packing(w.format, order):
        raise ValueError(f"a {w.format} GEMV cannot read activations packed for {order}")
    qa, da = pad_rows(qa, da, plan["meta"]["M_PAD"])
    meta = dict(plan["meta"], ACT_Q4=order != w.format, TERMS=da.shape[-1] // FACTORS)
    return (qa, da, *(w.planes[name] for name in DP4A_PLANES[w.format])), meta


def dp4a_call(
    x: jax.Array,
    w: QuantizedWeight,
    config: QuantMatmulConfig,
    plan: dict,
    silu_gated: bool = False,
    activations: tuple | None = None,
    partials: bool = False,
):
    """x [m, in] @ W.T -> [m, out] in x's dtype through the two launches (silu_gated: x is a gate/up output
    [m, 2 in] and the product is silu(gate) * up @ W.T, the activation made by the quantizer; activations:
    x's (qa, da, order) made by its producer, then the GEMV alone). partials: a split-K plan's fp32 partials are
    returned unsummed, as a split_k.SplitKPartials for a reader that adds them (one launch less)."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import dp4a_gemv_kernel
    from ember.compiler.kernels.triton.launch import triton_call

    m = x.shape[0]
    split_k = plan["split_k"]
    operands, meta = _quantized_inputs(x, w, plan, silu_gated, activations)
    y = triton_call(
        *operands,
        kernel=dp4a_gemv_kernel,
        out_shape=jax.ShapeDtypeStruct((split_k, meta["M_PAD"], w.shape[0]), x.dtype if split_k == 1 else jnp.float32),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **meta,
    )
    if split_k == 1:
        return y[0, :m]
    from ember.compiler.kernels.split_k import SplitKPartials, materialized

    unsummed = SplitKPartials(y, m, x.dtype)
    return unsummed if partials else materialized(unsummed)


MAX_PARTS = 3  # projections one parts launch writes apart (q, k, v)


def parts_plan(plan: dict, sizes: tuple[int, ...], out: int) -> dict | None:
    """The parts kernel's constexprs (N1, N2) for a one-split dp4a plan over `sizes` (1 to 3 projections
    summing to `out`; one: the plain GEMV with its bias added in the kernel); None where the parts launch
    does not apply (split-K partials are summed by XLA, which adds the bias and splits them in that pass)."""
    from ember.compiler.kernels.gguf_gemv.matmul import column_bounds

    if plan["split_k"] != 1 or not 1 <= len(sizes) <= MAX_PARTS or sum(sizes) != out:
        return None
    bounds = column_bounds(sizes) + [out, out]
    return {"N1": bounds[0], "N2": bounds[1]}


def dp4a_parts_call(
    x: jax.Array,
    w: QuantizedWeight,
    bias: jax.Array | None,
    config: QuantMatmulConfig,
    plan: dict,
    sizes: tuple[int, ...],
    bias_offset: int = 0,
    activations: tuple | None = None,
) -> tuple[jax.Array, ...]:
    """x [m, in] @ W.T (+ bias[bias_offset:][:out]) for a W packing len(sizes) projections -> one [m, size]
    output per projection in x's dtype, written apart by one launch (parts_plan must allow it); equal to
    slicing dp4a_call's output after linear_quant's bias add. The bias is read in place (no slice of it)."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import dp4a_gemv_parts_kernel
    from ember.compiler.kernels.triton.launch import triton_call

    bounds = parts_plan(plan, sizes, w.shape[0])
    if bounds is None:
        raise ValueError(f"no parts launch for sizes {sizes} with split_k {plan['split_k']}")
    m, rows = x.shape[0], plan["meta"]["M_PAD"]
    widths = (*sizes, 1, 1)[:MAX_PARTS]  # 1-column placeholders for absent parts (never written)
    bias_arg = jnp.zeros((1,), x.dtype) if bias is None else bias.astype(x.dtype)
    operands, meta = _quantized_inputs(x, w, plan, activations=activations)
    outs = triton_call(
        *operands,
        bias_arg,
        kernel=dp4a_gemv_parts_kernel,
        out_shape=tuple(jax.ShapeDtypeStruct((rows, width), x.dtype) for width in widths),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        HAS_BIAS=bias is not None,
        BIAS_OFFSET=bias_offset,
        **meta,
        **bounds,
    )
    return tuple(out[:m] for out in outs[: len(sizes)])


def pair_fits(
    weights: tuple[QuantizedWeight, QuantizedWeight],
    plans: tuple[dict, dict],
    runs: tuple[tuple[int, ...], tuple[int, ...]],
) -> bool:
    """Whether dp4a_pair_parts_call takes these parts: a Q4_K A of one or two projections, a B of one, each
    part's plan one split."""
    return (
        weights[0].format == "q4_k"
        and 1 <= len(runs[0]) <= 2
        and len(runs[1]) == 1
        and all(sum(run) == w.shape[0] for run, w in zip(runs, weights))
        and all(plan["split_k"] == 1 for plan in plans)
    )


def dp4a_pair_parts_call(
    x: jax.Array,
    weights: tuple[QuantizedWeight, QuantizedWeight],
    bias: jax.Array | None,
    plans: tuple[dict, dict],
    runs: tuple[tuple[int, ...], tuple[int, ...]],
    num_warps: int,
    activations: tuple | None = None,
) -> tuple[jax.Array, ...]:
    """x [m, in] @ the two parts of a weight group (a Q4_K A packing the projections runs[0], one or two,
    then a Q4_K or Q6_K B holding runs[1], one), each plus its run of bias (A's rows, then B's), in one
    launch (triton_gemv_dp4a.dp4a_gemv_pair_kernel): what dp4a_parts_call on each part gives. plans: each
    part's one-split dp4a plan at x's rows; B reads A's activations (Q4_K-packed: a Q6_K B permutes them)."""
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_pair_kernel
    from ember.compiler.kernels.triton.launch import triton_call

    (wa, wb), (plan_a, plan_b) = weights, plans
    if not pair_fits(weights, plans, runs):
        raise ValueError(f"no pair launch for {wa.format} {runs[0]} + {wb.format} {runs[1]}")
    operands, meta_a = _quantized_inputs(x, wa, plan_a, activations=activations)
    meta_b = plan_b["meta"]
    m, rows = x.shape[0], meta_a["M_PAD"]
    tiles_a = plan_a["grid"][0] // (meta_a["M_PAD"] // meta_a["R"])
    bias_arg = jnp.zeros((1,), x.dtype) if bias is None else bias.astype(x.dtype)
    widths = (runs[0][0], runs[0][1] if len(runs[0]) == 2 else 1, runs[1][0])
    outs = triton_call(
        *operands,
        *(wb.planes[name] for name in DP4A_PLANES[wb.format]),
        bias_arg,
        kernel=dp4a_gemv_pair_kernel,
        out_shape=tuple(jax.ShapeDtypeStruct((rows, width), x.dtype) for width in widths),
        grid=(plan_a["grid"][0] + plan_b["grid"][0], 1, 1),
        num_warps=num_warps,
        num_stages=1,
        M_PAD=rows,
        K=wa.shape[1],
        R=meta_a["R"],
        NA=wa.shape[0],
        N1=runs[0][0],
        NB=wb.shape[0],
        TILES_A=tiles_a,
        BLOCK_N_A=meta_a["BLOCK_N"],
        S_A=meta_a["S"],
        PREFETCH_A=meta_a["PREFETCH"],
        EXACT_A=meta_a["EXACT"],
        BLOCK_N_B=meta_b["BLOCK_N"],
        S_B=meta_b["S"],
        PREFETCH_B=meta_b["PREFETCH"],
        EXACT_B=meta_b["EXACT"],
        Q6_B=wb.format == "q6_k",
        ASM=True,
        HAS_BIAS=bias is not None,
        BIAS_OFFSET=0,
        TERMS=meta_a["TERMS"],
    )
    kept = (0, 1) if len(runs[0]) == 2 else (0,)
    return tuple(outs[i][:m] for i in kept) + (outs[2][:m],)
